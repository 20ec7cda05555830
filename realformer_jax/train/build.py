"""From a RunSpec to the compiled steps: mesh and shardings, optimizer and train state, model,
and the microbatch count that `train.grad_accum_steps='auto'` stands for.

`make_setup(spec)` needs no data and allocates no parameters; `compile_train_step(setup)`
compiles the step for the spec's concrete accumulation (an int); `resolve(spec)` turns 'auto'
into one (the last section) and returns the spec, its setup and its compiled step, which is how
the loop gets them. A script reads `compile_train_step(setup).memory_analysis()` for any model
size on any mesh, also for the devices of an accelerator topology that this host does not have
(`devices=`).

Where arrays live: the model names only logical axes (`batch`, `embed`, `heads`, ...); the
run's logical axis rules (`spec.rules`, from `config.logical_axis_rules`) map them onto the mesh
axes of `spec.mesh`, so data parallel, FSDP and tensor parallel are config changes. Rules are
applied in order and a mesh axis is used at most once per array.

Sharded initialisation (no host ever holds the whole model): `jax.eval_shape(model.init)` gives
boxed abstract params -> `nn.get_partition_spec` -> logical specs; optimizer moments reuse their
parameter's spec (`optax.tree_map_params`); `nn.logical_to_mesh_sharding` maps them onto the
mesh; `jax.jit(init, out_shardings=...)` then creates every array directly in its shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from realformer_jax.analysis import device_checks, kernel_check
from realformer_jax.config import ConfigError
from realformer_jax.kernels.plumbing import select
from realformer_jax.model.params import unbox
from realformer_jax.train import step as step_lib
from realformer_jax.train.config import AUTO, MeshConfig, Rules, RunSpec
from realformer_jax.train.step import TrainState
from realformer_jax.train.task import Task, TaskModel
from realformer_jax.units import GiB

# Mesh, rules and shardings.


def make_mesh(mesh_config: MeshConfig, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """The mesh over `devices` (default: every device of every process); Auto axis types, which
  Flax's logical partitioning expects. Other devices than the default are, e.g., the devices of
  an accelerator topology that a deviceless compile targets."""
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_config.resolve(len(devices))
  return jax.make_mesh(
    shape, mesh_config.axes, axis_types=(AxisType.Auto,) * len(shape), devices=devices
  )


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Rules) -> Iterator[None]:
  """Mesh and rules in scope, as tracing `nn.with_logical_constraint` needs."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def to_mesh_shardings(logical_specs: Any, mesh: Mesh, rules: Rules) -> Any:
  """A tree of logical PartitionSpecs -> a tree of NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """Leading (batch) dimension split over the mesh axes the `batch` rule names."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(('batch',), rules))


def data_parallel_size(mesh: Mesh, rules: Rules) -> int:
  """How many groups of `mesh`'s devices the batch is split over under `rules`."""
  axes = batch_sharding(mesh, rules).spec[0]  # the mesh axes of the batch dimension
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return int(np.prod([mesh.shape[a] for a in axes], dtype=int))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def global_batch(
  local_batch: Mapping[str, np.ndarray], sharding: NamedSharding
) -> dict[str, jax.Array]:
  """This process's rows -> global arrays (each process feeds only its own devices)."""
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in local_batch.items()
  }


# Optimizer and train state.

# Parameters that get weight decay; BERT exempts biases and LayerNorm (and here also the
# residual gates and every other scalar or vector parameter).
_DECAYED_PARAM_NAMES = ('kernel', 'embedding')


class OptimizerConfig(Protocol):
  """What the schedule and optimizer read: TrainConfig (train/config.py) or a task's subclass of
  it (seq2seq/config.py)."""

  learning_rate: float
  warmup_steps: int
  num_train_steps: int
  weight_decay: float
  adam_b1: float
  adam_b2: float
  adam_eps: float
  clip_grad_norm: float


def learning_rate_schedule(train: OptimizerConfig) -> optax.Schedule:
  """Linear warmup from 0 to the peak, then linear decay to 0 at num_train_steps."""
  warmup = optax.linear_schedule(0.0, train.learning_rate, train.warmup_steps)
  decay = optax.linear_schedule(
    train.learning_rate, 0.0, train.num_train_steps - train.warmup_steps
  )
  return optax.join_schedules([warmup, decay], [train.warmup_steps])


def weight_decay_mask(params: Any) -> Any:
  return jax.tree_util.tree_map_with_path(
    lambda path, _: getattr(path[-1], 'key', None) in _DECAYED_PARAM_NAMES, params
  )


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """`optax.clip_by_global_norm` as one scalar factor: t * min(1, max_norm / ||g||).

  optax picks per element between t and t / ||g|| * max_norm. The division is an "expensive"
  op to XLA, so XLA:CPU writes the clipped gradient out as its own array instead of fusing it
  into both AdamW moment updates: an extra write and two extra reads of every gradient (~5% of
  a BERT-Base step). The factor form fuses. Same values up to one rounding; same (empty) state.
  """

  def update_fn(updates, state, params=None):
    del params
    factor = jnp.minimum(1.0, max_norm / optax.tree.norm(updates))  # ||g|| = 0 -> 1
    return jax.tree.map(lambda t: t * factor.astype(t.dtype), updates), state

  return optax.GradientTransformation(lambda params: optax.ClipByGlobalNormState(), update_fn)


def make_optimizer(train: OptimizerConfig) -> optax.GradientTransformation:
  adamw = optax.adamw(
    learning_rate_schedule(train),
    b1=train.adam_b1,
    b2=train.adam_b2,
    eps=train.adam_eps,
    weight_decay=train.weight_decay,
    mask=weight_decay_mask,
  )
  if train.clip_grad_norm > 0:
    return optax.chain(clip_by_global_norm(train.clip_grad_norm), adamw)
  return adamw


@dataclasses.dataclass(frozen=True)
class StateLayout:
  """What a sharded TrainState looks like: shapes, dtypes and shardings of every leaf."""

  abstract: TrainState  # ShapeDtypeStructs carrying their shardings
  shardings: TrainState  # NamedShardings

  @property
  def param_shardings(self) -> Any:
    return self.shardings.params


def _make_init_fn(model, tx, batch_size, data_config, task: TaskModel):
  def init(rng: jax.Array) -> TrainState:
    params = unbox(task.init_variables(model, rng, data_config, batch_size)['params'])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  return init


def state_layout(
  model: Any, tx: optax.GradientTransformation, data_config: Any, mesh, rules, task: TaskModel
) -> StateLayout:
  """Abstract sharded TrainState, computed without allocating any parameter."""
  # One row per data-parallel shard keeps init's activation constraints divisible.
  batch_size = data_parallel_size(mesh, rules)
  rng = jax.random.key(0)
  with activate(mesh, rules):
    boxed = jax.eval_shape(lambda r: task.init_variables(model, r, data_config, batch_size), rng)
  params = unbox(boxed['params'])
  abstract = TrainState(
    step=jax.ShapeDtypeStruct((), jnp.int32),
    params=params,
    opt_state=jax.eval_shape(tx.init, params),
  )
  param_specs = nn.get_partition_spec(boxed['params'])
  is_spec = lambda x: isinstance(x, PartitionSpec)
  opt_specs = optax.tree_map_params(
    tx,
    lambda _, spec: spec,
    abstract.opt_state,
    param_specs,
    transform_non_params=lambda _: PartitionSpec(),
    is_leaf=is_spec,
  )
  specs = TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs)
  shardings = to_mesh_shardings(specs, mesh, rules)
  abstract = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )
  return StateLayout(abstract=abstract, shardings=shardings)


def init_state(
  model: Any,
  tx: optax.GradientTransformation,
  data_config: Any,
  layout: StateLayout,
  rng: jax.Array,
  mesh,
  rules,
  task: TaskModel,
) -> TrainState:
  """Fresh TrainState, created shard by shard on the devices that own it."""
  batch_size = data_parallel_size(mesh, rules)
  init = _make_init_fn(model, tx, batch_size, data_config, task)
  with activate(mesh, rules):
    return jax.jit(init, out_shardings=layout.shardings)(rng)


# The setup and its compiled steps.


@dataclasses.dataclass(frozen=True)
class TrainSetup:
  spec: RunSpec
  model: Any  # the task's Flax module (task.make_model)
  tx: optax.GradientTransformation
  mesh: Mesh
  layout: StateLayout
  batch_sharding: NamedSharding
  # The model config the model was built with: spec.model with 'auto' attention platform and
  # residual carry decided for these devices (the spec keeps 'auto': a resumed run decides
  # again on its own devices; both carries compute the same numbers from the same weights).
  model_config: Optional[Any] = None

  @property
  def task(self) -> Task:
    return self.spec.task

  @property
  def rules(self) -> Rules:
    return self.spec.rules

  @property
  def replicated(self) -> NamedSharding:
    return replicated(self.mesh)

  def abstract_batches(self) -> list[dict]:
    """One abstract batch per shape the task's data yields (one, unless it buckets)."""
    return [
      {
        name: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)
        for name, (shape, dtype) in shapes.items()
      }
      for shapes in self.task.data_batch_shapes(self.spec.data, self.spec.train.global_batch_size)
    ]

  def init_state(self, rng: jax.Array) -> TrainState:
    """A fresh TrainState from `rng`, created shard by shard on the devices that own it."""
    return init_state(
      self.model, self.tx, self.spec.data, self.layout, rng, self.mesh, self.rules, self.task
    )

  def abstract_rng(self) -> jax.ShapeDtypeStruct:
    key = jax.eval_shape(jax.random.key, 0)
    return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=self.replicated)


def make_setup(
  spec: RunSpec,
  devices: Optional[Sequence[Any]] = None,
  memory_bytes: Optional[int] = None,
  mesh: Optional[Mesh] = None,
) -> TrainSetup:
  """Everything but data and arrays, on `mesh` (default: the spec's mesh over `devices`,
  default all of them). `memory_bytes`: one device's memory budget, for residual_carry='auto'
  (default: the first local device's limit; resolve passes its budget, a target's when
  deviceless)."""
  mesh = make_mesh(spec.mesh, devices) if mesh is None else mesh
  # How attention runs, decided once here (kernels/plumbing/select.py): the kernels of the
  # platform the step is compiled for (a backend that passed its device check on these
  # devices, where it measured faster), the carry residual_carry='auto' takes at the run's
  # length (logged); then the plan checked against the einsum path where it runs compiled on
  # these devices (analysis/kernel_check.py). A split sequence runs the ring
  # (kernels/score_paths/ring_attention.py): no kernel to check.
  devices = list(mesh.devices.flat)
  seq_len = spec.task.sequence_length(spec.data)
  shards = spec.sequence_parallel_size(len(devices))
  local = bool(devices) and devices[0] in jax.devices()  # not a deviceless compile's target
  checks = shards == 1 and spec.model.attention_check and local
  passed = device_checks.passed_backends(devices) if checks else ()
  attention = select.for_run(spec.model, devices, seq_len, memory_bytes, shards, passed)
  model_config = spec.model.replace(**attention.changes)  # what select decided, applied once
  if shards == 1:  # and what the kernel's check decided (nothing where it passed)
    model_config = model_config.replace(
      **kernel_check.fallback(model_config, attention.plan, devices)
    )
  model = spec.task.make_model(model_config)
  tx = make_optimizer(spec.train)
  layout = state_layout(model, tx, spec.data, mesh, spec.rules, spec.task)
  return TrainSetup(
    spec=spec,
    model=model,
    tx=tx,
    mesh=mesh,
    layout=layout,
    batch_sharding=batch_sharding(mesh, spec.rules),
    model_config=model_config,
  )


def compile_train_step(setup: TrainSetup) -> jax.stages.Compiled:
  """The compiled `train_step(state, batch, rng) -> (state, metrics)`; the state is donated."""
  train = setup.spec.train
  if train.grad_accum_steps == AUTO:
    raise ValueError(
      "train.grad_accum_steps='auto': resolve it first (resolve, or train.compile_train_step)"
    )
  train_step = step_lib.make_train_step(
    setup.model,
    setup.tx,
    setup.task,
    learning_rate_schedule(train),
    grad_accum_steps=train.grad_accum_steps,
    param_shardings=setup.layout.param_shardings,
    log_layer_grad_norms=train.log_layer_grad_norms,
  )
  jitted = jax.jit(
    train_step,
    in_shardings=(setup.layout.shardings, setup.batch_sharding, setup.replicated),
    out_shardings=(setup.layout.shardings, setup.replicated),
    donate_argnums=0,
  )
  with activate(setup.mesh, setup.rules):
    return _per_shape(
      (batch, jitted.lower(setup.layout.abstract, batch, setup.abstract_rng()).compile())
      for batch in setup.abstract_batches()
    )


def compile_eval_step(setup: TrainSetup) -> jax.stages.Compiled:
  """The compiled `eval_step(state, batch) -> (metric sums, per-row outputs)`, both
  replicated (outputs are small: logits or predictions per row)."""
  jitted = jax.jit(
    step_lib.make_eval_step(setup.model, setup.task, setup.spec.train.grad_accum_steps),
    in_shardings=(setup.layout.shardings, setup.batch_sharding),
    out_shardings=setup.replicated,
  )
  with activate(setup.mesh, setup.rules):
    return _per_shape(
      (batch, jitted.lower(setup.layout.abstract, batch).compile())
      for batch in setup.abstract_batches()
    )


def _shape_key(batch: dict) -> tuple:
  return tuple(sorted((name, tuple(x.shape)) for name, x in batch.items()))


class PerShape:
  """Compiled steps of a task whose batches come in several shapes (length buckets), called
  like one: the batch's shapes pick the step (argument 1). `memory_analysis()` is the last
  shape's (the longest bucket)."""

  def __init__(self, compiled: list[tuple[dict, jax.stages.Compiled]]):
    self._by_shape = {_shape_key(batch): step for batch, step in compiled}
    self._last = compiled[-1][1]

  def __call__(self, *args):
    return self._by_shape[_shape_key(args[1])](*args)

  def memory_analysis(self):
    return self._last.memory_analysis()


def _per_shape(compiled) -> Any:
  """From (abstract batch, compiled step) pairs: one step as it is, several as a PerShape."""
  compiled = list(compiled)
  return compiled[0][1] if len(compiled) == 1 else PerShape(compiled)


# 'auto' accumulation: the fewest microbatches whose compiled step fits the device.
#
# The global batch is the recipe (the paper's 512 sequences); how many microbatches it is split
# into is an implementation detail that changes only float summation order. 'auto' compiles the
# train step for candidate accumulation counts A (each dividing the per-device batch) and reads
# XLA's buffer assignment (`compiled.memory_analysis()`):
#
#     need(A) = arguments + outputs - aliased (the donated state) + temporaries
#
# and keeps the smallest A with need(A) <= budget, where the budget (the caller's:
# train/memory.py) is `train.device_memory_bytes` (or the device's own limit from
# `memory_stats()`, or the host's available memory divided among its CPU devices; or, compiling
# for an accelerator this host does not have, the target's memory: realformer_jax/aot) times
# `train.memory_fraction`. A
# candidate that XLA:TPU refuses to compile because it exceeds the HBM counts as not fitting. If
# even one sequence per device does not fit, each layer is rematerialised (`remat_policy='full'`)
# and the search repeats; if that does not fit either, a one-line ConfigError names the bytes
# needed and available, before any parameter is allocated.
#
# need(A) falls as A grows (smaller microbatches), so the search probes: A = 1; the largest A
# (one sequence per device); then the A an affine fit of need against microbatch size predicts,
# and its neighbours until the boundary is found. Every probe is a real compilation, and the
# chosen step is returned compiled, so training reuses it. `resolve` is the only place 'auto' is
# resolved: everything above it, and step.py, take a concrete count.


@dataclasses.dataclass(frozen=True)
class Resolved:
  spec: RunSpec  # with an int grad_accum_steps (and maybe remat_policy 'full')
  setup: TrainSetup
  compiled: jax.stages.Compiled  # the train step at that accumulation
  need_bytes: Optional[int] = None  # memory the chosen step needs ('auto' only)
  budget_bytes: Optional[int] = None


def step_memory_bytes(compiled: jax.stages.Compiled) -> int:
  """Device bytes a compiled step needs: live arguments and outputs (donated state counted
  once) plus XLA's temporaries."""
  m = compiled.memory_analysis()
  return (
    m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  )


_UNITS = {'': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}


def out_of_memory_bytes(error: Exception) -> Optional[int]:
  """The bytes a compilation that ran out of device memory says it needed, or None if `error`
  is something else. XLA:TPU does not compile a program larger than the HBM ('RESOURCE_EXHAUSTED:
  ... required for HLO temporaries (21.36G) exceeds available HBM (15.75G)'); the GPU and CPU
  compilers return a program whose memory_analysis() says so."""
  message = str(error)
  if 'RESOURCE_EXHAUSTED' not in message:
    return None
  match = re.search(r'\((\d+(?:\.\d+)?)([KMGT]?)i?B?\)', message)
  return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


def _per_device_batch(spec: RunSpec, devices: Optional[Sequence[Any]]) -> int:
  device_count = jax.device_count() if devices is None else len(devices)
  return spec.train.global_batch_size // spec.data_parallel_size(device_count)


def _with(spec: RunSpec, accum: int, remat_policy: str) -> RunSpec:
  return spec.replace(
    train=spec.train.replace(grad_accum_steps=accum),
    model=spec.model.replace(remat_policy=remat_policy),
  )


def resolve(
  spec: RunSpec,
  budget: tuple[int, str],
  log: Callable[[str], None] = print,
  devices: Optional[Sequence[Any]] = None,
  mesh: Optional[Mesh] = None,
) -> Resolved:
  """The spec with a concrete accumulation, its setup and its compiled train step.

  `budget` is one device's memory (bytes, description): `memory.memory_budget(spec.train)` of
  this host's devices, or a target's. `devices` (default: all) are those the step is compiled
  for, e.g. the devices of an accelerator topology this host does not have; `mesh`, the spec's
  mesh over them, where the caller made it already (train/run_setup.py)."""
  budget, source = budget
  if spec.train.grad_accum_steps != AUTO:
    setup = make_setup(spec, devices, budget, mesh)
    return Resolved(spec, setup, compile_train_step(setup))

  per_device = _per_device_batch(spec, devices)
  # Accumulation counts that split every device's rows evenly, ascending.
  candidates = [a for a in range(1, per_device + 1) if per_device % a == 0]
  policies = [spec.model.remat_policy] + (['full'] if spec.model.remat_policy != 'full' else [])
  for policy in policies:
    probes: dict[int, tuple[TrainSetup, jax.stages.Compiled, int]] = {}

    def need(accum: int, policy=policy, probes=probes) -> int:
      if accum not in probes:
        setup = make_setup(_with(spec, accum, policy), devices, budget, mesh)
        try:
          compiled = compile_train_step(setup)
          probes[accum] = (setup, compiled, step_memory_bytes(compiled))
        except jax.errors.JaxRuntimeError as e:  # XLA:TPU refuses a program that cannot fit
          required = out_of_memory_bytes(e)
          if required is None:
            raise
          # Never chosen, whatever the budget says: the device cannot hold it.
          probes[accum] = (setup, None, max(required, budget + 1))
      return probes[accum][2]

    chosen = _smallest_fitting(candidates, need, budget, per_device)
    if chosen is None:
      smallest = need(candidates[-1])
      if policy != policies[-1]:
        log(
          f"grad_accum_steps='auto': one sequence per device needs {smallest / GiB:.2f} GiB "
          f"> {budget / GiB:.2f} GiB with remat_policy='{policy}'; trying 'full'"
        )
        continue
      raise ConfigError(
        f"train.grad_accum_steps='auto': even one sequence per device does not fit: the step "
        f"needs {smallest:,} bytes ({smallest / GiB:.2f} GiB, remat_policy='{policy}'), the "
        f'device has {budget:,} ({source}); use more devices, FSDP (mesh.shape=(1,-1,1)), a '
        f'shorter data.max_len or a smaller model'
      )
    setup, compiled, chosen_need = probes[chosen]
    log(
      f"grad_accum_steps='auto': {chosen} microbatch(es) of {per_device // chosen} "
      f"sequence(s) per device, remat_policy='{policy}': the step needs "
      f'{chosen_need / GiB:.2f} GiB of {budget / GiB:.2f} GiB ({source}); '
      f'{len(probes)} compilation(s) probed'
    )
    return Resolved(setup.spec, setup, compiled, need_bytes=chosen_need, budget_bytes=budget)
  raise AssertionError('unreachable: the last policy either fits or raises')


def _smallest_fitting(
  candidates: list[int], need: Callable[[int], int], budget: int, per_device: int
) -> Optional[int]:
  """The smallest candidate A with need(A) <= budget (need falls as A grows), or None."""
  if need(candidates[0]) <= budget:
    return candidates[0]
  if need(candidates[-1]) > budget:
    return None
  # Affine in the microbatch size m = per_device / A: need = base + slope * m.
  m_low, m_high = per_device // candidates[-1], per_device // candidates[0]
  slope = (need(candidates[0]) - need(candidates[-1])) / max(m_high - m_low, 1)
  base = need(candidates[-1]) - slope * m_low
  predicted = [a for a in candidates if base + slope * (per_device // a) <= budget]
  index = candidates.index(predicted[0]) if predicted else len(candidates) - 1
  # Walk to the boundary: candidates[index] fits and candidates[index - 1] does not.
  while need(candidates[index]) > budget:
    index += 1
  while index > 0 and need(candidates[index - 1]) <= budget:
    index -= 1
  return candidates[index]

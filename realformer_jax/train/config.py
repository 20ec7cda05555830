"""A training run's config, in one place: its schema and defaults, the frozen RunSpec it is
validated into, and the checks across sections.

The user's config is an ml_collections ConfigDict (configs/ files, `--config.a.b=v` flags).
`validate_config` turns it, once, into a `RunSpec`; everything below the entry point takes the
spec (or the one section it needs), never the ConfigDict, and nothing ever writes to the user's
config. Each section is a frozen dataclass that checks itself when it is made (`__post_init__`),
so a section that exists is valid; `validate_config` adds what spans sections or layers.

    config = default_config()               # the editable ConfigDict (configs/ files start here)
    spec = train.validate_config(config)    # MaskedLMTask unless a task is given
    spec.train.learning_rate, spec.mesh.shape, spec.model.num_layers, spec.data.max_len
    spec = spec.replace(train=spec.train.replace(grad_accum_steps=4))

The sections, each generated from the frozen dataclass that is its schema (defaults and a
comment per field live there):

    model                ModelConfig (realformer_jax/config.py: one dataclass per concern)
    data                 DataConfig (realformer_jax/data/config.py)
    train                TrainConfig: optimisation, schedule, checkpoints, seed
    mesh                 MeshConfig: axis names and shape (-1 = the rest)
    logical_axis_rules   model's logical axis names -> mesh axes (first matching rule wins)
    distributed          DistributedConfig: jax.distributed.initialize

`validate_config` raises `ConfigError` (or the data module's `DataError`) with a one-line
message that names the offending field, e.g.

    train.global_batch_size=12: must be divisible by data-parallel size 8 (mesh data*fsdp) ...

It checks the unknown sections and fields, the kernel backend model.attention_impl names
(kernels/plumbing/select.py), the position table against the sequence length, the logical axis rules
against the mesh, the batch against the devices.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable, Mapping, Optional, Union

import ml_collections
import numpy as np

from realformer_jax.config import ConfigError, ModelConfig, from_section, to_config_dict
from realformer_jax.data import default_data_config
from realformer_jax.kernels.plumbing import select
from realformer_jax.kernels.score_paths import ring_attention
from realformer_jax.train import memory

# (train config) -> (bytes one device may use, where that figure came from): memory.py's for
# this host's devices, or a compile target's (aot/train_step.py).
MemoryBudget = Callable[[Any], tuple[int, str]]

# ---- The sections: frozen, self-checking dataclasses. ----

AUTO = 'auto'
Rules = tuple[tuple[str, Any], ...]


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, field: str, value, rule: str) -> None:
  if not ok:
    raise ConfigError(f'{field}={value!r}: {rule}')


class _Section:
  """`replace` for frozen sections (a new, re-checked instance)."""

  def replace(self, **changes: Any):
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Section):
  """The `train` section: optimisation, schedule, intervals, checkpoints, seed."""

  global_batch_size: int = 512  # sequences per optimizer step, summed over all devices
  num_train_steps: int = 1_000_000  # length of the learning-rate schedule
  stop_at_step: int = -1  # end this run at this step (resume later); -1 = num_train_steps
  learning_rate: float = 1e-4  # peak AdamW learning rate
  warmup_steps: int = 10_000  # linear warmup from 0, then linear decay to 0 at num_train_steps
  weight_decay: float = 0.01  # decoupled (AdamW); not applied to biases or norm scales
  adam_b1: float = 0.9  # Adam's first-moment decay
  adam_b2: float = 0.999  # Adam's second-moment decay
  adam_eps: float = 1e-6  # BERT's value
  clip_grad_norm: float = 1.0  # global-norm clipping; 0 = off
  # Microbatches per step (lax.scan inside the compiled step), or 'auto': the fewest whose
  # compiled step fits the device memory (train/build.py: resolve, once).
  grad_accum_steps: Union[int, str] = 1
  device_memory_bytes: int = -1  # 'auto' budget per device; -1 = ask the device (CPU: host RAM)
  memory_fraction: float = 0.9  # 'auto' keeps the step within this fraction of that budget
  log_layer_grad_norms: bool = False  # also log each layer's sublayer gradient norms
  prefetch_batches: int = 2  # batches placed on the devices ahead of their step (prefetch.py)
  log_every_steps: int = 100  # console line + TensorBoard train scalars (and the first step)
  eval_every_steps: int = 10_000  # held-out loss / metrics (also at the last step)
  checkpoint_every_steps: int = 10_000  # orbax checkpoint (also at the last step, on SIGTERM)
  keep_checkpoints: int = 3  # keep the last K checkpoints
  seed: int = 0  # params init, dropout and data order

  def __post_init__(self):
    accum = self.grad_accum_steps
    if isinstance(accum, str) and accum.isdigit():  # from the command line: '--...=4'
      object.__setattr__(self, 'grad_accum_steps', accum := int(accum))
    _require(
      accum == AUTO or (_is_int(accum) and accum > 0),
      'train.grad_accum_steps',
      accum,
      "must be a positive integer or 'auto'",
    )
    for name in (
      'global_batch_size',
      'num_train_steps',
      'log_every_steps',
      'prefetch_batches',
      'eval_every_steps',
      'checkpoint_every_steps',
      'keep_checkpoints',
    ):
      value = getattr(self, name)
      _require(_is_int(value) and value > 0, f'train.{name}', value, 'must be a positive integer')
    _require(
      _is_int(self.device_memory_bytes)
      and (self.device_memory_bytes > 0 or self.device_memory_bytes == -1),
      'train.device_memory_bytes',
      self.device_memory_bytes,
      'must be a positive number of bytes or -1 (ask the device)',
    )
    _require(
      0 < self.memory_fraction <= 1,
      'train.memory_fraction',
      self.memory_fraction,
      'must be in (0, 1]',
    )
    _require(
      _is_int(self.warmup_steps) and 0 <= self.warmup_steps <= self.num_train_steps,
      'train.warmup_steps',
      self.warmup_steps,
      f'must be in [0, train.num_train_steps={self.num_train_steps}]: a warmup longer than the '
      'run never reaches the peak learning rate; e.g. '
      f'--config.train.warmup_steps={max(self.num_train_steps // 10, 0)} (a tenth of the run)',
    )
    _require(
      self.stop_at_step == -1 or (_is_int(self.stop_at_step) and self.stop_at_step > 0),
      'train.stop_at_step',
      self.stop_at_step,
      'must be -1 or a positive integer',
    )
    _require(
      math.isfinite(self.learning_rate) and self.learning_rate > 0,
      'train.learning_rate',
      self.learning_rate,
      'must be positive and finite',
    )
    _require(
      math.isfinite(self.weight_decay) and self.weight_decay >= 0,
      'train.weight_decay',
      self.weight_decay,
      'must be >= 0',
    )
    _require(
      math.isfinite(self.clip_grad_norm) and self.clip_grad_norm >= 0,
      'train.clip_grad_norm',
      self.clip_grad_norm,
      'must be >= 0 (0 = off)',
    )
    for name in ('adam_b1', 'adam_b2'):
      _require(
        0 <= getattr(self, name) < 1, f'train.{name}', getattr(self, name), 'must be in [0, 1)'
      )
    _require(self.adam_eps > 0, 'train.adam_eps', self.adam_eps, 'must be positive')
    _require(
      _is_int(self.seed) and 0 <= self.seed < 2**32,
      'train.seed',
      self.seed,
      'must be an integer in [0, 2**32)',
    )

  @property
  def stop_step(self) -> int:
    """The step this run ends at (train.stop_at_step, or the end of the schedule)."""
    if self.stop_at_step == -1:
      return self.num_train_steps
    return min(self.stop_at_step, self.num_train_steps)


@dataclasses.dataclass(frozen=True)
class MeshConfig(_Section):
  """The `mesh` section: device mesh axis names and shape."""

  axes: tuple[str, ...] = (
    'data',
    'fsdp',
    'tensor',
    'sequence',
  )  # mesh axis names (logical_axis_rules' targets)
  # One entry per axis; one may be -1 (all remaining devices). Trailing axes left out are 1, so
  # a shape written before an axis was added ('(1,-1,1)': FSDP) means what it meant.
  shape: tuple[int, ...] = (-1, 1, 1, 1)

  def __post_init__(self):
    axes, shape = tuple(self.axes), tuple(self.shape)
    _require(
      len(axes) > 0 and all(isinstance(a, str) and a for a in axes) and len(set(axes)) == len(axes),
      'mesh.axes',
      axes,
      'must be distinct non-empty names',
    )
    _require(
      0 < len(shape) <= len(axes), 'mesh.shape', shape, f'must have one entry per mesh axis {axes}'
    )
    shape += (1,) * (len(axes) - len(shape))
    object.__setattr__(self, 'axes', axes)
    object.__setattr__(self, 'shape', shape)
    _require(
      all(_is_int(s) and (s > 0 or s == -1) for s in shape) and shape.count(-1) <= 1,
      'mesh.shape',
      shape,
      'entries must be positive, with at most one -1',
    )

  def resolve(self, device_count: int) -> tuple[int, ...]:
    """The shape with -1 replaced by the remaining devices; its product must be
    `device_count`."""
    known = math.prod(s for s in self.shape if s != -1)
    shape = self.shape
    if -1 in shape:
      _require(
        device_count % known == 0,
        'mesh.shape',
        shape,
        f'fixed axes ({known} devices) do not divide the {device_count} devices',
      )
      shape = tuple(device_count // known if s == -1 else s for s in shape)
    hint = ''
    rest = math.prod(shape[1:])
    if -1 not in self.shape and device_count % rest == 0:  # the usual fix: data takes the rest
      fitted = ','.join(['-1'] + [str(s) for s in shape[1:]])
      hint = f'; e.g. mesh.shape=({fitted}): -1 gives the {self.axes[0]} axis the rest'
    _require(
      math.prod(shape) == device_count,
      'mesh.shape',
      self.shape,
      f'needs {math.prod(shape)} devices, found {device_count}{hint}',
    )
    return shape


@dataclasses.dataclass(frozen=True)
class DistributedConfig(_Section):
  """The `distributed` section: multi-process start-up (jax.distributed.initialize)."""

  coordinator_address: str = ''  # 'host:port' of process 0; needed when num_processes > 1
  num_processes: int = 1  # > 1: jax.distributed.initialize with these three values
  process_id: int = 0  # this process's index, 0 .. num_processes - 1
  auto_detect: bool = False  # jax.distributed.initialize() from the cluster environment

  def __post_init__(self):
    _require(
      _is_int(self.num_processes) and self.num_processes >= 1,
      'distributed.num_processes',
      self.num_processes,
      'must be a positive integer',
    )
    _require(
      _is_int(self.process_id) and 0 <= self.process_id < self.num_processes,
      'distributed.process_id',
      self.process_id,
      'must be in [0, distributed.num_processes)',
    )
    _require(
      self.num_processes == 1 or bool(self.coordinator_address),
      'distributed.coordinator_address',
      self.coordinator_address,
      "must be 'host:port' when distributed.num_processes > 1",
    )


@dataclasses.dataclass(frozen=True)
class RunSpec(_Section):
  """One validated run of a task: what `validate_config` returns and the loop consumes."""

  # What is trained (masked LM, fine-tuning, ...), its loss: a train.task.Task. Not imported
  # here, not even for type checkers: task.py builds on this module (TrainConfig).
  task: Any
  model: ModelConfig
  data: Any  # the task's data section (a frozen dataclass, e.g. data.DataConfig)
  train: TrainConfig
  mesh: MeshConfig
  rules: Rules  # logical axis name -> mesh axes, first match wins
  distributed: DistributedConfig
  sections: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the task's own

  def to_dict(self) -> dict[str, Any]:
    """The sections as plain values (the workdir's config.json): validating it again gives
    this spec back ('auto' stays 'auto')."""
    sections = {'model': self.model, 'data': self.data, 'train': self.train, 'mesh': self.mesh}
    sections.update(distributed=self.distributed, **self.sections)
    plain = {name: dataclasses.asdict(section) for name, section in sections.items()}
    return dict(plain, logical_axis_rules=[list(rule) for rule in self.rules])

  def mesh_axes_of(self, logical: str) -> tuple[str, ...]:
    """The mesh axes a logical axis is split over (its first rule; none without one)."""
    for name, targets in self.rules:
      if name == logical:
        if targets is None:
          return ()
        return (targets,) if isinstance(targets, str) else tuple(targets)
    return ()

  def batch_mesh_axes(self) -> tuple[str, ...]:
    """The mesh axes the batch dimension is split over (the first rule for 'batch')."""
    return self.mesh_axes_of('batch')

  def split_size(self, logical: str, device_count: int) -> int:
    """Into how many parts `logical` is split on `device_count` devices."""
    sizes = dict(zip(self.mesh.axes, self.mesh.resolve(device_count)))
    return math.prod(sizes[axis] for axis in self.mesh_axes_of(logical))

  def data_parallel_size(self, device_count: int) -> int:
    """How many groups of devices the batch is split over, on `device_count` devices."""
    return self.split_size('batch', device_count)

  def sequence_parallel_size(self, device_count: int) -> int:
    """How many devices each sequence's length is split over (the ring of ring attention)."""
    return self.split_size('length', device_count)


# ---- The editable defaults (ConfigDict) every configs/ file starts from. ----

# Logical names the model puts on parameters and activations (models.py and friends).
LOGICAL_AXES = ('batch', 'length', 'kv_length', 'embed', 'heads', 'kv', 'mlp', 'vocab', 'layers')
# The model field that sizes each logical axis of the parameters, which every mesh axis that a
# rule maps the logical axis to must divide (check_devices below). Each of these logical
# names is the first or only dimension of some parameter, so its whole rule applies there.
PARAM_AXIS_FIELDS = {
  'embed': 'hidden_size',
  'heads': 'num_heads',
  'mlp': 'mlp_dim',
  'vocab': 'vocab_size',
  'layers': 'num_layers',  # stacked on axis 0 under scan_layers only
}

# Data parallel over ('data', 'fsdp') on the batch; FSDP shards every big matrix on `embed`;
# tensor parallel splits heads, FFN and vocabulary; sequence (context) parallel splits the
# length of every activation, the carried scores' query rows and the qk carry's stack (the
# attention then runs as a ring: kernels/score_paths/ring_attention.py). Order matters: a mesh axis
# is used
# once per array, so activations, which name `batch` before `embed`, keep `embed` unsharded.
DEFAULT_LOGICAL_AXIS_RULES = (
  ('batch', ('data', 'fsdp')),
  ('vocab', 'tensor'),
  ('heads', 'tensor'),
  ('mlp', 'tensor'),
  ('embed', 'fsdp'),
  ('kv', None),
  ('layers', None),
  ('length', 'sequence'),
  ('kv_length', None),
)


# The model section's fields whose ConfigDict type is not their default's: `residual_attention`
# (None by default) a typed placeholder, so that `--config.model.residual_attention=True` still
# parses; `scan_unroll` an int or 'auto'.
MODEL_FIELD_TYPES = {'residual_attention': bool, 'scan_unroll': object}


def default_model_config(model: ModelConfig = ModelConfig()) -> ml_collections.ConfigDict:
  """ModelConfig as a ConfigDict (MODEL_FIELD_TYPES above)."""
  return to_config_dict(model, field_types=MODEL_FIELD_TYPES)


def default_train_config() -> ml_collections.ConfigDict:
  # grad_accum_steps holds an int or 'auto'.
  return to_config_dict(TrainConfig(), field_types={'grad_accum_steps': object})


def default_mesh_config() -> ml_collections.ConfigDict:
  return to_config_dict(MeshConfig())


def default_distributed_config() -> ml_collections.ConfigDict:
  return to_config_dict(DistributedConfig())


def default_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.data = default_data_config()
  config.model = default_model_config()
  # One vocabulary: the model's table follows the tokenizer's size unless set explicitly.
  config.model.vocab_size = config.data.get_ref('vocab_size')
  config.train = default_train_config()
  config.mesh = default_mesh_config()
  config.logical_axis_rules = DEFAULT_LOGICAL_AXIS_RULES
  config.distributed = default_distributed_config()
  return config


# ---- Validation: ConfigDict in, RunSpec out; the checks across sections. ----

# Sections every task's config has, and their schemas (model and data: the task's).
_COMMON_SECTIONS = {'train': TrainConfig, 'mesh': MeshConfig, 'distributed': DistributedConfig}


# The task of a config validated without one: masked-LM pretraining, named by its import path
# and imported when first asked for, so that importing this package loads no task and this
# package imports nothing above it (the tasks live in realformer_jax/mlm, finetune, seq2seq).
_DEFAULT_TASK = 'realformer_jax.mlm.task:MaskedLMTask'
_default_task: Optional[Callable[[], Any]] = None


def set_default_task(factory: Callable[[], Any]) -> None:
  """Makes `factory()` the task of every entry point called without one."""
  global _default_task  # pylint: disable=global-statement
  _default_task = factory


def default_task() -> Any:
  """A new instance of the default task (masked-LM pretraining unless `set_default_task`)."""
  if _default_task is None:
    module, name = _DEFAULT_TASK.split(':')
    set_default_task(getattr(importlib.import_module(module), name))
  return _default_task()


def validate_config(
  config: ml_collections.ConfigDict,
  *,
  task: Optional[Any] = None,
  device_count: Optional[int] = None,
  process_count: Optional[int] = None,
  memory_budget: Optional[MemoryBudget] = None,
) -> RunSpec:
  """The RunSpec of `config` for `task` (a train.task.Task; default: `default_task()`).

  Without `device_count` / `process_count` only what needs no devices is checked (safe before
  `jax.distributed.initialize`); with them, the mesh shape and batch layout are checked too.
  `memory_budget`: what one device may hold, asked of the train section once the devices are
  checked (default: memory.memory_budget, this host's devices).
  """
  if task is None:
    task = default_task()
  _check_sections(config, task)
  model = task.model_config(config.model)
  select.check(model)  # the kernel backend attention_impl names, and what it can do
  data = task.data_config(config.data)
  # (A task whose data has no single max_len checks its own lengths in task.validate.)
  if model.position_embedding == 'learned' and getattr(data, 'max_len', 0) > model.max_len:
    raise ConfigError(
      f'data.max_len={data.max_len}: sequence longer than the position '
      f'table model.max_len={model.max_len}'
    )
  schemas = dict(_COMMON_SECTIONS, train=task.train_config_class)
  train, mesh, distributed = (
    from_section(cls, name, config[name]) for name, cls in schemas.items()
  )
  sections = {
    name: from_section(cls, name, config[name]) for name, cls in task.extra_sections().items()
  }
  spec = RunSpec(
    task=task,
    model=model,
    data=data,
    train=train,
    mesh=mesh,
    rules=_rules(config.logical_axis_rules, mesh),
    distributed=distributed,
    sections=sections,
  )
  check_optimizer_dtypes(train, getattr(model, 'param_dtype', 'float32'))
  task.validate(spec)
  if device_count is not None:
    budget = (memory_budget or memory.memory_budget)(train)
    check_devices(spec, device_count, process_count or 1, budget)
  return spec


def check_devices(
  spec: RunSpec, device_count: int, process_count: int, budget: tuple[int, str]
) -> None:
  """The mesh fits the devices, every microbatch splits evenly over the batch shards, and every
  sharded parameter dimension over its mesh axes; a ring's carried rows fit `budget`, one
  device's memory (bytes, where the figure came from: memory.memory_budget, or a target's)."""
  check_batch_layout(spec, spec.data_parallel_size(device_count), process_count)
  check_param_layout(spec, device_count)
  check_sequence_layout(spec, device_count, budget)


def check_sequence_layout(spec: RunSpec, device_count: int, budget: tuple[int, str]) -> None:
  """A length split over a sequence axis (ring attention, kernels/score_paths/ring_attention.py):
  the
  sequence length divides evenly, the axes are not also the batch's or the heads', and the
  model runs on the ring (ring_attention.check_config)."""
  shards = spec.sequence_parallel_size(device_count)
  if shards == 1:
    return
  axes = spec.mesh_axes_of('length')
  where = f'(mesh.shape={spec.mesh.shape} on {device_count} devices)'
  for other in ('batch', 'heads'):
    shared = set(axes) & set(spec.mesh_axes_of(other))
    if shared:
      raise ConfigError(
        f'logical_axis_rules: {"*".join(sorted(shared))} splits both {other!r} and '
        f"'length'; a mesh axis splits one dimension of an array"
      )
  if len(spec.task.data_batch_shapes(spec.data, spec.train.global_batch_size)) > 1:
    raise ConfigError(
      f'mesh.shape={spec.mesh.shape}: a sequence axis of {shards} devices needs batches of '
      f'one length, and {type(spec.task).__name__} batches come in length buckets; '
      'use sequence 1'
    )
  length = spec.task.sequence_length(spec.data)
  field = 'data.max_len' if hasattr(spec.data, 'max_len') else 'the sequence length'
  if length % shards:
    raise ConfigError(
      f'{field}={length}: must be divisible by {shards}, the size of mesh '
      f"{'*'.join(axes)} that logical_axis_rules split 'length' over {where}"
    )
  train = spec.train
  if train.grad_accum_steps == AUTO:  # 'auto' may go down to one sequence per batch group
    batch, batch_field = spec.data_parallel_size(device_count), 'train.grad_accum_steps=auto'
  else:
    batch = train.global_batch_size // train.grad_accum_steps
    batch_field = (
      f'train.global_batch_size={train.global_batch_size} / '
      f'train.grad_accum_steps={train.grad_accum_steps}'
    )
  layout = ring_attention.RingLayout(
    shards=shards,
    length=length,
    length_field=field,
    batch=batch,
    batch_field=batch_field,
    local_heads=spec.model.num_heads // spec.split_size('heads', device_count),
    mesh_shape=spec.mesh.shape,
  )
  ring_attention.check_config(spec.model, layout, budget)


def check_param_layout(spec: RunSpec, device_count: int) -> None:
  """Each model size that a logical axis rule shards (PARAM_AXIS_FIELDS) divides by
  the product of its mesh axes: otherwise creating the parameters fails deep in JAX
  (IndivisibleError), after the workdir is taken."""
  sizes = dict(zip(spec.mesh.axes, spec.mesh.resolve(device_count)))
  done = set()
  for logical, targets in spec.rules:
    field = PARAM_AXIS_FIELDS.get(logical)
    if logical in done or field is None or not hasattr(spec.model, field):
      continue
    done.add(logical)  # the first rule for a name is the one that applies
    if logical == 'layers' and not getattr(spec.model, 'scan_layers', True):
      continue
    axes = () if targets is None else (targets,) if isinstance(targets, str) else targets
    divisor = math.prod(sizes[axis] for axis in axes)
    value = getattr(spec.model, field)
    if value % divisor:
      raise ConfigError(
        f'model.{field}={value}: must be divisible by {divisor}, the size of mesh '
        f'{"*".join(axes)} that logical_axis_rules shard {logical!r} over '
        f'(mesh.shape={spec.mesh.shape} on {device_count} devices)'
      )


def check_optimizer_dtypes(train: TrainConfig, param_dtype: str) -> None:
  """The optimizer's values as training computes them: the schedule and Adam's decays in
  float32, the update in the parameters' dtype too. A value that passes as a Python float can
  be 0 or inf there (adam_eps=1e-50 is 0 in float32, learning_rate=1e39 is inf); the step's
  loss and gradients then stay finite while the parameters it writes do not."""
  for dtype in dict.fromkeys(('float32', param_dtype)):
    for name, degenerate in (
      ('learning_rate', lambda x: not np.isfinite(x) or x == 0),
      ('weight_decay', lambda x: not np.isfinite(x)),
      ('adam_eps', lambda x: x == 0),
      ('adam_b1', lambda x: x == 1 and dtype == 'float32'),  # their powers: float32
      ('adam_b2', lambda x: x == 1 and dtype == 'float32'),
      # 0 turns clipping off, but a positive value that is 0 here clips every update to 0.
      ('clip_grad_norm', lambda x: x == 0 and train.clip_grad_norm > 0),
    ):
      value = getattr(train, name)
      with np.errstate(over='ignore', under='ignore'):
        cast = np.asarray(value, dtype)
      if degenerate(cast):
        raise ConfigError(
          f'train.{name}={value!r}: is {float(cast)!r} in {dtype}, the dtype training '
          'computes it in'
        )


def _check_sections(config: ml_collections.ConfigDict, task: Any) -> None:
  known = ('model', 'data', 'logical_axis_rules', *_COMMON_SECTIONS, *task.extra_sections())
  for name in config.keys():
    if name not in known:
      raise ConfigError(f'{name}: unknown config section (known: {", ".join(known)})')
  for name in known:
    if name not in config:
      raise ConfigError(f'{name}: missing config section')


def _rules(rules: Any, mesh: MeshConfig) -> Rules:
  """The logical axis rules as a tuple of (logical name, mesh axes), checked against the mesh."""
  normalised, seen = [], set()
  for rule in rules:
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
      raise ConfigError(f'logical_axis_rules: {rule!r} is not a (logical name, mesh axes) pair')
    logical, targets = rule
    if logical not in LOGICAL_AXES:
      raise ConfigError(
        f'logical_axis_rules: unknown logical axis {logical!r} (the model uses '
        f'{", ".join(LOGICAL_AXES)})'
      )
    seen.add(logical)
    if isinstance(targets, (list, tuple)):
      targets = tuple(targets)
    for target in () if targets is None else (targets,) if isinstance(targets, str) else targets:
      if target not in mesh.axes:
        raise ConfigError(
          f'logical_axis_rules: mesh axis {target!r} (for {logical!r}) is not '
          f'in mesh.axes={mesh.axes}'
        )
    normalised.append((logical, targets))
  if 'batch' not in seen:
    raise ConfigError(
      "logical_axis_rules: no rule for 'batch' (map it to the data-parallel "
      'mesh axes, or to None to replicate the batch)'
    )
  return tuple(normalised)


def check_batch_layout(spec: RunSpec, data_parallel: int, process_count: int) -> None:
  """Every microbatch splits evenly over the `data_parallel` device groups, and the processes
  can feed them: processes read rows per data-parallel process group, not each their own
  (train/data_shards.py), so a group is several processes (a sequence or tensor axis across
  hosts: they read the same rows) or one process holding several device groups."""
  train = spec.train
  batch_axes = spec.batch_mesh_axes()
  accum = 1 if train.grad_accum_steps == AUTO else train.grad_accum_steps
  for name, rows in spec.task.batch_rows(spec).items():
    # Also every group's share: there are at most data_parallel groups, and they divide it.
    if rows % (data_parallel * accum):
      raise ConfigError(
        f'{name}={rows}: must be divisible by the '
        f'data-parallel size {data_parallel} (mesh {"*".join(batch_axes) or "none"}) times '
        f'train.grad_accum_steps={accum}'
      )
  if data_parallel % process_count and process_count % data_parallel:
    # Devices are in process order, so the groups are whole processes or whole device groups.
    raise ConfigError(
      f'mesh.shape={spec.mesh.shape}: the batch is split over '
      f'{data_parallel} device group(s) (mesh {"*".join(batch_axes) or "none"}), '
      f'which must divide or be a multiple of the process count {process_count}'
    )

"""From a RunSpec to the compiled steps: model, optimizer, mesh, shardings.

`make_setup(spec)` needs no data and allocates no parameters; `compile_train_step(setup)`
compiles the step for the spec's concrete accumulation (an int: 'auto' is resolved before, by
accumulation.py, which calls this module; never the other way round). A script reads
`compile_train_step(setup).memory_analysis()` for any model size on any mesh, also for the
devices of an accelerator topology that this host does not have (`devices=`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import optax
from jax.sharding import Mesh, NamedSharding

from realformer_jax import kernels
from realformer_jax.analysis import kernel_check
from realformer_jax.kernels import carry_choice
from realformer_jax.train import partitioning
from realformer_jax.train import state as state_lib
from realformer_jax.train import step as step_lib
from realformer_jax.train.config import AUTO, RunSpec
from realformer_jax.train.task import Task


@dataclasses.dataclass(frozen=True)
class TrainSetup:
  spec: RunSpec
  model: Any  # the task's Flax module (task.make_model)
  tx: optax.GradientTransformation
  mesh: Mesh
  layout: state_lib.StateLayout
  batch_sharding: NamedSharding
  # The model config the model was built with: spec.model with 'auto' attention platform and
  # residual carry decided for these devices (the spec keeps 'auto': a resumed run decides
  # again on its own devices; both carries compute the same numbers from the same weights).
  model_config: Optional[Any] = None

  @property
  def task(self) -> Task:
    return self.spec.task

  @property
  def rules(self) -> partitioning.Rules:
    return self.spec.rules

  @property
  def replicated(self) -> NamedSharding:
    return partitioning.replicated(self.mesh)

  def abstract_batches(self) -> list[dict]:
    """One abstract batch per shape the task's data yields (one, unless it buckets)."""
    return [
      {
        name: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)
        for name, (shape, dtype) in shapes.items()
      }
      for shapes in self.task.data_batch_shapes(self.spec.data, self.spec.train.global_batch_size)
    ]

  def init_state(self, rng: jax.Array) -> state_lib.TrainState:
    """A fresh TrainState from `rng`, created shard by shard on the devices that own it."""
    return state_lib.init_state(
      self.model, self.tx, self.spec.data, self.layout, rng, self.mesh, self.rules, self.task
    )

  def abstract_rng(self) -> jax.ShapeDtypeStruct:
    key = jax.eval_shape(jax.random.key, 0)
    return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=self.replicated)


def make_setup(
  spec: RunSpec, devices: Optional[Sequence[Any]] = None, memory_bytes: Optional[int] = None
) -> TrainSetup:
  """Everything but data and arrays, on a mesh of `devices` (default: all of them).
  `memory_bytes`: one device's memory budget, for residual_carry='auto' (default: the first
  local device's limit; accumulation.resolve passes its budget, a target's when deviceless)."""
  mesh = partitioning.make_mesh(spec.mesh, devices)
  # Attention kernels for the platform the step is compiled for (kernels/select.py), checked
  # against the einsum path first when they run compiled on this process's devices.
  devices = list(mesh.devices.flat)
  seq_len = _seq_len(spec)
  model_config = kernels.resolve_platform(spec.model, devices)
  # Which carry residual attention takes, decided once here for the run's length and logged.
  model_config = carry_choice.resolved(model_config, seq_len, memory_bytes)
  model_config = kernel_check.checked(model_config, devices, seq_len)
  model = spec.task.make_model(model_config)
  tx = state_lib.make_optimizer(spec.train)
  layout = state_lib.state_layout(model, tx, spec.data, mesh, spec.rules, spec.task)
  return TrainSetup(
    spec=spec,
    model=model,
    tx=tx,
    mesh=mesh,
    layout=layout,
    batch_sharding=partitioning.batch_sharding(mesh, spec.rules),
    model_config=model_config,
  )


def _seq_len(spec: RunSpec) -> Optional[int]:
  shapes = spec.task.batch_shapes(spec.data, 1)
  return shapes['input_ids'][0][1] if 'input_ids' in shapes else None


def compile_train_step(setup: TrainSetup) -> jax.stages.Compiled:
  """The compiled `train_step(state, batch, rng) -> (state, metrics)`; the state is donated."""
  train = setup.spec.train
  if train.grad_accum_steps == AUTO:
    raise ValueError(
      "train.grad_accum_steps='auto': resolve it first "
      '(train.accumulation.resolve or train.compile_train_step)'
    )
  train_step = step_lib.make_train_step(
    setup.model,
    setup.tx,
    setup.task,
    state_lib.learning_rate_schedule(train),
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
  with partitioning.activate(setup.mesh, setup.rules):
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
  with partitioning.activate(setup.mesh, setup.rules):
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

"""From a validated config to the compiled steps: model, optimizer, mesh, shardings.

`compile_train_step(config)` needs no data and allocates no parameters, so a script can read
`compile_train_step(config).memory_analysis()` for any model size on any mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding

from realformer_jax.config import ModelConfig
from realformer_jax.train import partitioning, state as state_lib, step as step_lib, validation
from realformer_jax.train.mlm_task import MaskedLMTask
from realformer_jax.train.task import Task


@dataclasses.dataclass(frozen=True)
class TrainSetup:
  config: ml_collections.ConfigDict
  model: Any  # the task's Flax module (MaskedLM for pretraining)
  tx: optax.GradientTransformation
  mesh: Mesh
  rules: partitioning.Rules
  layout: state_lib.StateLayout
  batch_sharding: NamedSharding
  task: Task = dataclasses.field(default_factory=MaskedLMTask)

  @property
  def replicated(self) -> NamedSharding:
    return partitioning.replicated(self.mesh)

  def abstract_batch(self) -> dict:
    shapes = self.task.batch_shapes(self.config.data, self.config.train.global_batch_size)
    return {name: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)
            for name, (shape, dtype) in shapes.items()}

  def abstract_rng(self) -> jax.ShapeDtypeStruct:
    key = jax.eval_shape(jax.random.key, 0)
    return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=self.replicated)


def make_setup(config: ml_collections.ConfigDict, model_config: Optional[ModelConfig] = None,
               task: Optional[Task] = None, devices: Optional[Sequence[Any]] = None
               ) -> TrainSetup:
  """Everything but data and arrays, for `task` (default: masked-LM pretraining), on
  `devices` (default: this job's; realformer_jax/aot passes a compile target's). Validates
  the config first unless `model_config` (the result of an earlier validate_config) is
  given."""
  task = task or MaskedLMTask()
  if model_config is None:
    model_config = validation.validate_config(config, device_count=jax.device_count(),
                                              process_count=jax.process_count(), task=task)
  mesh = partitioning.make_mesh(config.mesh, devices)
  rules = partitioning.logical_rules(config)
  model = task.make_model(model_config)
  tx = state_lib.make_optimizer(config.train)
  layout = state_lib.state_layout(model, tx, config.data, mesh, rules, task)
  return TrainSetup(config=config, model=model, tx=tx, mesh=mesh, rules=rules, layout=layout,
                    batch_sharding=partitioning.batch_sharding(mesh, rules), task=task)


def compile_train_step(config: ml_collections.ConfigDict, setup: Optional[TrainSetup] = None,
                       task: Optional[Task] = None) -> jax.stages.Compiled:
  """The compiled `train_step(state, batch, rng) -> (state, metrics)`; the state is donated.

  With `train.grad_accum_steps='auto'` the accumulation is chosen first (accumulation.py)."""
  task = setup.task if setup is not None else task or MaskedLMTask()
  if config.train.grad_accum_steps == 'auto':
    from realformer_jax.train import accumulation  # pylint: disable=import-outside-toplevel
    return accumulation.resolve(config, validation.validate_config(config, task=task),
                                task=task).compiled
  setup = setup or make_setup(config, task=task)
  train_step = step_lib.make_train_step(setup.model, setup.tx, config.train,
                                        setup.layout.param_shardings, task=setup.task)
  jitted = jax.jit(train_step,
                   in_shardings=(setup.layout.shardings, setup.batch_sharding, setup.replicated),
                   out_shardings=(setup.layout.shardings, setup.replicated),
                   donate_argnums=0)
  with partitioning.activate(setup.mesh, setup.rules):
    return jitted.lower(setup.layout.abstract, setup.abstract_batch(),
                        setup.abstract_rng()).compile()


def compile_eval_step(setup: TrainSetup) -> jax.stages.Compiled:
  """The compiled `eval_step(state, batch) -> (metric sums, per-row outputs)`, both
  replicated (outputs are small: logits or predictions per row)."""
  jitted = jax.jit(step_lib.make_eval_step(setup.model, setup.config.train.grad_accum_steps,
                                           setup.task),
                   in_shardings=(setup.layout.shardings, setup.batch_sharding),
                   out_shardings=setup.replicated)
  with partitioning.activate(setup.mesh, setup.rules):
    return jitted.lower(setup.layout.abstract, setup.abstract_batch()).compile()

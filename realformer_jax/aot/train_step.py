"""The project's train step compiled for an accelerator target on any machine.

    step = train_step.compile_for_target(config, targets.parse('h100:8'))
    step.memory.needed, step.budget_bytes, step.spec.train.grad_accum_steps

Everything is the real training path (realformer_jax/train): the config is validated for the
target's device and host count, the mesh and logical rules of the config are laid over the
target's compile-only devices, and the step is `build.compile_train_step`'s. With
`train.grad_accum_steps='auto'` the project's accumulation search (train/build.py: resolve) runs
with the TARGET's memory as its budget, so the choice is what 'auto' would pick on that
machine. Nothing is allocated and no device is opened.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import jax
import ml_collections

from realformer_jax.aot.targets import Target
from realformer_jax.config import ConfigError
from realformer_jax.train import build
from realformer_jax.train.config import RunSpec, TrainConfig, validate_config
from realformer_jax.units import GiB


@dataclasses.dataclass(frozen=True)
class MemoryUse:
  """Per-device bytes of a compiled step, from XLA's buffer assignment."""

  arguments: int
  outputs: int
  aliased: int  # outputs that reuse donated inputs (the train state)
  temporaries: int
  params: int  # this device's shards of the parameters
  optimizer_state: int  # ... and of the optimizer state (AdamW moments, counters)

  @property
  def needed(self) -> int:
    """What must be resident at once: the same formula 'auto' accumulation uses."""
    return self.arguments + self.outputs - self.aliased + self.temporaries

  @property
  def batch_and_rest(self) -> int:
    return self.arguments - self.params - self.optimizer_state


def per_device_bytes(abstract_tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (device 0's shards)."""
  total = 0
  for leaf in jax.tree.leaves(abstract_tree):
    total += math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
  return total


def memory_budget(train: TrainConfig, target: Target) -> tuple[int, str]:
  """(bytes one device of `target` may use, where that figure came from): the config's
  `train.device_memory_bytes` if it sets one, else what XLA may use on the target's device,
  times `train.memory_fraction`."""
  chip = target.chip
  if train.device_memory_bytes > 0:
    capacity, source = int(train.device_memory_bytes), 'train.device_memory_bytes'
  else:
    capacity = chip.usable_memory_bytes
    share = capacity / chip.memory_bytes
    source = f'{chip.description}: {capacity / GiB:.2f} GiB'
    if chip.platform == 'cuda':
      source += (
        f' usable ({share:.0%} of {chip.memory_bytes / GiB:.2f} GiB: JAX preallocates '
        'that share of a GPU, XLA_PYTHON_CLIENT_MEM_FRACTION)'
      )
    else:
      source += f' of {chip.memory_bytes / GiB:.0f} GiB HBM available to XLA'
  return int(capacity * train.memory_fraction), (
    f'{source} x memory_fraction {train.memory_fraction}'
  )


@dataclasses.dataclass(frozen=True)
class TargetStep:
  target: Target
  resolved: build.Resolved  # concrete spec, its setup and the compiled step
  memory: MemoryUse
  budget_bytes: int
  budget_source: str
  compile_seconds: float = 0.0  # wall time of build.resolve here: every compile it made

  @property
  def compiled(self) -> jax.stages.Compiled:
    return self.resolved.compiled

  @property
  def spec(self) -> RunSpec:
    return self.resolved.spec

  @property
  def fits(self) -> bool:
    return self.memory.needed <= self.budget_bytes


def compile_for_target(
  config: ml_collections.ConfigDict, target: Target, log: Callable[[str], None] = print
) -> TargetStep:
  """Validates `config` for the target and compiles its train step there (resolving 'auto'
  accumulation against the target's memory). Raises ConfigError (one line) for a bad config
  or a step that cannot fit even at one sequence per device."""
  devices = target.devices()
  hosts = len({d.process_index for d in devices})
  spec = validate_config(
    config,
    device_count=len(devices),
    process_count=hosts,
    memory_budget=lambda train: memory_budget(train, target),
  )
  budget, source = memory_budget(spec.train, target)
  start = time.perf_counter()
  try:
    resolved = build.resolve(spec, (budget, source), log=log, devices=devices)
  except jax.errors.JaxRuntimeError as e:  # an explicit accumulation XLA:TPU cannot fit
    required = build.out_of_memory_bytes(e)
    if required is None:
      raise
    raise ConfigError(
      f'train.grad_accum_steps={spec.train.grad_accum_steps}: the step needs at least '
      f'{required:,} bytes per device ({required / GiB:.2f} GiB of temporaries, as XLA reports '
      f"it), the target has {budget:,} ({source}); try grad_accum_steps='auto', FSDP "
      '(mesh.shape=(1,-1,1)) or more devices'
    ) from e
  compile_seconds = time.perf_counter() - start
  m = resolved.compiled.memory_analysis()
  state = resolved.setup.layout.abstract
  memory = MemoryUse(
    arguments=m.argument_size_in_bytes,
    outputs=m.output_size_in_bytes,
    aliased=m.alias_size_in_bytes,
    temporaries=m.temp_size_in_bytes,
    params=per_device_bytes(state.params),
    optimizer_state=per_device_bytes(state.opt_state),
  )
  return TargetStep(target, resolved, memory, budget, source, compile_seconds)

"""A validated run: every config section as a frozen, typed dataclass.

The user's config is an ml_collections ConfigDict (configs/ files, `--config.a.b=v` flags).
`validation.validate_config` turns it, once, into a `RunSpec`; everything below the entry point
takes the spec (or the one section it needs), never the ConfigDict, and nothing ever writes to
the user's config. Each section checks itself when it is made (`__post_init__`), so a section
that exists is valid; checks across sections live in validation.py.

    spec = train.validate_config(config)    # MaskedLMTask unless a task is given
    spec.train.learning_rate, spec.mesh.shape, spec.model.num_layers, spec.data.max_len
    spec = spec.replace(train=spec.train.replace(grad_accum_steps=4))
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Union

from realformer_jax.config import ConfigError, ModelConfig

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
  # compiled step fits the device memory (train/accumulation.py resolves it, once).
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
      'must be in [0, train.num_train_steps]',
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
  )  # mesh axis names (logical_axis_rules' targets)
  shape: tuple[int, ...] = (-1, 1, 1)  # one entry may be -1: all remaining devices

  def __post_init__(self):
    axes, shape = tuple(self.axes), tuple(self.shape)
    object.__setattr__(self, 'axes', axes)
    object.__setattr__(self, 'shape', shape)
    _require(
      len(axes) > 0 and all(isinstance(a, str) and a for a in axes) and len(set(axes)) == len(axes),
      'mesh.axes',
      axes,
      'must be distinct non-empty names',
    )
    _require(
      len(shape) == len(axes), 'mesh.shape', shape, f'must have one entry per mesh axis {axes}'
    )
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
    _require(
      math.prod(shape) == device_count,
      'mesh.shape',
      self.shape,
      f'needs {math.prod(shape)} devices, found {device_count}',
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

  task: Any  # a train.task.Task: what is trained (masked LM, fine-tuning, ...), its loss
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

  def batch_mesh_axes(self) -> tuple[str, ...]:
    """The mesh axes the batch dimension is split over (the first rule for 'batch')."""
    for logical, targets in self.rules:
      if logical == 'batch':
        if targets is None:
          return ()
        return (targets,) if isinstance(targets, str) else tuple(targets)
    return ()

  def data_parallel_size(self, device_count: int) -> int:
    """How many groups of devices the batch is split over, on `device_count` devices."""
    sizes = dict(zip(self.mesh.axes, self.mesh.resolve(device_count)))
    return math.prod(sizes[axis] for axis in self.batch_mesh_axes())

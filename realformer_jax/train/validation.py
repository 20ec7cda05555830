"""Every check a training config must pass before anything is built or compiled.

`validate_config` raises `ConfigError` (or the data module's `DataError`) with a one-line
message that names the offending field, e.g.

    train.global_batch_size=12: must be divisible by data-parallel size 8 (mesh data*fsdp) ...
"""

from __future__ import annotations

import math
from typing import Optional

import ml_collections

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.train import defaults
from realformer_jax.train.mlm_task import MaskedLMTask
from realformer_jax.train.task import Task

# Sections every task's config has; None: checked elsewhere (model: by the task's
# model_config, data: by the task's schema and checks).
_SECTIONS = {
    'model': None,
    'data': None,
    'train': defaults.default_train_config,
    'mesh': defaults.default_mesh_config,
    'logical_axis_rules': None,
    'distributed': defaults.default_distributed_config,
}


def validate_config(config: ml_collections.ConfigDict, *, device_count: Optional[int] = None,
                    process_count: Optional[int] = None,
                    task: Optional[Task] = None) -> ModelConfig:
  """Checks the whole config of `task` (default: masked-LM pretraining); returns the validated
  ModelConfig.

  Without `device_count` / `process_count` only what needs no devices is checked (safe before
  `jax.distributed.initialize`); with them, the mesh shape and batch layout are checked too.
  """
  task = task or MaskedLMTask()
  _check_known_fields(config, task)
  model = task.model_config(config)
  task.validate_data_config(config.data)
  if model.position_embedding == 'learned' and config.data.max_len > model.max_len:
    raise ConfigError(f'data.max_len={config.data.max_len}: sequence longer than the position '
                      f'table model.max_len={model.max_len}')
  task.validate(config, model)
  _check_train(config.train)
  _check_mesh_and_rules(config.mesh, config.logical_axis_rules)
  _check_distributed(config.distributed)
  if device_count is not None:
    check_devices(config, device_count, process_count or 1)
  return model


def check_devices(config: ml_collections.ConfigDict, device_count: int,
                  process_count: int) -> None:
  """The mesh fits the devices and every microbatch splits evenly over the batch shards."""
  shape = resolve_mesh_shape(config.mesh, device_count)
  check_batch_layout(config, dict(zip(config.mesh.axes, shape)), process_count)


def _check_known_fields(config: ml_collections.ConfigDict, task: Task) -> None:
  sections = dict(_SECTIONS, data=task.default_data_config, **task.extra_sections())
  for name in config.keys():
    if name not in sections:
      raise ConfigError(f'{name}: unknown config section (known: {", ".join(sections)})')
  for name, make_default in sections.items():
    if name not in config:
      raise ConfigError(f'{name}: missing config section')
    if make_default is None:
      continue
    known = set(make_default().keys())
    for key in config[name].keys():
      if key not in known:
        raise ConfigError(f'{name}.{key}: unknown config field')


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, field: str, value, rule: str) -> None:
  if not ok:
    raise ConfigError(f'{field}={value!r}: {rule}')


def _check_train(train: ml_collections.ConfigDict) -> None:
  accum = train.grad_accum_steps
  if isinstance(accum, str) and accum.isdigit():  # from the command line: '--...=4'
    train.grad_accum_steps = accum = int(accum)
  _require(accum == 'auto' or (_is_int(accum) and accum > 0), 'train.grad_accum_steps', accum,
           "must be a positive integer or 'auto'")
  for name in ('global_batch_size', 'num_train_steps', 'log_every_steps', 'prefetch_batches',
               'eval_every_steps', 'checkpoint_every_steps', 'keep_checkpoints'):
    value = train[name]
    _require(_is_int(value) and value > 0, f'train.{name}', value, 'must be a positive integer')
  _require(_is_int(train.device_memory_bytes) and (train.device_memory_bytes > 0
                                                   or train.device_memory_bytes == -1),
           'train.device_memory_bytes', train.device_memory_bytes,
           'must be a positive number of bytes or -1 (ask the device)')
  _require(0 < train.memory_fraction <= 1, 'train.memory_fraction', train.memory_fraction,
           'must be in (0, 1]')
  _require(_is_int(train.warmup_steps) and 0 <= train.warmup_steps <= train.num_train_steps,
           'train.warmup_steps', train.warmup_steps, 'must be in [0, train.num_train_steps]')
  _require(train.stop_at_step == -1 or (_is_int(train.stop_at_step) and train.stop_at_step > 0),
           'train.stop_at_step', train.stop_at_step, 'must be -1 or a positive integer')
  _require(math.isfinite(train.learning_rate) and train.learning_rate > 0,
           'train.learning_rate', train.learning_rate, 'must be positive and finite')
  _require(math.isfinite(train.weight_decay) and train.weight_decay >= 0,
           'train.weight_decay', train.weight_decay, 'must be >= 0')
  _require(math.isfinite(train.clip_grad_norm) and train.clip_grad_norm >= 0,
           'train.clip_grad_norm', train.clip_grad_norm, 'must be >= 0 (0 = off)')
  for name in ('adam_b1', 'adam_b2'):
    _require(0 <= train[name] < 1, f'train.{name}', train[name], 'must be in [0, 1)')
  _require(train.adam_eps > 0, 'train.adam_eps', train.adam_eps, 'must be positive')
  _require(_is_int(train.seed) and 0 <= train.seed < 2**32, 'train.seed', train.seed,
           'must be an integer in [0, 2**32)')


def _check_mesh_and_rules(mesh: ml_collections.ConfigDict, rules) -> None:
  axes, shape = tuple(mesh.axes), tuple(mesh.shape)
  _require(len(axes) > 0 and all(isinstance(a, str) and a for a in axes)
           and len(set(axes)) == len(axes), 'mesh.axes', axes, 'must be distinct non-empty names')
  _require(len(shape) == len(axes), 'mesh.shape', shape,
           f'must have one entry per mesh axis {axes}')
  _require(all(_is_int(s) and (s > 0 or s == -1) for s in shape) and shape.count(-1) <= 1,
           'mesh.shape', shape, 'entries must be positive, with at most one -1')
  seen = set()
  for rule in rules:
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
      raise ConfigError(f'logical_axis_rules: {rule!r} is not a (logical name, mesh axes) pair')
    logical, targets = rule
    if logical not in defaults.LOGICAL_AXES:
      raise ConfigError(f'logical_axis_rules: unknown logical axis {logical!r} (the model uses '
                        f'{", ".join(defaults.LOGICAL_AXES)})')
    seen.add(logical)
    targets = () if targets is None else (targets,) if isinstance(targets, str) else targets
    for target in targets:
      if target not in axes:
        raise ConfigError(f'logical_axis_rules: mesh axis {target!r} (for {logical!r}) is not '
                          f'in mesh.axes={axes}')
  if 'batch' not in seen:
    raise ConfigError("logical_axis_rules: no rule for 'batch' (map it to the data-parallel "
                      'mesh axes, or to None to replicate the batch)')


def _check_distributed(dist: ml_collections.ConfigDict) -> None:
  _require(_is_int(dist.num_processes) and dist.num_processes >= 1, 'distributed.num_processes',
           dist.num_processes, 'must be a positive integer')
  _require(_is_int(dist.process_id) and 0 <= dist.process_id < dist.num_processes,
           'distributed.process_id', dist.process_id, 'must be in [0, distributed.num_processes)')
  _require(dist.num_processes == 1 or bool(dist.coordinator_address),
           'distributed.coordinator_address', dist.coordinator_address,
           "must be 'host:port' when distributed.num_processes > 1")


def resolve_mesh_shape(mesh: ml_collections.ConfigDict, device_count: int) -> tuple[int, ...]:
  """mesh.shape with -1 replaced by the remaining devices; the product must be device_count."""
  shape = tuple(mesh.shape)
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    _require(device_count % known == 0, 'mesh.shape', shape,
             f'fixed axes ({known} devices) do not divide the {device_count} devices')
    shape = tuple(device_count // known if s == -1 else s for s in shape)
  _require(math.prod(shape) == device_count, 'mesh.shape', tuple(mesh.shape),
           f'needs {math.prod(shape)} devices, found {device_count}')
  return shape


def batch_mesh_axes(rules) -> tuple[str, ...]:
  """The mesh axes the batch dimension is split over (first rule for 'batch')."""
  for logical, targets in rules:
    if logical == 'batch':
      return () if targets is None else (targets,) if isinstance(targets, str) else tuple(targets)
  return ()


def check_batch_layout(config: ml_collections.ConfigDict, mesh_sizes: dict[str, int],
                       process_count: int) -> None:
  """Every microbatch splits evenly over the data-parallel devices and over processes."""
  train = config.train
  batch_axes = batch_mesh_axes(config.logical_axis_rules)
  data_parallel = math.prod(mesh_sizes[a] for a in batch_axes)
  accum = 1 if train.grad_accum_steps == 'auto' else train.grad_accum_steps
  if train.global_batch_size % (data_parallel * accum):
    raise ConfigError(
        f'train.global_batch_size={train.global_batch_size}: must be divisible by the '
        f'data-parallel size {data_parallel} (mesh {"*".join(batch_axes) or "none"}) times '
        f'train.grad_accum_steps={accum}')
  if train.global_batch_size % process_count:
    raise ConfigError(f'train.global_batch_size={train.global_batch_size}: must be divisible '
                      f'by the process count {process_count}')
  if data_parallel % process_count:
    # Each process feeds only its own rows; with fewer batch shards than processes some
    # processes' devices would need rows that another process read.
    raise ConfigError(f'mesh.shape={tuple(config.mesh.shape)}: the batch is split over '
                      f'{data_parallel} device group(s) (mesh {"*".join(batch_axes) or "none"}), '
                      f'which must be a multiple of the process count {process_count}')

"""The one place a training config is checked: ConfigDict in, frozen RunSpec out.

`validate_config` raises `ConfigError` (or the data module's `DataError`) with a one-line
message that names the offending field, e.g.

    train.global_batch_size=12: must be divisible by data-parallel size 8 (mesh data*fsdp) ...

Each section checks itself when its dataclass is made (train/spec.py, data/config.py,
realformer_jax/config.py); this module adds what spans sections or layers (unknown sections and
fields, the kernel backend model.attention_impl names (kernels/select.py), the position table
against the sequence length, the logical axis rules against the mesh, the batch against the
devices). The user's config is read, never written.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import ml_collections
import numpy as np

from realformer_jax.config import ConfigError, from_section
from realformer_jax.kernels import select
from realformer_jax.train import defaults
from realformer_jax.train import spec as spec_lib
from realformer_jax.train.spec import RunSpec
from realformer_jax.train.task import Task

# Sections every task's config has, and their schemas (model and data: the task's).
_COMMON_SECTIONS = {
  'train': spec_lib.TrainConfig,
  'mesh': spec_lib.MeshConfig,
  'distributed': spec_lib.DistributedConfig,
}


def validate_config(
  config: ml_collections.ConfigDict,
  *,
  task: Task,
  device_count: Optional[int] = None,
  process_count: Optional[int] = None,
) -> RunSpec:
  """The RunSpec of `config` for `task` (train.validate_config defaults it to masked-LM
  pretraining: pretraining.py; this module knows no task).

  Without `device_count` / `process_count` only what needs no devices is checked (safe before
  `jax.distributed.initialize`); with them, the mesh shape and batch layout are checked too.
  """
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
    check_devices(spec, device_count, process_count or 1)
  return spec


def check_devices(spec: RunSpec, device_count: int, process_count: int) -> None:
  """The mesh fits the devices, every microbatch splits evenly over the batch shards, and every
  sharded parameter dimension over its mesh axes."""
  check_batch_layout(spec, spec.data_parallel_size(device_count), process_count)
  check_param_layout(spec, device_count)


def check_param_layout(spec: RunSpec, device_count: int) -> None:
  """Each model size that a logical axis rule shards (defaults.PARAM_AXIS_FIELDS) divides by
  the product of its mesh axes: otherwise creating the parameters fails deep in JAX
  (IndivisibleError), after the workdir is taken."""
  sizes = dict(zip(spec.mesh.axes, spec.mesh.resolve(device_count)))
  done = set()
  for logical, targets in spec.rules:
    field = defaults.PARAM_AXIS_FIELDS.get(logical)
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


def check_optimizer_dtypes(train: spec_lib.TrainConfig, param_dtype: str) -> None:
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


def _check_sections(config: ml_collections.ConfigDict, task: Task) -> None:
  known = ('model', 'data', 'logical_axis_rules', *_COMMON_SECTIONS, *task.extra_sections())
  for name in config.keys():
    if name not in known:
      raise ConfigError(f'{name}: unknown config section (known: {", ".join(known)})')
  for name in known:
    if name not in config:
      raise ConfigError(f'{name}: missing config section')


def _rules(rules: Any, mesh: spec_lib.MeshConfig) -> spec_lib.Rules:
  """The logical axis rules as a tuple of (logical name, mesh axes), checked against the mesh."""
  normalised, seen = [], set()
  for rule in rules:
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
      raise ConfigError(f'logical_axis_rules: {rule!r} is not a (logical name, mesh axes) pair')
    logical, targets = rule
    if logical not in defaults.LOGICAL_AXES:
      raise ConfigError(
        f'logical_axis_rules: unknown logical axis {logical!r} (the model uses '
        f'{", ".join(defaults.LOGICAL_AXES)})'
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
  """Every microbatch splits evenly over the `data_parallel` device groups and processes."""
  train = spec.train
  batch_axes = spec.batch_mesh_axes()
  accum = 1 if train.grad_accum_steps == spec_lib.AUTO else train.grad_accum_steps
  for name, rows in spec.task.batch_rows(spec).items():
    if rows % (data_parallel * accum):
      raise ConfigError(
        f'{name}={rows}: must be divisible by the '
        f'data-parallel size {data_parallel} (mesh {"*".join(batch_axes) or "none"}) times '
        f'train.grad_accum_steps={accum}'
      )
    if rows % process_count:
      raise ConfigError(f'{name}={rows}: must be divisible by the process count {process_count}')
  if data_parallel % process_count:
    # Each process feeds only its own rows; with fewer batch shards than processes some
    # processes' devices would need rows that another process read.
    raise ConfigError(
      f'mesh.shape={spec.mesh.shape}: the batch is split over '
      f'{data_parallel} device group(s) (mesh {"*".join(batch_axes) or "none"}), '
      f'which must be a multiple of the process count {process_count}'
    )

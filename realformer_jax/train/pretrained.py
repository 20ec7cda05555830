"""A trained workdir as a starting point: its config, model config, parameters and tokenizer.

    run = train.load_workdir('/tmp/realformer_tiny')       # latest checkpoint
    model = run.spec.task.make_model(run.model_config)    # the run's task's module
    outputs = model.apply({'params': run.params}, ...)
    ids = run.tokenizer.encode('In the beginning')

The parameters are restored onto the devices of this process, whatever mesh and process count
wrote them (orbax restores to the shardings it is given): by default replicated over a
data-parallel mesh of every device; pass `mesh_shape` (e.g. `(1, -1, 1)` for FSDP) for a
model too big to replicate.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Optional, Sequence

import jax
import ml_collections

from realformer_jax import data
from realformer_jax.config import ConfigError, ModelConfig, saved_field
from realformer_jax.train import build, checkpoint_record, checkpointing, run_identity
from realformer_jax.train import config as train_config
from realformer_jax.train.checkpointing import Checkpointer
from realformer_jax.train.config import RunSpec
from realformer_jax.train.task import Task
from realformer_jax.workdir_layout import CONFIG_FILE, checkpoints_dir


@dataclasses.dataclass(frozen=True)
class Pretrained:
  workdir: str
  config: ml_collections.ConfigDict  # the run's training config (config.json)
  spec: RunSpec  # that config, validated
  model_config: ModelConfig
  params: Any  # restored parameters (jax.Arrays on this process's devices)
  step: int  # the checkpoint's step
  identity: run_identity.Identity  # step, checksum verdict, config and corpus digests
  # (SHA-256, where recorded) of the tokenizer the step was trained with, if known
  recorded_tokenizer: Optional[tuple[str, str]] = None

  @functools.cached_property
  def tokenizer(self) -> data.Tokenizer:
    """The run's tokenizer: the copy in the workdir, else prepared from its data config;
    ConfigError if it is not the one the step records (checkpoint_record.py)."""
    tokenizer = workdir_tokenizer(self.workdir, self.spec.data)
    checkpoint_record.check_tokenizer(tokenizer, self.recorded_tokenizer, self.workdir)
    return tokenizer


def workdir_tokenizer(workdir: str, data_config: data.DataConfig) -> data.Tokenizer:
  """The tokenizer of a run: the copy in its workdir, else prepared from its data config."""
  for name in data.tokenizers.FILE_NAMES:
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      return data.tokenizers.load(path, lower_case=data_config.lower_case)
  return data.prepare(data_config)


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The training config a workdir was written with, on top of today's defaults."""
  return _config_from(read_config_json(workdir), os.path.join(workdir, CONFIG_FILE))


def read_config_json(workdir: str) -> dict:
  """The workdir's config.json as written (ConfigError in one line if missing or damaged)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    recorded = _newest_recorded_config(workdir)
    if recorded is None:
      raise ConfigError(f'{path}: no such file; is {workdir} a workdir of experiments.train?')
    step, config = recorded
    if path not in _WARNED:  # once a process (the export reads it twice)
      _WARNED.add(path)
      checkpointing.warn(f'{path} is missing: using the config checkpoint step {step} records')
    return config
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(
      f'{path}: unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e}); '
      "a run writes it whole, so it was truncated or damaged since: put back the run's own "
      "copy (not a sibling run's: its model could differ)"
    ) from None
  if not isinstance(saved, dict):
    raise ConfigError(f'{path}: not a config (a JSON {type(saved).__name__}, not an object)')
  return saved


# Sections that only another command's runs write, and that command: a workdir of theirs is
# not a pretraining run (its `data` section is another schema), said as such.
_OTHER_COMMANDS = {'finetune': 'experiments.finetune', 'decode': 'experiments.translate'}


_WARNED: set = set()


def _newest_recorded_config(workdir: str) -> Optional[tuple[int, dict]]:
  """(step, config) that the newest committed step that records its config holds."""
  directory = checkpoints_dir(workdir)
  for step in reversed(checkpointing.committed_steps(directory)):
    try:
      record = checkpoint_record.read(os.path.join(directory, str(step)))
    except ConfigError:
      continue  # damaged: an older step may say it
    if record is not None:
      return step, record['config']
  return None


def _config_from(saved: dict, path: str) -> ml_collections.ConfigDict:
  config = train_config.default_config()
  for section, command in _OTHER_COMMANDS.items():
    if section in saved:
      raise ConfigError(
        f'{path}: written by a run of {command} (its config has a {section!r} section), not by '
        'a masked-LM pretraining run of experiments.train, which is what is exported or '
        'fine-tuned from'
      )
  for section, values in saved.items():
    if section not in config:
      raise ConfigError(f'{path}: unknown config section {section!r}')
    if not isinstance(values, dict):  # logical_axis_rules
      config[section] = tuple(tuple(rule) for rule in values)
      continue
    for field, value in values.items():
      # A field that moved since the workdir was written (config.SAVED_FIELD_MOVES).
      moved = saved_field(section, field, config[section])
      if moved is None:
        continue
      section_name, field_name = moved
      if field_name not in config[section_name]:
        raise ConfigError(f'{path}: unknown config field {section}.{field}')
      if isinstance(value, list):
        value = tuple(value)
      if value is None:  # placeholders (e.g. model.residual_attention) stay typed
        config[section_name][field_name] = None
      else:
        # ConfigDict refuses int -> float and the like; JSON does not keep the difference.
        current = config[section_name][field_name]
        if isinstance(current, float) and isinstance(value, int):
          value = float(value)
        config[section_name][field_name] = value
  return config


def load_workdir(
  workdir: str,
  step: Optional[int] = None,
  mesh_shape: Optional[Sequence[int]] = None,
  task: Optional[Task] = None,
) -> Pretrained:
  """Config and parameters of `workdir` at `step` (default: its latest checkpoint), a run of
  `task` (default: the default task, task.py)."""
  workdir = os.path.abspath(os.path.expanduser(workdir))
  saved = read_config_json(workdir)
  config = _config_from(saved, os.path.join(workdir, CONFIG_FILE))
  spec = train_config.validate_config(config, task=task)
  # Batch divisibility does not matter for loading: one row per data-parallel device.
  spec = spec.replace(
    mesh=spec.mesh.replace(
      shape=tuple(mesh_shape)
      if mesh_shape is not None
      else (-1,) + (1,) * (len(spec.mesh.axes) - 1)
    )
  )
  # Read-only: safe beside a live run (nothing cleaned up, renamed or rotated).
  checkpointer = Checkpointer(workdir, keep=spec.train.keep_checkpoints, writer=False)
  try:
    steps = checkpointer.all_steps()
    if not steps:
      raise ConfigError(f'{checkpointer.directory}: no checkpoint to load')
    if step is not None and step not in steps:
      raise ConfigError(
        f'step={step}: no checkpoint at that step in {checkpointer.directory} '
        f'(have {sorted(steps)})'
      )
    explicit = step is not None
    # Everything read from the step is read under its read lock: the live run's rotation
    # cannot delete it between the checksums, the restore and the identity (checkpointing.py).
    with checkpointer.reading(step) as step:
      if explicit:
        checkpointer.check_step(step)  # a damaged step is never loaded
      # The step says which model and tokenizer it holds: config.json must agree with it.
      recorded = checkpoint_record.verify(
        workdir, step, config_json=saved, data_dir=spec.data.data_dir
      )
      setup = build.make_setup(spec)
      state = checkpointer.restore_state(step, setup.layout.abstract)
      params = jax.block_until_ready(state.params)
      identity = run_identity.of_checkpoint(workdir, step, saved)
  finally:
    checkpointer.close()
  return Pretrained(
    workdir=workdir,
    config=config,
    spec=spec,
    model_config=spec.model,
    params=params,
    step=int(step),
    identity=identity,
    recorded_tokenizer=recorded,
  )

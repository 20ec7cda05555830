"""What a checkpoint holds, recorded in it: the run's config and tokenizer (`run_record.json`).

A step's weights do not say which model computes with them (Post-LN and RealFormer weights have
the same tree), and the tokenizer beside them is a file anyone can replace. So a sibling run's
config.json or tokenizer put back in a workdir would export, resume or fine-tune the wrong
model without a word. Every step a run saves therefore records

    {"format": 2,
     "config": {...},            config.json's sections, as the run that saved the step wrote them
     "tokenizer_sha256": "...",  the tokenizer the run trained with (the packed store's field)
     "tokenizer_file": "..."}    where that tokenizer was read from, for the message

written by the save on the primary host once every process has written the step, before
checksums.json lists its files (checkpointing.py), so its bytes are checked like the rest. Before
a step is used, what it records is compared with what is about to be used with it:

- a resume (resume_checks.check_resumable): this config's model against the newest step's;
- `verify`, the one call a user of a step makes (a resume, `load_workdir` for export_hf and the
  studies, fine-tuning's starting point): config.json's model against the step's
  (`check_config`), and the tokenizer against the step's SHA-256 (`check_tokenizer`).

Which model fields must agree is `model_differences`: how a model is computed (dtype, remat,
kernels: MAY_DIFFER) may change on a resume; every other field says which model it is. A step
saved before records existed (format 1) is compared with config.json alone, and its tokenizer
with the SHA-256 its packed store recorded, where that store is found (`recorded_tokenizer`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, Mapping, Optional

from realformer_jax import atomic_files, workdir_layout
from realformer_jax.config import (
  LAYOUT_FIELDS,
  SAVED_FIELD_ADDED,
  ConfigError,
  ModelConfig,
  fields_of,
  saved_field,
)
from realformer_jax.workdir_layout import STEP_RECORD

RECORD_FILE = STEP_RECORD
# 2: steps carry RECORD_FILE and checksums.json. Steps of format 1 (saved before records)
# carry neither, or checksums.json alone.
FORMAT = 2
# How the model is computed, not which model: a resumed run (and config.json, which every
# start rewrites) may differ from a step in these (the execution concern, less the fields that
# change the parameters' tree).
MAY_DIFFER = tuple(f for f in fields_of('execution') if f not in LAYOUT_FIELDS)
_DEFAULTS = json.loads(json.dumps(dataclasses.asdict(ModelConfig())))


def make(config: Mapping[str, Any], tokenizer: Any) -> dict:
  """The record of a run whose config.json is `config` and whose tokenizer is `tokenizer`."""
  return {
    'format': FORMAT,
    'config': json.loads(json.dumps(config)),
    'tokenizer_sha256': tokenizer.sha256,
    'tokenizer_file': str(tokenizer.source),
  }


def write(step_dir: str, record: Mapping[str, Any]) -> None:
  atomic_files.write_json(os.path.join(step_dir, RECORD_FILE), record)


def verify(
  workdir: str,
  step: int,
  *,
  config_json: Optional[dict] = None,
  tokenizer: Any = None,
  data_dir: str = '',
  remedy: str = "put back the run's own tokenizer file",
  skip_damaged: bool = False,
) -> Optional[tuple[str, str]]:
  """The identity check of step `step` of `workdir` before it is used: `config_json` (the
  workdir's config.json, if given) must describe the model the step records, and `tokenizer`
  (if given) must be the one it was trained with. Returns (SHA-256, where recorded) of that
  tokenizer (recorded_tokenizer), for a tokenizer loaded later. `skip_damaged`: an unreadable
  record is no check (a resume: the restore sets the damaged step aside) rather than an error."""
  step_dir = os.path.join(workdir_layout.checkpoints_dir(workdir), str(step))
  try:
    record = read(step_dir)
  except ConfigError:
    if not skip_damaged:
      raise
    record = None
  if config_json is not None:
    check_config(workdir, step, record, config_json)
  recorded = recorded_tokenizer(workdir, step, record, data_dir)
  if tokenizer is not None:
    check_tokenizer(tokenizer, recorded, workdir, remedy)
  return recorded


def read(step_dir: str) -> Optional[dict]:
  """The record of the step in `step_dir`, None for a step saved before records. A step's
  files pass their checksums before it is read (checkpoint_integrity.problem)."""
  path = os.path.join(step_dir, RECORD_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      record = json.load(f)
    if not isinstance(record.get('config', {}).get('model'), dict):
      raise ValueError('no model section')
  except (OSError, ValueError, AttributeError) as e:
    raise ConfigError(f'{path}: unreadable ({type(e).__name__}): the step cannot say its model')
  return record


def with_added_fields(saved: Mapping[str, Any]) -> dict:
  """A saved model section with the fields added since it was written: the value runs before
  them were trained with (config.SAVED_FIELD_ADDED), not today's default."""
  added = {f: v for (section, f), v in SAVED_FIELD_ADDED.items() if section == 'model'}
  return {**added, **saved}


def model_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[list, list]:
  """(fields that make `current` another model than `recorded`, fields that only change how it
  is computed: MAY_DIFFER), between two model sections as config.json holds them. A field a
  section lacks (added since it was written) has config.SAVED_FIELD_ADDED's value, else its
  default; 'auto' on either side is not
  compared; fields that left the section since (config.SAVED_FIELD_MOVES) are not compared."""
  recorded = {k: v for k, v in recorded.items() if saved_field('model', k, _DEFAULTS) is not None}
  current = {k: v for k, v in current.items() if saved_field('model', k, _DEFAULTS) is not None}
  recorded = with_added_fields(recorded)
  differs = []
  for name in sorted(set(recorded) | set(current)):
    old, new = recorded.get(name, _DEFAULTS.get(name)), current.get(name, _DEFAULTS.get(name))
    if 'auto' not in (old, new) and old != new:
      differs.append(name)
  return [k for k in differs if k not in MAY_DIFFER], [k for k in differs if k in MAY_DIFFER]


def check_config(workdir: str, step: int, record: Optional[dict], config_json: dict) -> None:
  """ConfigError naming each field in which config.json's model is another model than the one
  step `step` recorded (a sibling run's config.json put back), None if it is the same."""
  if record is None:
    return
  saved, found = record['config']['model'], config_json.get('model', {})
  changed, _ = model_differences(saved, found)
  if changed:
    listed = ', '.join(
      f'model.{k}={found.get(k, _DEFAULTS.get(k))!r} (the step has {saved.get(k)!r})'
      for k in changed
    )
    config_file = workdir_layout.CONFIG_FILE
    raise ConfigError(
      f'{os.path.join(workdir, config_file)} describes another model than checkpoint step '
      f'{step} holds: {listed}; the step records its own model ({RECORD_FILE}): put back the '
      f"run's own {config_file}"
    )


def recorded_tokenizer(
  workdir: str, step: int, record: Optional[dict], data_dir: str
) -> Optional[tuple[str, str]]:
  """(SHA-256, where it is recorded) of the tokenizer step `step` was trained with: the step's
  record, else (a step saved before records) the packed store the step's data position names,
  found under `data_dir`; None when neither says."""
  if record is not None:
    return record['tokenizer_sha256'], f'checkpoint step {step} ({RECORD_FILE})'
  store = recorded_store(os.path.join(workdir_layout.checkpoints_dir(workdir), str(step)))
  if not store or not data_dir:
    return None
  root = os.path.expanduser(data_dir)
  for depth in range(1, 4):  # <data_dir>/<dataset>[/<version>]/packed/<store>.json
    pattern = os.path.join(root, *['*'] * depth, 'packed', f'{glob.escape(store)}.json')
    for path in sorted(glob.glob(pattern)):
      try:
        with open(path) as f:
          sha = json.load(f).get('tokenizer_sha256')
      except (OSError, ValueError, AttributeError):
        continue
      if sha:
        return sha, f'the packed store {path}'
  return None


def check_tokenizer(
  tokenizer: Any,
  recorded: Optional[tuple[str, str]],
  workdir: str,
  remedy: str = "put back the run's own tokenizer file",
) -> None:
  """ConfigError unless `tokenizer` is the one `recorded` (recorded_tokenizer) names."""
  if recorded is None or tokenizer.sha256 == recorded[0]:
    return
  raise ConfigError(
    f'{tokenizer.source}: not the tokenizer the run in {workdir} was trained with (SHA-256 '
    f'{tokenizer.sha256[:16]}; {recorded[1]} records {recorded[0][:16]}): its ids would '
    f'mean other pieces to the model; {remedy}'
  )


def recorded_store(step_dir: str) -> Optional[str]:
  """The packed store the data position of the step in `step_dir` names (its 'store' field),
  if any."""
  for path in sorted(glob.glob(os.path.join(step_dir, 'data', 'process_*.json'))):
    try:
      with open(path) as f:
        store = json.load(f).get('store')
    except (OSError, ValueError, AttributeError):
      return None
    return store if isinstance(store, str) else None
  return None

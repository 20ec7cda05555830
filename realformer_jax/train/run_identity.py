"""What an artifact made from a run's checkpoint came from: its identity.

Every artifact that leaves a run (a Hugging Face export, a fine-tuning starting point) carries

    workdir, step        the checkpoint it was made from
    checksums            the verdict of checkpoint_integrity on that step's files
    config_digest        SHA-256 (first 16 hex digits) of the config the step was saved with
                         (its run_record.json; a step saved before records: the run's
                         config.json), written canonically (sorted keys): any changed field
                         changes it
    corpus               what the step's data iterator state records of its corpus, as the run
                         wrote it (e.g. the packed store's name), never recomputed here: the
                         data side decides how a corpus is identified (path and size, or a
                         digest of its content), and the artifact repeats that
    tokenizer_digest     SHA-256 of the tokenizer file the run copied into its workdir

so that two artifacts can be compared and a mix of two (an export directory holding the files
of two runs, a fine-tuning run resumed from another starting point) is refused, not silent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Optional

from realformer_jax import workdir_layout
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.train import checkpoint_integrity, checkpoint_record

# Fields of a data iterator state that say where it is, not what it reads.
_POSITION_FIELDS = frozenset({'next_position', 'seed'})


@dataclasses.dataclass(frozen=True)
class Identity:
  workdir: str
  step: int
  checksums: str
  config_digest: str
  corpus: Optional[str]
  tokenizer_digest: Optional[str]

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def differences(self, other: dict[str, Any]) -> list[str]:
    """'field: recorded -> this' for each field in which `other` (a recorded identity) differs
    from this one."""
    mine = self.to_dict()
    return [
      f'{name} {other.get(name)!r} -> {value!r}'
      for name, value in mine.items()
      if other.get(name) != value
    ]


def config_digest(config: dict) -> str:
  canonical = json.dumps(config, sort_keys=True, separators=(',', ':'))
  return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def config_differences(recorded: dict, current: dict) -> list[str]:
  """'section.field old -> new' for each field of two configs (config.json's shape: sections of
  fields) that differs, sorted."""
  changed = []
  for section in sorted(set(recorded) | set(current)):
    old, new = recorded.get(section), current.get(section)
    if isinstance(old, dict) and isinstance(new, dict):
      changed += [
        f'{section}.{field} {old.get(field)!r} -> {new.get(field)!r}'
        for field in sorted(set(old) | set(new))
        if old.get(field) != new.get(field)
      ]
    elif old != new:
      changed.append(f'{section} {old!r} -> {new!r}')
  return changed


def of_checkpoint(workdir: str, step: int, config: dict) -> Identity:
  """The identity of step `step` of `workdir` (whose files `checkpoint_integrity.problem`
  passed), the run's config.json being `config`."""
  step_dir = os.path.join(workdir_layout.checkpoints_dir(workdir), str(step))
  record = checkpoint_record.read(step_dir)
  return Identity(
    workdir=os.path.abspath(workdir),
    step=int(step),
    checksums=checkpoint_integrity.verdict(step_dir),
    config_digest=config_digest(record['config'] if record is not None else config),
    corpus=_recorded_corpus(os.path.join(step_dir, 'data')),
    tokenizer_digest=tokenizer_digest(workdir),
  )


def _recorded_corpus(data_dir: str) -> Optional[str]:
  """The data state's fields other than its position, as 'name=value' pairs (sorted)."""
  if not os.path.isdir(data_dir):
    return None
  for name in sorted(os.listdir(data_dir)):
    if name.startswith('process_') and name.endswith('.json'):
      try:
        with open(os.path.join(data_dir, name)) as f:
          state = json.load(f)
      except (OSError, ValueError):
        return None
      if not isinstance(state, dict):
        return None
      fields = {k: v for k, v in state.items() if k not in _POSITION_FIELDS}
      return ', '.join(f'{k}={v}' for k, v in sorted(fields.items())) or None
  return None


def tokenizer_digest(workdir: str) -> Optional[str]:
  """SHA-256 (first 16 hex digits) of the tokenizer file the run copied into its workdir."""
  for name in tokenizer_lib.FILE_NAMES:
    path = os.path.join(workdir, name)
    if os.path.isfile(path):
      with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]
  return None

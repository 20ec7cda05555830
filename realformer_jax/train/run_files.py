"""The run files: config.json and the tokenizer's file, written into the workdir at every start
so that the workdir alone is enough to use the model later (train.load_workdir), with a note for
each one a resume replaces though someone changed it since the run wrote it."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

import jax

from realformer_jax import atomic_files
from realformer_jax.data import tokenizers
from realformer_jax.train import run_identity
from realformer_jax.train.errors import TrainingError
from realformer_jax.workdir_layout import CONFIG_FILE


def write_run_files(
  config_json: dict, tokenizer, workdir: str, recorded: Optional[tuple[int, dict]] = None
) -> list[str]:
  """config.json (`config_json`: the spec's sections, as validated) and a copy of the
  tokenizer's file, so the workdir alone is enough to use the model later
  (train.load_workdir). A resume (`recorded`: the newest step and the config it records) that
  replaces a file someone changed since the run wrote it (an edited config.json, a swapped
  tokenizer file) returns one note for each."""
  notes = []
  if jax.process_index() == 0 and recorded is not None:
    notes = _replaced_run_files(recorded, tokenizer, workdir)
  if jax.process_index() == 0:
    try:
      os.makedirs(workdir, exist_ok=True)
      # Atomic: a run killed while writing it must not leave a truncated config.json behind;
      # unchanged files (every restart) are not rewritten.
      atomic_files.write_json(os.path.join(workdir, CONFIG_FILE), config_json, sort_keys=False)
      tokenizer.save(workdir)
    except OSError as e:  # a full disk: nothing half-written is left (atomic_files)
      raise TrainingError(
        f'{workdir}: cannot write the run files (config.json, tokenizer): {e.strerror or e}; '
        'the checkpoints are untouched: free space and rerun'
      ) from e
  return notes


def _replaced_run_files(recorded: tuple[int, dict], tokenizer, workdir: str) -> list[str]:
  """A note for each run file in `workdir` that a resume is about to replace though someone
  changed it: a config.json that is not the config the newest step records (edited by hand:
  the flags' changes have notes of their own), a tokenizer file that is not the run's
  tokenizer (training uses the data config's, which its steps record)."""
  step, config = recorded
  notes = []
  path = os.path.join(workdir, CONFIG_FILE)
  try:
    with open(path) as f:
      found = json.load(f)
  except (OSError, ValueError):
    found = None  # missing or unreadable: check_resumable has said so
  if isinstance(found, dict):
    changed = run_identity.config_differences(config, found)
    if changed:
      shown = ', '.join(changed[:4]) + (
        f', ... ({len(changed)} fields)' if len(changed) > 4 else ''
      )
      notes.append(
        f'note: {path} is not the config checkpoint step {step} records ({shown}; recorded '
        "-> as found): replaced by this run's; it trains with the recorded config and the "
        'flags given'
      )
  for name in tokenizers.FILE_NAMES:
    path = os.path.join(workdir, name)
    if not os.path.isfile(path):
      continue
    with open(path, 'rb') as f:
      found_bytes = f.read()
    if name == tokenizer.file_name and found_bytes != tokenizer.file_bytes():
      notes.append(
        f"note: {path} is not the run's tokenizer (SHA-256 "
        f'{hashlib.sha256(found_bytes).hexdigest()[:16]}; the run trains with '
        f"{tokenizer.source}, {tokenizer.sha256[:16]}): replaced by the run's own"
      )
  return notes

"""Is a checkpoint directory whole? Checksums recorded at save time, verified before restoring.

orbax commits a step atomically (it writes `<step>.orbax-checkpoint-tmp`, then
`commit_success.txt`, then renames it to `<step>`), but nothing in a committed step protects its
bytes afterwards: a truncated or zero-length array file fails deep inside TensorStore, and
flipped bytes restore silently as wrong numbers (measured: ocdbt stores raw, unchecked chunks).
So the step records its own inventory, `checksums.json` (size and CRC-32 of every file), written
by orbax's post-finalization hook on the primary host: after every process has written its
shards and before the commit marker and the rename, so a committed step always carries it.

`problem(step_dir)` re-reads every file the inventory lists (CRC-32 runs at ~2 GB/s here; a
BERT-Large state with Adam moments is ~4 GB, so a few seconds once per start) and says what is
wrong, or None. A step saved before inventories existed is checked for its commit marker only;
but a step without an inventory is damaged (its inventory lost, its bytes unverifiable) when
it says it was saved with one (its run_record.json, checkpoint_record.py, came with
inventories) or when an older committed step of its run has one: a run that records inventories
records them for every step it saves after that (a run resumed across the upgrade has older
steps without).

Two files are left out of the inventory because orbax rewrites them after the hook runs:
`_CHECKPOINT_METADATA` (it adds the commit time; orbax reads it leniently) and the commit
marker itself (checked for presence).
"""

from __future__ import annotations

import json
import os
from typing import Optional

from realformer_jax import atomic_files
from realformer_jax.data.store.cache_integrity import crc32  # the caches' CRC-32, read in chunks
from realformer_jax.train.checkpoint_record import RECORD_FILE

CHECKSUMS_FILE = 'checksums.json'
COMMIT_MARKER = 'commit_success.txt'
_NOT_LISTED = frozenset({CHECKSUMS_FILE, COMMIT_MARKER, '_CHECKPOINT_METADATA'})


def record(step_dir: str) -> None:
  """Writes `<step_dir>/checksums.json`: {relative path: [bytes, crc32]} of every file."""
  files = {}
  for path in sorted(_files(step_dir)):
    relative = os.path.relpath(path, step_dir)
    if relative not in _NOT_LISTED:
      files[relative] = [os.path.getsize(path), crc32(path)]
  lines = [f'  {json.dumps(name)}: [{size}, {crc}]' for name, (size, crc) in files.items()]
  text = '{"algorithm": "crc32", "files": {\n' + ',\n'.join(lines) + '\n}}\n'  # a file a line
  atomic_files.write_bytes(os.path.join(step_dir, CHECKSUMS_FILE), text.encode(), sync=True)


def problem(step_dir: str) -> Optional[str]:
  """What is wrong with the committed step in `step_dir` (the first thing found), or None."""
  if not os.path.isdir(step_dir):
    return 'its directory is missing'
  if not os.path.isfile(os.path.join(step_dir, COMMIT_MARKER)):
    return f'it has no commit marker ({COMMIT_MARKER}): its save never finished'
  inventory_path = os.path.join(step_dir, CHECKSUMS_FILE)
  if not os.path.exists(inventory_path):
    evidence = _saved_with_inventory(step_dir)
    if evidence:
      return f'its {CHECKSUMS_FILE} is missing, though {evidence}: its bytes cannot be verified'
    return None  # saved before inventories were recorded: the restore itself is the check
  try:
    with open(inventory_path) as f:
      files = json.load(f)['files']
  except (OSError, ValueError, KeyError, TypeError) as e:
    return f'its {CHECKSUMS_FILE} is unreadable ({type(e).__name__})'
  for relative, (size, crc) in sorted(files.items()):
    path = os.path.join(step_dir, relative)
    if not os.path.isfile(path):
      return f'{relative} is missing'
    actual_size = os.path.getsize(path)
    if actual_size != size:
      return f'{relative} has {actual_size} bytes, {size} were saved'
    if crc32(path) != crc:
      return f'{relative} does not match its saved checksum (its bytes changed)'
  return None


def _saved_with_inventory(step_dir: str) -> Optional[str]:
  """Why the step in `step_dir` must have had an inventory (a phrase), or None."""
  if os.path.exists(os.path.join(step_dir, RECORD_FILE)):
    return f'its {RECORD_FILE} says it was saved with one'
  parent, name = os.path.split(os.path.normpath(step_dir))
  if not name.isdigit():
    return None
  try:  # older steps only: a run resumed across the upgrade saved its old ones without
    siblings = sorted(
      (n for n in os.listdir(parent) if n.isdigit() and int(n) < int(name)), key=int
    )
  except OSError:
    return None
  for sibling in siblings:
    path = os.path.join(parent, sibling)
    if os.path.isfile(os.path.join(path, COMMIT_MARKER)) and os.path.exists(
      os.path.join(path, CHECKSUMS_FILE)
    ):
      return f'the older step {sibling} of the same run has one'
  return None


def verdict(step_dir: str) -> str:
  """How far the bytes of the committed step in `step_dir`, which `problem` passed, are
  vouched for: what an artifact made from it records (run_identity.py)."""
  if os.path.exists(os.path.join(step_dir, CHECKSUMS_FILE)):
    return 'verified: every file matches its CRC-32 in checksums.json'
  return 'unverified: saved without checksums.json (only its commit marker was checked)'


def _files(directory: str):
  for root, _, names in os.walk(directory):
    for name in names:
      yield os.path.join(root, name)

"""Atomic file writes, in one place: a reader sees the old file or the whole new one, never a
partial write. train/ (the run's config, checkpoint records, divergence notes), data/ (cache
sidecars, manifests, tokenizers), analysis/ (the kernel checks' verdicts) and the studies' run
files all write through here. Standard library only: it sits below every package.
"""

import contextlib
import json
import os
from typing import Any


def write_bytes(path: str, data: bytes, *, sync: bool = False) -> bool:
  """Writes `path` through a temporary file and a rename: readers see all of it or nothing.
  A file that already holds `data` is left alone (a restart on a full disk rewrites nothing),
  and a write that fails (ENOSPC...) removes its temporary file before it raises. `sync`: the
  bytes reach the disk before the rename (a checkpoint's checksums must survive a power cut).
  Returns whether it wrote."""
  if _holds(path, data):
    return False
  tmp_path = f'{path}.tmp.{os.getpid()}'
  try:
    with open(tmp_path, 'wb') as f:
      f.write(data)
      if sync:
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_path, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp_path)
    raise
  return True


def write_json(path: str, value: Any, *, indent=2, sort_keys: bool = True, **dumps) -> bool:
  """`value` as JSON (`json.dumps` options: indent, sort_keys, default=...), written atomically
  by `write_bytes`; returns whether it wrote."""
  text = json.dumps(value, indent=indent, sort_keys=sort_keys, **dumps)
  return write_bytes(path, text.encode())


def _holds(path: str, data: bytes) -> bool:
  try:
    if os.path.getsize(path) != len(data):
      return False
    with open(path, 'rb') as f:
      return f.read() == data
  except OSError:
    return False

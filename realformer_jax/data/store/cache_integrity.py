"""Derived cache files that know their own size and checksum, so a damaged one is rebuilt.

The tokenizer model, the packed-sequence store and the encoded translation pairs are derived
data: when one is damaged (a copy cut short, a truncated write, flipped bytes), the right thing
is to build it again, with a note, not to fail or to train on garbage. Each is published with a
sidecar `<file>.json` that records what it was built from (for people) and, for this module:

    file_bytes     its size
    file_crc32     CRC-32 of its bytes, computed when it was built
    file_mtime_ns  its modification time when the checksum was last verified

`problem(path)` checks the size on every call (a stat) and re-reads the bytes only when the
modification time differs from the recorded one: a cache is hashed once when built and again
only after something wrote to it (or copied it), then the new time is recorded. So a multi-GB
store costs nothing on every start, while truncation (to any length, a whole number of rows
included) and any write that changed its bytes are caught. Silent bit rot that keeps the
modification time is not caught by this; it is the storage layer's job.

Publishing writes the sidecar before renaming the finished file into place (cache_lock.py), so
a published file always has its record; a missing or unreadable record counts as damage, as
does a record without these fields (a cache built before they existed: it is rebuilt once).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import zlib
from typing import Optional

from realformer_jax import atomic_files

_log = logging.getLogger(__name__)
_CHUNK_BYTES = 8 << 20
_FIELDS = ('file_bytes', 'file_crc32', 'file_mtime_ns')


def sidecar_path(path: str) -> str:
  return path + '.json'


def publish(tmp_path: str, path: str, record: dict, checksum: Optional[int] = None) -> None:
  """Publishes the finished file `tmp_path` as `path` with its sidecar (`record` plus size,
  checksum and time). `checksum`: its zlib.crc32, if the writer computed it on the way."""
  stat = os.stat(tmp_path)
  record = dict(
    record,
    file_bytes=stat.st_size,
    file_crc32=crc32(tmp_path) if checksum is None else checksum,
    file_mtime_ns=stat.st_mtime_ns,
  )  # a rename keeps the time
  atomic_files.write_json(sidecar_path(path), record)
  os.replace(tmp_path, path)


def publish_bytes(path: str, data: bytes, record: dict) -> None:
  tmp_path = f'{path}.tmp.{os.getpid()}'
  try:
    with open(tmp_path, 'wb') as f:
      f.write(data)
    publish(tmp_path, path, record)
  finally:
    if os.path.exists(tmp_path):
      os.remove(tmp_path)


def problem(path: str) -> Optional[str]:
  """Why the cache file `path` cannot be used (missing, or damaged), or None if it is whole."""
  if not os.path.isfile(path):
    return 'it does not exist'
  try:
    with open(sidecar_path(path)) as f:
      record = json.load(f)
  except FileNotFoundError:
    return f'its record {os.path.basename(sidecar_path(path))} is missing'
  except (OSError, ValueError):
    return f'its record {os.path.basename(sidecar_path(path))} is unreadable'
  if not isinstance(record, dict) or any(field not in record for field in _FIELDS):
    return 'it was built before caches recorded their size and checksum'
  stat = os.stat(path)
  if stat.st_size != record['file_bytes']:
    return f'it has {stat.st_size:,} bytes, {record["file_bytes"]:,} were written'
  if stat.st_mtime_ns == record['file_mtime_ns']:
    return None  # unchanged since its checksum was verified
  if crc32(path) != record['file_crc32']:
    return 'its bytes changed since it was built (checksum mismatch)'
  try:  # the same bytes with a new time (copied): remember it, to skip the hash next time
    atomic_files.write_json(sidecar_path(path), dict(record, file_mtime_ns=stat.st_mtime_ns))
  except OSError:
    pass  # a read-only data dir: verified again next time
  return None


def read_record(path: str) -> dict:
  """The sidecar of `path` ({} where there is none or it is unreadable)."""
  try:
    with open(sidecar_path(path)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


def remove_stale_temporaries(path: str) -> None:
  """Removes `<path>.tmp.<pid>` (and its sidecar's) left by a writer that died (kill -9, a full
  disk). Call it holding the entry's cache lock: every writer of `path` holds it while its
  temporary file exists, so whatever the lock holder finds is stale."""
  for stale in glob.glob(glob.escape(path) + '.tmp.*') + glob.glob(
    glob.escape(sidecar_path(path)) + '.tmp.*'
  ):
    with contextlib.suppress(OSError):
      os.remove(stale)


def note_rebuild(path: str, reason: str, action: str) -> None:
  """The one note a rebuild prints, e.g. action='training the tokenizer again'."""
  _log.warning('note: cache %s is damaged (%s): %s', path, reason, action)


def crc32(path: str) -> int:
  crc = 0
  with open(path, 'rb') as f:
    while chunk := f.read(_CHUNK_BYTES):
      crc = zlib.crc32(chunk, crc)
  return crc

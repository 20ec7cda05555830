"""The train split packed once into a read-only [N, max_len] array of token ids, cached on disk.

The training data is a function of the global sequence index only (see pipeline.py), so the
split is tokenized and packed once, in its stored record order, before training: documents are
concatenated and cut into [CLS] ... [SEP] rows exactly as `packing.pack_blocks` does (only the
final row is short, padded with [PAD] = 0). Row r of the store is packed sequence r.

File: `<dataset dir>/packed/packed-L<max_len>-<digest>.int32` beside `<dataset dir>/tokenizers`:
raw little-endian int32, row-major, no header (N = file size / (4 * max_len)), opened with
`np.memmap(mode='r')`, so every process maps the same pages and reads only the rows it uses.
A `.json` sidecar records what it was built from and the file's size and checksum: a damaged
store (truncated, even to a whole number of rows, or rewritten) is packed again, with a note
(cache_integrity.py). The digest hashes the dataset, split, text feature, max_documents, max_len
and the tokenizer's bytes, so different configs never share a file. The input mask is not
stored: real tokens are never [PAD], so it is `ids != [PAD]`.

Building takes the cache lock (cache_lock.py), writes a temporary file and renames it, so
concurrent processes on one machine (or hosts sharing a data_dir over NFS) build it once and a
reader never sees a partial file; hosts with local data dirs each build an identical copy.

Cost: one pass over the train split (read, tokenize, pack) on first use, then none (the store
is memory-mapped, not loaded). The documents are encoded by preparation's worker processes and
packed here in order (preparation.py); the store takes 4 * max_len bytes per row (~4 bytes per
token at max_len 128). The embedded bible_web corpus (1,134 chapters, 3.9 MB of text, 0.9M
tokens) packs into 7,152 rows (3.7 MB). Run it once before a cluster job
(`experiments.prepare_data` on the shared data_dir) rather than on every host's first step;
`max_documents` bounds it for smoke runs. Speeds: docs/data.md ("How fast").
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from typing import Callable, Iterable, Optional

import numpy as np
from absl import logging

from realformer_jax.data import packing
from realformer_jax.data.errors import DataError
from realformer_jax.data.store import cache_integrity, cache_lock

# Bump when the packing or file layout changes, so old cache entries are not reused.
_REVISION = 1
_DTYPE = np.dtype('<i4')


class PackedStore:
  """Read-only random access to the packed rows. Picklable: workers reopen the file."""

  def __init__(self, path: str, max_len: int):
    self.path = path
    self.max_len = max_len
    row_bytes = _DTYPE.itemsize * max_len
    size = os.path.getsize(path)
    if size % row_bytes:
      raise DataError(
        f'Packed store {path} has {size} bytes, not a multiple of one row '
        f'({row_bytes}): delete it and rerun to rebuild it.'
      )
    self.num_rows = size // row_bytes
    self._array = None

  @property
  def record(self) -> dict:
    """The sidecar: what the store was built from (key, tokenizer, corpus digest, counts)."""
    try:
      with open(cache_integrity.sidecar_path(self.path)) as f:
        return json.load(f)
    except (OSError, ValueError):
      return {}

  @property
  def name(self) -> str:
    return os.path.basename(self.path)

  def __len__(self) -> int:
    return self.num_rows

  def rows(self, indices) -> np.ndarray:
    """int32 [len(indices), max_len], a copy."""
    if self._array is None:
      self._array = np.memmap(self.path, _DTYPE, mode='r', shape=(self.num_rows, self.max_len))
    return np.array(self._array[np.asarray(indices)], np.int32)

  def __getstate__(self):
    return {'path': self.path, 'max_len': self.max_len}

  def __setstate__(self, state):
    self.__init__(state['path'], state['max_len'])


def store_path(cache_dir: str, key: dict) -> str:
  """Where the store for `key` (every setting it depends on, max_len included) lives."""
  key = dict(key, revision=_REVISION)
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
  return os.path.join(cache_dir, f'packed-L{key["max_len"]}-{digest}.int32')


def load_or_build(
  path: str,
  documents: Iterable[np.ndarray],
  *,
  max_len: int,
  cls_id: int,
  sep_id: int,
  pad_id: int,
  description: dict,
  what: str,
  facts: Optional[Callable[[], dict]] = None,
) -> PackedStore:
  """Opens `path`, or packs `documents` (consumed only when building) and publishes it there.

  Args:
    path: the cache file, from `store_path`.
    documents: token ids of every document, in stored order.
    max_len, cls_id, sep_id, pad_id: as for `packing.pack_blocks`.
    description: written to the `.json` sidecar, for humans.
    what: names the data in error messages, e.g. "dataset 'x' split 'train'".
    facts: called once `documents` is consumed; its dict joins the sidecar (what was learnt
      while packing: counts, the corpus digest).
  """
  if cache_integrity.problem(path) is None:
    return PackedStore(path, max_len)
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  with cache_lock.exclusive_lock(directory, os.path.basename(path)):
    reason = cache_integrity.problem(path)
    if reason is not None:  # Else another process built it while we waited.
      if os.path.exists(path):  # Derived data: damaged means build it again.
        cache_integrity.note_rebuild(path, reason, f'packing {what} again')
      cache_integrity.remove_stale_temporaries(path)
      _build(
        path,
        documents,
        max_len=max_len,
        cls_id=cls_id,
        sep_id=sep_id,
        pad_id=pad_id,
        description=description,
        what=what,
        facts=facts,
      )
  return PackedStore(path, max_len)


def _build(path, documents, *, max_len, cls_id, sep_id, pad_id, description, what, facts) -> None:
  logging.info('Packing %s into %s (one pass over the split).', what, path)
  start = time.monotonic()
  num_rows = num_tokens = checksum = 0
  tmp_path = f'{path}.tmp.{os.getpid()}'
  try:
    with open(tmp_path, 'wb') as f:
      for block in packing.pack_blocks(
        _without_pad(documents, pad_id, what),
        max_len=max_len,
        cls_id=cls_id,
        sep_id=sep_id,
        pad_id=pad_id,
      ):
        data = block.astype(_DTYPE).tobytes()
        f.write(data)
        checksum = zlib.crc32(data, checksum)  # on the way: no second pass over the store
        num_rows += len(block)
        num_tokens += int(np.count_nonzero(block != pad_id))
    if not num_rows:
      raise DataError(f'{what} has zero tokens: nothing to train on.')
    seconds = time.monotonic() - start
    sidecar = dict(
      description,
      **(facts() if facts else {}),
      max_len=max_len,
      rows=num_rows,
      real_tokens=num_tokens,
      build_seconds=round(seconds, 1),
    )
    cache_integrity.publish(tmp_path, path, sidecar, checksum=checksum)
  finally:
    if os.path.exists(tmp_path):
      os.remove(tmp_path)
  logging.info('Packed %d rows (%d real tokens) in %.1f s.', num_rows, num_tokens, seconds)


def _without_pad(documents: Iterable[np.ndarray], pad_id: int, what: str):
  # The input mask is derived as ids != [PAD]: a [PAD] inside a document would break it.
  for ids in documents:
    if (ids == pad_id).any():
      raise DataError(f'{what}: the tokenizer produced [PAD] (id {pad_id}) inside a document.')
    yield ids

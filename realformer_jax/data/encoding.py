"""One encoding job of preparation's worker processes: documents to one flat token stream.

Kept apart from preparation.py so a worker process imports only what a job needs (numpy,
SentencePiece, grain's record source), not TFDS or the training pipeline: a spawned worker's
start-up is its imports.

A job run in a worker (`out_dir` set) hands its token ids back as a file in `out_dir`, not
through the pool's pipe: an 8 MB int32 result pickled, sent in 64 KB pipe writes, reassembled
and unpickled cost ~29 CPU ms in the preparing process and ~20 in the worker, written and read
back as a file ~4 and ~10 (measured, 2026-11-27): ~6 CPU s less per GB of text with workers.
`take_ids(result)` gives the ids either way and removes the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import os
import pickle
import tempfile
from typing import Optional

import numpy as np

from realformer_jax.data.errors import DataError
from realformer_jax.data.tokenizers.base import Tokenizer

_DIGEST = operator.methodcaller('digest')
# A document longer than this is encoded in pieces cut at whitespace: SentencePiece holds ~30
# bytes per byte of the text it encodes at once (1.3 GB for one 40 MB document, measured
# 2026-11-28), so a file of one 200 MB line took 6.9 GB. Packing concatenates the documents'
# ids, and tokens never span whitespace, so the pieces give the document's tokens; a unigram
# model may resolve a near-tie between two segmentations of a word differently in a piece
# than deep inside the whole document (its path scores are float sums from the start).
PIECE_BYTES = 8 << 20
_WHITESPACE = (b' ', b'\n', b'\t', b'\r')


def _encode_in_pieces(tokenizer: Tokenizer, documents: list[bytes]) -> np.ndarray:
  """The ids of `documents` (emptied on the way), a huge one encoded piece by piece: each
  document's text is dropped as its ids are made, so the text and the ids are not both held
  whole."""
  ids = []
  documents.reverse()
  while documents:
    for piece in pieces_of(documents.pop()):
      ids.append(tokenizer.encode_utf8_flat([piece], num_threads=1))
  return np.concatenate(ids) if ids else np.zeros(0, np.int32)


def pieces_of(data: bytes) -> list[bytes]:
  """`data` cut at whitespace into pieces of at most PIECE_BYTES (a piece is longer only where
  PIECE_BYTES hold no whitespace: it then ends at the next)."""
  pieces, start = [], 0
  while len(data) - start > PIECE_BYTES:
    cut = max(data.rfind(w, start + 1, start + PIECE_BYTES) for w in _WHITESPACE)
    if cut < 0:
      after = [i for i in (data.find(w, start + PIECE_BYTES) for w in _WHITESPACE) if i >= 0]
      cut = min(after, default=len(data))
    pieces.append(data[start:cut])
    start = cut
  pieces.append(data[start:])
  return pieces


def text_of(record: dict, text_feature: str) -> str:
  """The text of a record ({'a': {'b': bytes}} for text_feature 'a/b'), decoded."""
  value = record
  for key in text_feature.split('/'):
    value = value[key]
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def contiguous(segments) -> list[tuple]:
  """`segments` ((source, first, stop), ...) with neighbours that continue each other in one
  source joined: a shard holds many small files' documents, and each read opens the shard."""
  joined = []
  for source, first, stop in segments:
    last = joined[-1] if joined else None
    # a shard is named by its path; a TFDS source is one object
    if (
      last
      and (last[0] is source or isinstance(source, str) and last[0] == source)
      and (last[2] == first)
    ):
      joined[-1] = (source, joined[-1][1], stop)
    else:
      joined.append((source, first, stop))
  return joined


def read_texts(source, indices, text_feature: str, shards: Optional[OpenShard] = None) -> list[str]:
  """The texts at `indices` (a range or a list, ascending) of a segment's source: a shard file
  (a path: its records are the UTF-8 texts, read in one call of array_record's reader, ~100x
  faster than record-by-record through grain on a busy machine) or a grain MapDataset of TFDS
  records. `shards`: where a caller reading many times keeps its last shard open."""
  if isinstance(source, str):
    return [d.decode('utf-8') for d in (shards or OpenShard()).read(source, indices)]
  return [text_of(source[i], text_feature) for i in indices]


class OpenShard:
  """Reads shard files, keeping the last one open until the next is read or `close()`: the
  tokenizer sample reads a shard a few documents at a time, thousands of times, and opening
  one costs ~0.18 CPU ms, ten times reading a few documents (the sample's reads took 1.50 CPU s
  on 10,000 files, 0.86 with the shard kept open, measured 2026-12-07). One open at a time: a
  corpus may have thousands of shards. Used without `with` (a one-off read) it closes the
  shard after reading."""

  def __init__(self):
    self.path, self.reader, self.kept = None, None, False

  def __enter__(self):
    self.kept = True
    return self

  def __exit__(self, *_):
    self.close()

  def read(self, path: str, indices) -> list[bytes]:
    from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

    if path != self.path:
      self.close()
      self.reader, self.path = array_record_module.ArrayRecordReader(path), path
    try:
      if isinstance(indices, range) and indices.step == 1:
        return self.reader.read(indices.start, indices.stop) if len(indices) else []
      return self.reader.read(list(indices))
    finally:
      if not self.kept:
        self.close()

  def close(self) -> None:
    if self.reader is not None:
      self.reader.close()
    self.path, self.reader = None, None


def read_utf8(
  source, indices, text_feature: str, shards: Optional[OpenShard] = None
) -> list[bytes]:
  """The UTF-8 bytes of the records at `indices` (ascending): a shard's as stored, a TFDS
  record's encoded. `shards`: as in read_texts."""
  if isinstance(source, str):
    return (shards or OpenShard()).read(source, indices)
  return [t.encode() for t in read_texts(source, indices, text_feature)]


@dataclasses.dataclass(frozen=True)
class EncodeJob:
  # ((source, first, stop), ...): records [first, stop) of each source (read_texts), in order.
  segments: tuple
  tokenizer: Tokenizer
  text_feature: str
  # Where a worker writes the job's ids (a directory the preparing process owns and removes);
  # None: they are returned in the result (the job runs in the preparing process).
  out_dir: Optional[str] = None

  def __reduce__(self):
    # The tokenizer travels as its pickle and a worker unpickles it once, not once per job:
    # loading an 8k SentencePiece model costs ~7 CPU ms, x128 jobs of a 1 GB corpus.
    return (_job, (self.segments, pickle.dumps(self.tokenizer), self.text_feature, self.out_dir))


# In a worker process: the tokenizer of the last job, under the SHA-256 of its pickle (the jobs
# of one preparation share one tokenizer; another one replaces it).
_TOKENIZER: dict[bytes, Tokenizer] = {}


def _job(segments: tuple, tokenizer_pickle: bytes, text_feature: str, out_dir) -> EncodeJob:
  key = hashlib.sha256(tokenizer_pickle).digest()
  if key not in _TOKENIZER:
    _TOKENIZER.clear()
    _TOKENIZER[key] = pickle.loads(tokenizer_pickle)
  return EncodeJob(segments, _TOKENIZER[key], text_feature, out_dir)


def encode(job: EncodeJob) -> dict:
  """The job's documents as one flat int32 token stream (packing concatenates documents, so
  this is all it needs), with its counts and the SHA-256 of each document (the corpus digest of
  a TFDS split hashes them). The documents stay UTF-8 bytes from the shard to the tokenizer
  (`encode_utf8_flat`). One encode thread: `workers` is the number of cores used."""
  encoded = [
    data
    for source, first, stop in contiguous(job.segments)
    for data in read_utf8(source, range(first, stop), job.text_feature)
  ]
  result = {
    'documents': len(encoded),
    'text_bytes': sum(map(len, encoded)),
    # map, not a generator: no Python frame per document.
    'digests': b''.join(map(_DIGEST, map(hashlib.sha256, encoded))),
  }
  if any(len(data) > PIECE_BYTES for data in encoded):
    ids = _encode_in_pieces(job.tokenizer, encoded)
  else:
    ids = job.tokenizer.encode_utf8_flat(encoded, num_threads=1)
  if job.out_dir is None:
    return dict(result, ids=ids)
  try:
    fd, path = tempfile.mkstemp(suffix='.int32', dir=job.out_dir)
    with os.fdopen(fd, 'wb') as f:
      f.write(ids.data)
  except OSError as e:  # the parent removes the directory, with a partly written file
    raise ids_dir_error(job.out_dir, e) from None
  return dict(result, ids_file=path)


def ids_dir_error(directory: str, error: OSError) -> DataError:
  """A temporary directory that cannot take the workers' ids (full, read-only, missing), in
  one line: it is TMPDIR's, not the data_dir's."""
  return DataError(
    f'cannot write the token ids that encoding workers hand back in {directory} '
    f'({error.strerror}): it is in the temporary directory (TMPDIR); free space there, set '
    'TMPDIR to a writable directory with space, or prepare with one worker (--workers=1).'
  )


def take_ids(result: dict) -> np.ndarray:
  """The int32 ids of an `encode` result: returned with it, or read from its file (then
  removed)."""
  if 'ids' in result:
    return result['ids']
  ids = np.fromfile(result['ids_file'], np.int32)
  os.remove(result['ids_file'])
  return ids

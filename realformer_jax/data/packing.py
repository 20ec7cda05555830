"""Packing token streams into fixed-length BERT sequences: [CLS] tokens... [SEP] [PAD]...

Documents are concatenated into one stream and cut every `max_len - 2` tokens, so a sequence
may hold the end of one document and the start of the next, and only the stream's final chunk
is short (padded with [PAD] = 0). No token is dropped or repeated.

`pack_documents` does this eagerly (for the eval split); `PackedSequenceIterDataset` does it
inside a grain pipeline, with the not-yet-emitted tokens in its checkpointable state.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Iterator

import grain
import numpy as np


def make_sequence(body_ids: np.ndarray, *, max_len: int, cls_id: int, sep_id: int,
                  pad_id: int) -> dict[str, np.ndarray]:
  """One sequence from at most max_len - 2 tokens: input_ids, segment_ids, input_mask [L]."""
  num_body = len(body_ids)
  assert num_body <= max_len - 2, (num_body, max_len)
  input_ids_L = np.full(max_len, pad_id, np.int32)
  input_ids_L[0] = cls_id
  input_ids_L[1:num_body + 1] = body_ids
  input_ids_L[num_body + 1] = sep_id
  input_mask_L = np.zeros(max_len, np.int32)
  input_mask_L[:num_body + 2] = 1
  return {
      'input_ids': input_ids_L,
      'segment_ids': np.zeros(max_len, np.int32),  # One segment: no next-sentence pairs.
      'input_mask': input_mask_L,
  }


class TokenChunker:
  """Buffers a token stream and hands it out in chunks of `chunk_len`."""

  def __init__(self, chunk_len: int, pending_ids: Iterable[int] = ()):
    self.chunk_len = chunk_len
    self.pending_ids = np.asarray(list(pending_ids), np.int32)

  def add(self, ids: np.ndarray) -> None:
    if len(ids):
      self.pending_ids = np.concatenate([self.pending_ids, np.asarray(ids, np.int32)])

  def has_full_chunk(self) -> bool:
    return len(self.pending_ids) >= self.chunk_len

  def pop(self) -> np.ndarray:
    """The next chunk: full-length if available, else whatever is pending (maybe empty)."""
    chunk = self.pending_ids[:self.chunk_len]
    self.pending_ids = self.pending_ids[self.chunk_len:]
    return chunk


def pack_documents(documents: Iterable[np.ndarray], *, max_len: int, cls_id: int, sep_id: int,
                   pad_id: int) -> Iterator[dict[str, np.ndarray]]:
  """Yields the packed sequences of a finite list of tokenized documents."""
  chunker = TokenChunker(max_len - 2)
  make = dict(max_len=max_len, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id)
  for ids in documents:
    chunker.add(ids)
    while chunker.has_full_chunk():
      yield make_sequence(chunker.pop(), **make)
  if len(chunker.pending_ids):
    yield make_sequence(chunker.pop(), **make)


class PackedSequenceIterDataset(grain.IterDataset):
  """Packs a stream of token-id arrays (one per document) into sequences of `max_len`."""

  def __init__(self, parent: grain.IterDataset, *, max_len: int, cls_id: int, sep_id: int,
               pad_id: int):
    super().__init__(parent)
    self._make = dict(max_len=max_len, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id)

  def __iter__(self) -> grain.DatasetIterator:
    return _PackedSequenceIterator(self._parent.__iter__(), self._make)

  def __str__(self) -> str:
    return f'PackedSequenceIterDataset(max_len={self._make["max_len"]})'


class _PackedSequenceIterator(grain.DatasetIterator):
  """State: the parent's state plus the tokens read from it but not yet emitted."""

  def __init__(self, parent: grain.DatasetIterator, make: dict[str, int]):
    super().__init__(parent)
    self._make = make
    self._chunker = TokenChunker(make['max_len'] - 2)
    self._parent_exhausted = False

  def __next__(self) -> dict[str, np.ndarray]:
    while not self._chunker.has_full_chunk() and not self._parent_exhausted:
      try:
        self._chunker.add(next(self._parent))
      except StopIteration:
        self._parent_exhausted = True
    chunk = self._chunker.pop()
    if not len(chunk):
      raise StopIteration
    return make_sequence(chunk, **self._make)

  def get_state(self) -> dict[str, Any]:
    return {
        'parent': copy.deepcopy(self._parent.get_state()),
        # Plain ints: the state must be JSON-serialisable for grain's orbax handler.
        'pending_ids': self._chunker.pending_ids.tolist(),
        'parent_exhausted': self._parent_exhausted,
    }

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state['parent'])
    self._chunker = TokenChunker(self._make['max_len'] - 2, state['pending_ids'])
    self._parent_exhausted = state['parent_exhausted']

  def __str__(self) -> str:
    return f'PackedSequenceIterator(max_len={self._make["max_len"]})'

"""Packing token streams into fixed-length BERT sequences: [CLS] tokens... [SEP] [PAD]...

Documents are concatenated into one stream and cut every `max_len - 2` tokens, so a sequence
may hold the end of one document and the start of the next, and only the stream's final chunk
is short (padded with [PAD] = 0). No token is dropped or repeated.

`pack_blocks` does this vectorized, yielding [K, max_len] blocks of token ids (the train split's
packed store is written from it, see store/packed_store.py); `pack_documents` yields the same
sequences one by one with their segment ids and input mask (the eval split).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

# Rows gathered before a block is emitted: bounds memory, keeps numpy calls large.
_ROWS_PER_BLOCK = 1024


def sequence_from_ids(input_ids_L: np.ndarray, *, pad_id: int) -> dict[str, np.ndarray]:
  """input_ids, segment_ids, input_mask [L] of one packed row (real tokens are never [PAD])."""
  return {
    'input_ids': np.asarray(input_ids_L, np.int32),
    'segment_ids': np.zeros(len(input_ids_L), np.int32),  # One segment: no NSP pairs.
    'input_mask': (input_ids_L != pad_id).astype(np.int32),
  }


def pack_blocks(
  documents: Iterable[np.ndarray],
  *,
  max_len: int,
  cls_id: int,
  sep_id: int,
  pad_id: int,
  rows_per_block: int = _ROWS_PER_BLOCK,
) -> Iterator[np.ndarray]:
  """Yields the packed input ids of a finite stream of tokenized documents, int32 [K, L] blocks.

  Row order is stream order; every block but the last has `rows_per_block` rows. A document
  longer than a block is cut into blocks of its own array's views, so memory stays a block
  beyond the documents' ids, however long one is.
  """
  body_len = max_len - 2
  block_tokens = body_len * rows_per_block
  pending, num_pending = [], 0
  for ids in documents:
    ids = np.asarray(ids, np.int32)
    if num_pending + len(ids) < block_tokens:
      if len(ids):
        pending.append(ids)
        num_pending += len(ids)
      continue
    take = block_tokens - num_pending
    rest = ids[take:]
    blocks = [np.concatenate(pending + [ids[:take]])] + [
      rest[start : start + block_tokens]
      for start in range(0, len(rest) - block_tokens + 1, block_tokens)
    ]
    for block in blocks:
      yield _rows(block.reshape(rows_per_block, body_len), max_len, cls_id, sep_id, pad_id)
    rest = rest[(len(blocks) - 1) * block_tokens :]
    pending, num_pending = ([rest] if len(rest) else []), len(rest)
  if num_pending:
    flat = np.concatenate(pending)
    num_rows = len(flat) // body_len
    block = _rows(
      flat[: num_rows * body_len].reshape(num_rows, body_len), max_len, cls_id, sep_id, pad_id
    )
    rest = flat[num_rows * body_len :]
    if len(rest):
      last = np.full((1, max_len), pad_id, np.int32)
      last[0, 0], last[0, 1 : len(rest) + 1], last[0, len(rest) + 1] = cls_id, rest, sep_id
      block = np.concatenate([block, last])
    yield block


def _rows(body_KB: np.ndarray, max_len: int, cls_id: int, sep_id: int, pad_id: int) -> np.ndarray:
  ids_KL = np.full((len(body_KB), max_len), pad_id, np.int32)
  ids_KL[:, 0], ids_KL[:, 1 : max_len - 1], ids_KL[:, max_len - 1] = cls_id, body_KB, sep_id
  return ids_KL


def pack_documents(
  documents: Iterable[np.ndarray], *, max_len: int, cls_id: int, sep_id: int, pad_id: int
) -> Iterator[dict[str, np.ndarray]]:
  """Yields the packed sequences of a finite stream of tokenized documents, one by one."""
  for block in pack_blocks(documents, max_len=max_len, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id):
    for input_ids_L in block:
      yield sequence_from_ids(input_ids_L, pad_id=pad_id)

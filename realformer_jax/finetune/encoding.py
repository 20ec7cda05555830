"""Text (or a text pair) -> BERT's fixed-length input arrays.

    [CLS] a [SEP]            segment 0
    [CLS] a [SEP] b [SEP]    segment 0 up to the first [SEP], 1 after it

A pair longer than max_len loses tokens from the end of the longer side first (BERT's
`_truncate_seq_pair`), so neither side is dropped whole.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from realformer_jax.data import Tokenizer


def truncate_pair(a: np.ndarray, b: Optional[np.ndarray], budget: int):
  """(a, b) cut to at most `budget` tokens together, the longer side losing its tail first."""
  if b is None:
    return a[:budget], None
  len_a, len_b = len(a), len(b)
  while len_a + len_b > budget:
    if len_a > len_b:
      len_a -= 1
    else:
      len_b -= 1
  return a[:len_a], b[:len_b]


def encode_ids(
  tokenizer: Tokenizer, ids_a: np.ndarray, ids_b: Optional[np.ndarray], max_len: int
) -> dict[str, np.ndarray]:
  """input_ids / segment_ids / input_mask [max_len] for token ids of one or two texts."""
  specials = 3 if ids_b is not None else 2
  ids_a, ids_b = truncate_pair(ids_a, ids_b, max_len - specials)
  pieces = [[tokenizer.cls_id], ids_a, [tokenizer.sep_id]]
  segments = [np.zeros(len(ids_a) + 2, np.int32)]
  if ids_b is not None:
    pieces += [ids_b, [tokenizer.sep_id]]
    segments.append(np.ones(len(ids_b) + 1, np.int32))
  ids = np.concatenate([np.asarray(p, np.int32) for p in pieces])
  segment = np.concatenate(segments)
  out = {name: np.zeros(max_len, np.int32) for name in ('input_ids', 'segment_ids', 'input_mask')}
  out['input_ids'][: len(ids)] = ids  # [PAD] = 0 after the text
  out['segment_ids'][: len(ids)] = segment
  out['input_mask'][: len(ids)] = 1
  return out


def encode_texts(
  tokenizer: Tokenizer, texts_a: Sequence[str], texts_b: Optional[Sequence[str]], max_len: int
) -> dict[str, np.ndarray]:
  """Stacked [N, max_len] arrays for N texts (or text pairs)."""
  ids_a = tokenizer.encode_batch(list(texts_a))
  ids_b = tokenizer.encode_batch(list(texts_b)) if texts_b is not None else [None] * len(ids_a)
  rows = [encode_ids(tokenizer, a, b, max_len) for a, b in zip(ids_a, ids_b)]
  if not rows:
    return {
      name: np.zeros((0, max_len), np.int32) for name in ('input_ids', 'segment_ids', 'input_mask')
    }
  return {name: np.stack([row[name] for row in rows]) for name in rows[0]}

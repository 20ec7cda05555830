"""Packing documents into [CLS] ... [SEP] sequences: nothing lost, nothing duplicated."""

import numpy as np

from realformer_jax.data import packing

CLS, SEP, PAD = 2, 3, 0
MAX_LEN = 10  # 8 body tokens per sequence.
MAKE = dict(max_len=MAX_LEN, cls_id=CLS, sep_id=SEP, pad_id=PAD)


def _documents():
  """Distinct token ids, so a lost or duplicated token is visible; includes an empty doc."""
  lengths = [3, 17, 0, 8, 1, 12]
  starts = np.cumsum([0] + lengths)[:-1] + 100
  return [np.arange(s, s + n, dtype=np.int32) for s, n in zip(starts, lengths)]


def _bodies(sequences):
  return [s['input_ids'][1 : s['input_mask'].sum() - 1] for s in sequences]


def _check_sequences(sequences, documents):
  for s in sequences:
    num_real = s['input_mask'].sum()
    assert s['input_ids'].dtype == np.int32 and s['input_ids'].shape == (MAX_LEN,)
    assert s['input_ids'][0] == CLS and s['input_ids'][num_real - 1] == SEP
    # input_mask is a prefix of ones and PAD fills exactly the rest.
    np.testing.assert_array_equal(s['input_mask'], np.arange(MAX_LEN) < num_real)
    assert (s['input_ids'][num_real:] == PAD).all()
    assert not s['segment_ids'].any()
  # Concatenated bodies reproduce the concatenated documents exactly, in order.
  np.testing.assert_array_equal(np.concatenate(_bodies(sequences)), np.concatenate(documents))


def test_pack_documents_keeps_every_token_once():
  documents = _documents()
  sequences = list(packing.pack_documents(documents, **MAKE))
  _check_sequences(sequences, documents)
  assert len(sequences) == 6  # 41 tokens / 8 per sequence → 5 full + 1 partial.
  assert all(s['input_mask'].sum() == MAX_LEN for s in sequences[:-1])
  assert sequences[-1]['input_mask'].sum() == 41 - 40 + 2


def test_blocks_match_one_by_one_packing_whatever_the_block_size():
  documents = _documents()
  expected = np.stack([s['input_ids'] for s in packing.pack_documents(documents, **MAKE)])
  for rows_per_block in (1, 2, 4, 100):
    blocks = list(packing.pack_blocks(documents, rows_per_block=rows_per_block, **MAKE))
    assert all(b.dtype == np.int32 and b.shape[1] == MAX_LEN for b in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks), expected)
  assert not list(packing.pack_blocks([np.zeros(0, np.int32)], **MAKE))  # No tokens, no rows.


def test_exact_multiple_has_no_empty_trailing_sequence():
  documents = [np.arange(5, 21, dtype=np.int32)]  # 16 tokens = 2 full sequences.
  sequences = list(packing.pack_documents(documents, **MAKE))
  assert [s['input_mask'].sum() for s in sequences] == [MAX_LEN, MAX_LEN]

"""Packing documents into [CLS] ... [SEP] sequences: nothing lost, nothing duplicated."""

import json

import grain
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
  return [s['input_ids'][1:s['input_mask'].sum() - 1] for s in sequences]


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


def test_iter_dataset_matches_eager_packing_and_restores_mid_stream():
  documents = _documents()
  stream = grain.MapDataset.source(documents).to_iter_dataset()
  packed = packing.PackedSequenceIterDataset(stream, **MAKE)
  expected = list(packing.pack_documents(documents, **MAKE))
  sequences = list(packed)
  _check_sequences(sequences, documents)
  for got, want in zip(sequences, expected, strict=True):
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])

  iterator = iter(packed)
  next(iterator), next(iterator)  # Leaves tokens of the second document pending.
  state = json.loads(json.dumps(iterator.get_state()))
  assert state['pending_ids']
  rest = list(iterator)
  restored = iter(packed)
  restored.set_state(state)
  for got, want in zip(list(restored), rest, strict=True):
    np.testing.assert_array_equal(got['input_ids'], want['input_ids'])


def test_exact_multiple_has_no_empty_trailing_sequence():
  documents = [np.arange(5, 21, dtype=np.int32)]  # 16 tokens = 2 full sequences.
  sequences = list(packing.pack_documents(documents, **MAKE))
  assert [s['input_mask'].sum() for s in sequences] == [MAX_LEN, MAX_LEN]

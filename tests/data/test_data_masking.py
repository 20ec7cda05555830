"""MLM masking statistics on a large synthetic batch, and the invariants of every slot."""

import numpy as np

from realformer_jax.data import masking

VOCAB = 1000
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
MAX_PREDICTIONS = 20


def _special_tables():
  is_special_V = np.zeros(VOCAB, bool)
  is_special_V[[PAD, UNK, CLS, SEP, MASK]] = True
  return is_special_V, np.flatnonzero(~is_special_V).astype(np.int32)


def _synthetic_sequences(num_sequences, max_len, rng):
  """[CLS] body [SEP] [PAD]... with random lengths; bodies sprinkle in [UNK]s."""
  sequences = np.zeros((num_sequences, max_len), np.int32)
  for row in sequences:
    body_len = rng.integers(1, max_len - 1)
    row[0] = CLS
    row[1 : body_len + 1] = rng.integers(5, VOCAB, body_len)
    row[1 : body_len + 1][rng.random(body_len) < 0.02] = UNK
    row[body_len + 1] = SEP
  return sequences


def _mask_all(sequences, mask_rate=0.15, max_predictions=MAX_PREDICTIONS):
  is_special_V, regular_ids = _special_tables()
  return [
    masking.mask_sequence(
      ids,
      np.random.default_rng([7, i]),
      is_special_V=is_special_V,
      regular_ids=regular_ids,
      mask_id=MASK,
      max_predictions=max_predictions,
      mask_rate=mask_rate,
    )
    for i, ids in enumerate(sequences)
  ]


def test_selection_rate_split_and_slot_invariants():
  rng = np.random.default_rng(0)
  # Length 64: at most 62 candidates → at most 9 selected, so the cap of 20 never binds here.
  sequences = _synthetic_sequences(4000, 64, rng)
  results = _mask_all(sequences)
  is_special_V, _ = _special_tables()

  num_candidates = num_selected = 0
  num_masked = num_random = num_kept = 0
  for original_L, out in zip(sequences, results):
    weights_P = out['masked_weights']
    used = int(weights_P.sum())
    # Weights mark exactly a prefix of used slots; unused slots are all zero.
    np.testing.assert_array_equal(weights_P, (np.arange(MAX_PREDICTIONS) < used).astype(np.float32))
    assert not out['masked_positions'][used:].any() and not out['masked_ids'][used:].any()
    positions = out['masked_positions'][:used]
    assert len(set(positions.tolist())) == used  # No position predicted twice.
    assert not is_special_V[original_L[positions]].any()  # Specials never selected.
    np.testing.assert_array_equal(out['masked_ids'][:used], original_L[positions])
    # Outside the selected positions nothing changes.
    unchanged = np.ones(len(original_L), bool)
    unchanged[positions] = False
    np.testing.assert_array_equal(out['input_ids'][unchanged], original_L[unchanged])

    replaced = out['input_ids'][positions]
    is_mask = replaced == MASK
    is_same = replaced == original_L[positions]
    num_masked += is_mask.sum()
    num_kept += (is_same & ~is_mask).sum()
    num_random += (~is_same & ~is_mask).sum()
    assert not is_special_V[replaced[~is_mask]].any()  # Random tokens are never special.
    num_candidates += (~is_special_V[original_L]).sum()
    num_selected += used
    assert out['input_ids'].dtype == np.int32 and out['masked_weights'].dtype == np.float32

  assert abs(num_selected / num_candidates - 0.15) < 0.01
  # A random replacement equals the original with chance 1/995, counted as "kept": negligible.
  assert abs(num_masked / num_selected - 0.8) < 0.02
  assert abs(num_random / num_selected - 0.1) < 0.015
  assert abs(num_kept / num_selected - 0.1) < 0.015


def test_cap_binds_on_long_sequences():
  sequences = _synthetic_sequences(200, 512, np.random.default_rng(1))
  results = _mask_all(sequences, mask_rate=0.5)
  used = np.array([r['masked_weights'].sum() for r in results])
  assert used.max() == MAX_PREDICTIONS
  lengths = (sequences > 4).sum(axis=1)  # Non-special tokens.
  np.testing.assert_array_equal(
    used, np.minimum(MAX_PREDICTIONS, np.maximum(1, np.round(lengths * 0.5)))
  )


def test_sequence_without_candidates_predicts_nothing():
  ids_L = np.array([CLS, UNK, SEP, PAD], np.int32)
  out = _mask_all(ids_L[None])[0]
  np.testing.assert_array_equal(out['input_ids'], ids_L)
  assert out['masked_weights'].sum() == 0


def test_same_rng_same_mask_different_rng_different_mask():
  ids_L = _synthetic_sequences(1, 128, np.random.default_rng(2))[0]
  is_special_V, regular_ids = _special_tables()
  kwargs = dict(
    is_special_V=is_special_V,
    regular_ids=regular_ids,
    mask_id=MASK,
    max_predictions=MAX_PREDICTIONS,
  )
  a = masking.mask_sequence(ids_L, np.random.default_rng([1, 5]), **kwargs)
  b = masking.mask_sequence(ids_L, np.random.default_rng([1, 5]), **kwargs)
  c = masking.mask_sequence(ids_L, np.random.default_rng([1, 6]), **kwargs)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  assert not np.array_equal(a['masked_positions'], c['masked_positions'])

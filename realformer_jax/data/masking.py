"""BERT masked-LM corruption of one packed sequence.

Of the real, non-special tokens (never [PAD] [UNK] [CLS] [SEP] [MASK]), choose
round(mask_rate * count) (at least 1, at most max_predictions) uniformly without replacement;
each chosen token becomes [MASK] with probability mask_token_rate, a random non-special token
with probability random_token_rate, and stays unchanged otherwise (BERT: 15%, 80/10/10).

The caller passes a Generator seeded per example (e.g. `np.random.default_rng([seed, index])`)
so a sequence's mask depends only on the seed and its index, never on iteration history.
"""

from __future__ import annotations

import numpy as np


def mask_sequence(
  input_ids_L: np.ndarray,
  rng: np.random.Generator,
  *,
  is_special_V: np.ndarray,
  regular_ids: np.ndarray,
  mask_id: int,
  max_predictions: int,
  mask_rate: float = 0.15,
  mask_token_rate: float = 0.8,
  random_token_rate: float = 0.1,
) -> dict:
  """Masks one sequence.

  Args:
    input_ids_L: int32 token ids of one packed sequence (with [CLS], [SEP], [PAD]).
    rng: the example's own generator.
    is_special_V: bool per vocab id; True ids are never chosen.
    regular_ids: ids random replacements are drawn from (the non-special ones).
    mask_id: the [MASK] id.
    max_predictions: P, the number of prediction slots.
    mask_rate, mask_token_rate, random_token_rate: see the module docstring.

  Returns:
    input_ids [L] (corrupted), masked_positions [P], masked_ids [P] (original tokens),
    masked_weights [P] (1.0 in used slots); unused slots hold 0.
  """
  candidates = np.flatnonzero(~is_special_V[input_ids_L])
  if len(candidates):
    # BERT's rule (create_pretraining_data.py): at least one prediction per sequence.
    num_predictions = min(max_predictions, max(1, int(round(len(candidates) * mask_rate))))
  else:
    num_predictions = 0
  positions = np.sort(rng.choice(candidates, num_predictions, replace=False))
  original_ids = input_ids_L[positions]

  action = rng.random(num_predictions)
  replacement_ids = original_ids.copy()
  replacement_ids[action < mask_token_rate] = mask_id
  to_random = (action >= mask_token_rate) & (action < mask_token_rate + random_token_rate)
  replacement_ids[to_random] = rng.choice(regular_ids, int(to_random.sum()))

  corrupted_ids_L = input_ids_L.copy()
  corrupted_ids_L[positions] = replacement_ids
  masked_positions_P = np.zeros(max_predictions, np.int32)
  masked_ids_P = np.zeros(max_predictions, np.int32)
  masked_weights_P = np.zeros(max_predictions, np.float32)
  masked_positions_P[:num_predictions] = positions
  masked_ids_P[:num_predictions] = original_ids
  masked_weights_P[:num_predictions] = 1.0
  return {
    'input_ids': corrupted_ids_L.astype(np.int32),
    'masked_positions': masked_positions_P,
    'masked_ids': masked_ids_P,
    'masked_weights': masked_weights_P,
  }

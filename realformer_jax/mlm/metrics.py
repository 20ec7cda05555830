"""Masked-LM metrics split by what the model saw at each predicted position.

BERT's corruption (data/masking.py) shows the model, at a position it must predict, [MASK]
(80%), the original token unchanged (10%, 'kept') or a random token (10%, 'random'). These are
different problems: at a kept position copying the visible token is right, so the overall
accuracy mixes a copy task into the real one and a model that ignores context can look trained.
The kind of a slot follows from the batch alone: the corrupted input id at the slot's position
is [MASK], the slot's target (kept; also a random draw that happened to pick the original,
which is indistinguishable from it) or another id (random).

`per_row_sums` gives per-sequence sums (for bootstrap intervals over sequences);
`metrics_from_sums` turns sums over any set of rows into metrics; `failed_to_train` is the one
definition of a run that learned nothing beyond a context-free predictor
(realformer_jax/data/baseline.py computes those floors).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

KINDS = ('mask', 'kept', 'random')


def visible_ids(input_ids_BxL: np.ndarray, masked_positions_BxP: np.ndarray) -> np.ndarray:
  """The (corrupted) input id the model saw at each prediction slot, [B, P]."""
  return np.take_along_axis(np.asarray(input_ids_BxL), np.asarray(masked_positions_BxP), 1)


def prediction_kinds(visible_BxP: np.ndarray, targets_BxP: np.ndarray, mask_id: int) -> np.ndarray:
  """Index into KINDS of every slot: 0 [MASK], 1 kept, 2 random."""
  return np.where(visible_BxP == mask_id, 0, np.where(visible_BxP == targets_BxP, 1, 2))


def per_row_sums(
  nll_BxP: np.ndarray,
  correct_BxP: np.ndarray,
  visible_BxP: np.ndarray,
  targets_BxP: np.ndarray,
  weights_BxP: np.ndarray,
  mask_id: int,
) -> dict[str, np.ndarray]:
  """Per-sequence sums [B]: 'loss_sum', 'correct_sum', 'count' over all real predictions and
  '<kind>_loss_sum', '<kind>_correct_sum', '<kind>_count' per kind (float64)."""
  weights = np.asarray(weights_BxP, np.float64)
  nll, correct = np.asarray(nll_BxP, np.float64), np.asarray(correct_BxP, np.float64)
  kinds = prediction_kinds(np.asarray(visible_BxP), np.asarray(targets_BxP), mask_id)
  sums = {
    'loss_sum': (nll * weights).sum(1),
    'correct_sum': (correct * weights).sum(1),
    'count': weights.sum(1),
  }
  for index, kind in enumerate(KINDS):
    w = weights * (kinds == index)
    sums[f'{kind}_loss_sum'] = (nll * w).sum(1)
    sums[f'{kind}_correct_sum'] = (correct * w).sum(1)
    sums[f'{kind}_count'] = w.sum(1)
  return sums


def metrics_from_sums(sums: Mapping[str, np.ndarray | float]) -> dict[str, float]:
  """Loss and accuracy overall and per kind from sums (per-row arrays are summed first).

  'loss' / 'mlm_accuracy' cover every prediction; '<kind>_loss' / '<kind>_accuracy' one kind
  (NaN when the rows hold none of it); '<kind>_predictions' counts them."""
  total = {k: float(np.sum(v)) for k, v in sums.items()}
  ratio = lambda a, b: total[a] / total[b] if total[b] > 0 else float('nan')
  metrics = {
    'loss': ratio('loss_sum', 'count'),
    'mlm_accuracy': ratio('correct_sum', 'count'),
    'predictions': total['count'],
  }
  for kind in KINDS:
    metrics[f'{kind}_accuracy'] = ratio(f'{kind}_correct_sum', f'{kind}_count')
    metrics[f'{kind}_loss'] = ratio(f'{kind}_loss_sum', f'{kind}_count')
    metrics[f'{kind}_predictions'] = total[f'{kind}_count']
  return metrics


def failed_to_train(eval_loss: float | None, floors: Mapping[str, float]) -> bool:
  """A run failed to train when its eval loss is not below the copy-aware unigram loss: the
  cross-entropy of the best predictor that sees only the token at the predicted position
  (`floors['copy_unigram_loss']`, data/baseline.py). A diverged run (no loss) failed too."""
  if eval_loss is None or not np.isfinite(eval_loss):
    return True
  return bool(eval_loss >= floors['copy_unigram_loss'])


def below_floors(
  eval_loss: float | None, mask_accuracy: float | None, floors: Mapping[str, float]
) -> list:
  """What puts a run's final evaluation at or below the context-free floors, in words (empty:
  it learned): its eval loss not below the copy-aware unigram loss (failed_to_train), its
  [MASK] accuracy not above the most frequent token's (None: an eval set without a [MASK]
  slot, judged by its loss alone)."""
  reasons = []
  if failed_to_train(eval_loss, floors):
    reasons.append(
      f'eval loss not below the copy-aware unigram loss {floors["copy_unigram_loss"]:.4f}'
    )
  if mask_accuracy is not None and not mask_accuracy > floors['mask_accuracy']:
    reasons.append(
      f"[MASK] accuracy not above the most frequent token's {floors['mask_accuracy']:.4f}"
    )
  return reasons

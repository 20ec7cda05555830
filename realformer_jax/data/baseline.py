"""What a masked-LM model scores without using context: the floors a trained model must beat.

The floors are scored on exactly the eval sequences and masks the eval iterator yields (the
first `eval_batches * global_batch_size` when both are set; the whole split otherwise). The
predictors are what a model can learn without context: token frequencies of the train split
(add-one smoothed over the ids masking can choose, so every eval target has a probability).

  most frequent token   always predict the train split's most frequent token; in English
                        prose ',' or 'the' alone is several percent of the targets.
  copy-aware            see only the token at the predicted position: copy it when it is
                        visible (kept or randomly replaced), predict the most frequent token
                        at [MASK]. Under BERT's 80/10/10 corruption the kept 10% of the slots
                        are free points for it, with no context at all.

and the copy-aware unigram loss, the cross-entropy of the best context-free predictor: at
[MASK] the target unigram distribution u; at a visible token x the posterior of the target
under the corruption rule, p(y | x) = (k u(x) [y = x] + r u(y) / R) / (k u(x) + r / R), with
k and r the keep and random-replacement rates and R the number of ids random tokens are drawn
from (data/masking.py). A model whose eval loss is not below it learned nothing a context-free
predictor cannot (realformer_jax/mlm/metrics.py: `failed_to_train`).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from realformer_jax.data import config as config_lib
from realformer_jax.data import pipeline, preparation


def most_frequent_token_baseline(
  data_config: config_lib.DataConfig, global_batch_size: int | None = None
) -> float:
  """Accuracy of always predicting the eval split's most frequent masked target (an oracle:
  it reads the eval labels; `context_free_floors` uses the train split's frequencies)."""
  sequences = pipeline.eval_sequences(data_config, global_batch_size)
  targets = sequences['masked_ids'][sequences['masked_weights'] > 0]
  return float(np.bincount(targets).max() / len(targets))


def train_unigram(data_config: config_lib.DataConfig | Mapping) -> np.ndarray:
  """[V] token probabilities of the train split over the ids masking can choose (the others
  0), add-one smoothed."""
  data_config = config_lib.data_config(data_config)
  tokenizer = preparation.prepare(data_config)
  store = preparation.packed_train_store(data_config)
  counts = np.zeros(tokenizer.vocab_size, np.float64)
  for start in range(0, len(store), 4096):  # the store is memory-mapped: read it in blocks
    ids = store.rows(np.arange(start, min(start + 4096, len(store))))
    counts += np.bincount(ids.ravel(), minlength=tokenizer.vocab_size)[: tokenizer.vocab_size]
  counts = np.where(tokenizer.is_special_V, 0.0, counts + 1.0)
  return counts / counts.sum()


def context_free_floors(
  data_config: config_lib.DataConfig | Mapping, global_batch_size: int | None = None
) -> dict[str, float]:
  """The floors of the eval set `data_config` (and the batch size) defines; see `floors`."""
  data_config = config_lib.data_config(data_config)
  sequences = pipeline.eval_sequences(data_config, global_batch_size)
  tokenizer = preparation.prepare(data_config)
  visible = np.take_along_axis(sequences['input_ids'], sequences['masked_positions'], 1)
  keep_rate = 1.0 - data_config.mask_token_rate - data_config.random_token_rate
  return floors(
    visible,
    sequences['masked_ids'],
    sequences['masked_weights'],
    train_unigram(data_config),
    mask_id=tokenizer.mask_id,
    num_random_ids=len(tokenizer.regular_ids),
    keep_rate=keep_rate,
    random_rate=data_config.random_token_rate,
  )


def floors(
  visible_NxP: np.ndarray,
  targets_NxP: np.ndarray,
  weights_NxP: np.ndarray,
  unigram_V: np.ndarray,
  *,
  mask_id: int,
  num_random_ids: int,
  keep_rate: float,
  random_rate: float,
) -> dict[str, float]:
  """Context-free floors of a set of prediction slots.

  Args:
    visible_NxP: the (corrupted) input id at each slot's position.
    targets_NxP: the original ids; weights_NxP: 1 for real slots, 0 for unused ones.
    unigram_V: the predictors' token probabilities u (nonzero at every target).
    mask_id, num_random_ids, keep_rate, random_rate: the corruption rule.

  Returns:
    'mlm_accuracy' / 'mask_accuracy': the most probable token's accuracy over all slots / at
    [MASK]; 'copy_accuracy': the copy-aware rule's accuracy over all slots (at [MASK] it is
    'mask_accuracy'); 'copy_unigram_loss' / 'mask_unigram_loss': the best context-free
    cross-entropy (nats) over all slots / at [MASK].
  """
  real = np.asarray(weights_NxP) > 0
  visible, targets = np.asarray(visible_NxP)[real], np.asarray(targets_NxP)[real]
  at_mask = visible == mask_id
  unigram = np.asarray(unigram_V, np.float64)
  most_frequent = int(np.argmax(unigram))
  predicted = np.where(at_mask, most_frequent, visible)
  # Visible x: the target is x (kept, or a random draw of x itself) or any y (random).
  seen = keep_rate * unigram[visible] + random_rate / num_random_ids
  p_visible = (
    keep_rate * unigram[visible] * (targets == visible)
    + random_rate * unigram[targets] / num_random_ids
  ) / seen
  nll = -np.log(np.where(at_mask, unigram[targets], p_visible))
  # NaN, without numpy's warning, where there is no slot (an eval set without a [MASK] slot).
  mean = lambda x: float(np.mean(x)) if np.size(x) else float('nan')
  return {
    'mlm_accuracy': float(np.mean(targets == most_frequent)),
    'mask_accuracy': mean(targets[at_mask] == most_frequent),
    'copy_accuracy': float(np.mean(predicted == targets)),
    'copy_unigram_loss': float(np.mean(nll)),
    'mask_unigram_loss': mean(nll[at_mask]),
  }

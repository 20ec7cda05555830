"""MLM metrics by kind of predicted position, the context-free floors, and the one definition of
"failed to train": against hand computations and a simulation of BERT's corruption."""

import math

import jax
import numpy as np
import pytest
from train_fixtures import tiny_config

from realformer_jax import MaskedLM, data, train
from realformer_jax.data.baseline import floors
from realformer_jax.mlm import metrics as mlm_metrics

MASK = 4


def test_kinds_and_sums_by_hand():
  input_ids = np.array([[2, MASK, 7, 9, 3], [2, 8, MASK, 6, 3]])
  positions = np.array([[1, 2, 3], [2, 1, 0]])
  targets = np.array([[5, 7, 8], [6, 8, 0]])  # row 0: [MASK], kept 7, random 9 (target 8)
  weights = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # row 1: [MASK], kept; a free slot
  nll = np.array([[1.0, 0.5, 3.0], [2.0, 0.25, 9.0]])
  correct = np.array([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
  visible = mlm_metrics.visible_ids(input_ids, positions)
  np.testing.assert_array_equal(visible, [[MASK, 7, 9], [MASK, 8, 2]])
  np.testing.assert_array_equal(
    mlm_metrics.prediction_kinds(visible, targets, MASK), [[0, 1, 2], [0, 1, 2]]
  )
  sums = mlm_metrics.per_row_sums(nll, correct, visible, targets, weights, MASK)
  np.testing.assert_allclose(sums['loss_sum'], [4.5, 2.25])
  np.testing.assert_allclose(sums['mask_loss_sum'], [1.0, 2.0])
  np.testing.assert_allclose(sums['random_count'], [1.0, 0.0])  # the free slot is not counted
  metrics = mlm_metrics.metrics_from_sums(sums)
  assert metrics['loss'] == pytest.approx(6.75 / 5)
  assert metrics['mlm_accuracy'] == pytest.approx(3 / 5)
  assert metrics['mask_accuracy'] == 0.5 and metrics['mask_loss'] == 1.5
  assert metrics['kept_accuracy'] == 1.0 and metrics['random_loss'] == 3.0
  assert (
    metrics['mask_predictions'] + metrics['kept_predictions'] + metrics['random_predictions']
    == metrics['predictions']
    == 5
  )


def test_floors_by_hand():
  unigram = np.array([0, 0, 0, 0, 0, 0.5, 0.3, 0.2])  # ids 0-4 special
  visible = np.array([[MASK, MASK, 6, 7]])
  targets = np.array([[5, 6, 6, 5]])  # [MASK]; [MASK]; kept 6; random 7 over a 5
  weights = np.ones((1, 4))
  got = floors(
    visible,
    targets,
    weights,
    unigram,
    mask_id=MASK,
    num_random_ids=3,
    keep_rate=0.1,
    random_rate=0.1,
  )
  assert got['mlm_accuracy'] == 0.5 and got['mask_accuracy'] == 0.5
  assert got['copy_accuracy'] == 0.5  # [MASK] -> 5 right once; copies 6 right, 7 wrong
  # p(6 | 6) = (0.1*0.3 + 0.1*0.3/3) / (0.1*0.3 + 0.1/3); p(5 | 7) = (0.1*0.5/3) / (0.1*0.2 + 0.1/3)
  p_kept = (0.03 + 0.01) / (0.03 + 0.1 / 3)
  p_random = (0.05 / 3) / (0.02 + 0.1 / 3)
  expected = -(math.log(0.5) + math.log(0.3) + math.log(p_kept) + math.log(p_random)) / 4
  assert got['copy_unigram_loss'] == pytest.approx(expected)
  assert got['mask_unigram_loss'] == pytest.approx(-(math.log(0.5) + math.log(0.3)) / 2)


def test_copy_aware_unigram_loss_is_the_best_context_free_cross_entropy():
  # Simulate BERT's corruption of unigram targets; the empirical conditional entropy of the
  # target given the visible token (the best any context-free predictor can do, estimated
  # from 400k slots) must equal the formula's expected loss.
  rng = np.random.default_rng(0)
  regular = np.arange(5, 11)
  unigram = np.zeros(11)
  unigram[regular] = [0.4, 0.2, 0.15, 0.1, 0.1, 0.05]
  n = 400_000
  targets = rng.choice(11, n, p=unigram)
  action = rng.random(n)
  visible = np.where(action < 0.8, MASK, np.where(action < 0.9, rng.choice(regular, n), targets))
  got = floors(
    visible[None],
    targets[None],
    np.ones((1, n)),
    unigram,
    mask_id=MASK,
    num_random_ids=len(regular),
    keep_rate=0.1,
    random_rate=0.1,
  )
  joint = np.zeros((11, 11))
  np.add.at(joint, (visible, targets), 1.0)
  conditional = joint / joint.sum(1, keepdims=True).clip(1)
  empirical = -np.mean(np.log(conditional[visible, targets]))
  assert got['copy_unigram_loss'] == pytest.approx(empirical, abs=5e-3)
  # Ignoring the visible token (the plain unigram) is worse.
  assert -np.mean(np.log(unigram[targets])) > got['copy_unigram_loss'] + 0.05
  assert got['copy_accuracy'] == pytest.approx(0.8 * 0.4 + 0.1 + 0.1 / 6, abs=5e-3)


def test_failed_to_train_is_the_copy_aware_unigram_loss():
  floor = {'copy_unigram_loss': 5.2}
  assert mlm_metrics.failed_to_train(5.3, floor)
  assert mlm_metrics.failed_to_train(5.2, floor)
  assert not mlm_metrics.failed_to_train(5.1, floor)
  assert mlm_metrics.failed_to_train(None, floor) and mlm_metrics.failed_to_train(math.nan, floor)


@pytest.mark.slow
def test_training_loop_eval_reports_kinds_and_floors(tmp_path, capsys):
  config = tiny_config(train__num_train_steps=4, train__eval_every_steps=4)
  result = train.train_and_evaluate(config, str(tmp_path))
  floors_now = data.context_free_floors(config.data, config.train.global_batch_size)
  for name, value in floors_now.items():
    assert result[f'baseline/{name}'] == pytest.approx(value)
  assert result['baseline'] == result['baseline/mlm_accuracy']
  scalars = train.read_scalars(str(tmp_path))
  assert scalars['eval/baseline_copy_unigram_loss'][0][1] == pytest.approx(
    floors_now['copy_unigram_loss']
  )

  # The loop's split, recomputed from the model's own logits on the eval batches.
  run = train.load_workdir(str(tmp_path))
  model = MaskedLM(run.model_config)
  hits = {kind: [] for kind in mlm_metrics.KINDS}
  for batch in data.make_eval_iterator(config.data, config.train.global_batch_size):
    logits = jax.device_get(
      model.apply(
        {'params': run.params},
        batch['input_ids'],
        batch['input_mask'],
        batch['segment_ids'],
        batch['masked_positions'],
      )
    )
    for b, p in zip(*np.nonzero(batch['masked_weights'])):
      seen = batch['input_ids'][b, batch['masked_positions'][b, p]]
      kind = (
        'mask'
        if seen == run.tokenizer.mask_id
        else 'kept'
        if seen == batch['masked_ids'][b, p]
        else 'random'
      )
      hits[kind].append(np.argmax(logits[b, p]) == batch['masked_ids'][b, p])
  for kind, values in hits.items():
    assert result[f'eval/{kind}_predictions'] == len(values)
    if values:
      assert result[f'eval/{kind}_accuracy'] == pytest.approx(np.mean(values))
  assert len(hits['mask']) > len(hits['kept'])
  out = capsys.readouterr().out
  assert 'at [MASK]' in out and 'copy-aware unigram loss' in out

"""The depth plan (realformer_jax/studies/plans/depth.py) on fabricated results: its runs in order,
the trend
T = gap(24) - gap(6) against the formula written out, the recipe check that keeps depths
apart, and the report's one-draw column."""

import numpy as np
import pytest

from realformer_jax.studies import analysis, plan_report
from realformer_jax.studies.plans import depth

PLAN = depth.PLANS['cpu']
FLOORS = {'copy_unigram_loss': 5.29, 'mask_accuracy': 0.0687}


def _names(results=None) -> list[str]:
  return [run.name for run in PLAN.runs(results or {})]


def test_the_plan_trains_both_depths_seed_by_seed_and_reuses_the_committed_12_layer_runs():
  names = _names()
  assert names[:4] == [
    'L6-b4800-lr0.002-realformer-s2',
    'L6-b4800-lr0.002-post-s2',
    'L24-b4800-lr0.002-realformer-s2',
    'L24-b4800-lr0.002-post-s2',
  ]
  assert len(names) == 4 * 6 + 2 * 6 + 2 * 6
  # budgets' committed runs (no tag) come before the reruns (L12-), which are last.
  assert names[24:26] == ['b4800-lr0.002-realformer-s2', 'b4800-lr0.002-post-s2']
  assert names[-1] == 'L12-b4800-lr0.002-post-s7'
  params = {run.name: run.params for run in PLAN.runs({})}
  assert params['L24-b4800-lr0.002-post-s3']['model'] == {'num_layers': 24}
  assert 'model' not in params['L12-b4800-lr0.002-post-s3']  # the committed runs' recipe
  assert PLAN.scale.eval_mask_draws == 4 and PLAN.scale.steps == 4800


def _scored(rng, count, base: float) -> dict:
  correct = rng.binomial(count.astype(int), base).astype(float)
  sums = {'count': count, 'correct_sum': correct, 'mask_count': count, 'mask_correct_sum': correct}
  # Draw 0's sums: another draw masks other positions, so another count and correct sum.
  first = {k: np.floor(v / 2) for k, v in sums.items()}
  return {
    'sequence_sums': {k: v.tolist() for k, v in sums.items()},
    'first_draw_sequence_sums': {k: v.tolist() for k, v in first.items()},
  }


def _fabricated():
  rng = np.random.default_rng(0)
  count = rng.integers(4, 20, 300).astype(float)
  accuracy = {'realformer': 0.40, 'post': 0.41}
  results = {}
  for seed in range(2, 8):
    for layers, shift in ((6, 0.0), (24, 0.02)):
      for layout in ('realformer', 'post'):
        base = accuracy[layout] + (shift if layout == 'realformer' else 0.0)
        results[f'L{layers}-b4800-lr0.002-{layout}-s{seed}'] = {
          'final': {'mask_accuracy': base, 'loss': 4.0},
          'floors': FLOORS,
          'learned': True,
          'params': {'seed': seed, 'layout': layout, 'model': {'num_layers': layers}},
          'scored': _scored(rng, count, base + 0.003 * seed),
        }
  return results, count


def _gap(results, layers, seed, key='sequence_sums'):
  """RealFormer - Post-LN at `layers` for `seed`: correct over count, all positions."""
  sums = lambda layout, field: np.sum(
    results[f'L{layers}-b4800-lr0.002-{layout}-s{seed}']['scored'][key][field]
  )
  return (sums('realformer', 'correct_sum') - sums('post', 'correct_sum')) / sums('post', 'count')


def test_a_runs_cost_grows_with_its_layers():
  """The grid ETA weighs the runs left by their cost: a 24-layer run's steps cost 4x a 6-layer
  run's (as their times on one core: ~70 and ~17 minutes), the committed 12-layer runs' 2x."""
  cost = {run.name: run.cost for run in PLAN.runs({})}
  assert cost['L24-b4800-lr0.002-post-s2'] == 4 * cost['L6-b4800-lr0.002-post-s2'] == 2 * 4800
  assert cost['L12-b4800-lr0.002-post-s2'] == cost['b4800-lr0.002-post-s2'] == 4800


def test_the_trend_is_the_gap_at_24_layers_minus_the_gap_at_6_seed_by_seed():
  results, _ = _fabricated()
  rows = {row['key']: row for row in analysis.analyse(PLAN, results)['comparisons']}
  t = rows['T']
  expected = [_gap(results, 24, s) - _gap(results, 6, s) for s in range(2, 8)]
  assert t['comparison']['values'] == pytest.approx(expected)
  assert t['comparison']['mean'] == pytest.approx(np.mean(expected))
  assert (
    t['family'] == '' and t['metric'] == 'accuracy' and t['verdict'] in ('holds', 'inconclusive')
  )
  gap24 = [_gap(results, 24, s) for s in range(2, 8)]
  assert rows['S1']['comparison']['values'] == pytest.approx(gap24)
  assert {rows[k]['family'] for k in ('S1', 'S2', 'S3')} == {'S'}
  assert rows['R1']['verdict'] == 'pending (0 of 6 seeds)'  # the reruns have not run
  # Draw 0's sums give the one-draw figure beside it.
  halves = [_gap(results, 24, s, 'first_draw_sequence_sums') for s in range(2, 8)]
  halves = [
    h - _gap(results, 6, s, 'first_draw_sequence_sums') for h, s in zip(halves, range(2, 8))
  ]
  assert t['first_draw']['values'] == pytest.approx(halves)


def test_a_trend_is_not_testable_when_either_gap_sits_between_two_floors():
  results, _ = _fabricated()
  for name, run in results.items():
    if name.startswith('L6-'):
      run['learned'] = False
  rows = {row['key']: row for row in analysis.analyse(PLAN, results)['comparisons']}
  assert rows['T']['verdict'] == 'not testable at this scale'
  assert rows['S1']['verdict'] != 'not testable at this scale'  # 24 layers learned


def test_the_recipe_check_keeps_depths_apart_and_pairs_a_rerun_with_its_run():
  run = lambda loss, **model: {
    'train_loss': [[1, loss]],
    'params': {'layout': 'post', 'seed': 2, **({'model': model} if model else {})},
  }
  check = analysis.recipe_check(
    {
      'b4800-lr0.002-post-s2': run(7.60),
      'L12-b4800-lr0.002-post-s2': run(7.60),
      'L6-b4800-lr0.002-post-s2': run(7.58, num_layers=6),
      'L24-b4800-lr0.002-post-s2': run(7.65, num_layers=24),
    }
  )
  assert check['per']['post-s2'] == {'runs': 2, 'spread': 0.0}
  assert set(check['per']) == {'post-s2', 'post-s2-num_layers=6', 'post-s2-num_layers=24'}
  assert not check['beyond']


def test_the_report_names_the_trend_and_sets_one_draw_beside_four():
  results, _ = _fabricated()
  lines = plan_report._comparisons(PLAN, analysis.analyse(PLAN, results))
  text = '\n'.join(lines)
  assert (
    '| T | gap(24) - gap(6), all positions | all positions | (RealFormer L24 0.002 x 4,800 / '
    'Post-LN L24 0.002 x 4,800) - (RealFormer L6 0.002 x 4,800 / Post-LN L6 0.002 x 4,800) |'
  ) in text
  assert 'Held-out resolution' in text and '| T | ' in text.split('Held-out resolution')[1]


def test_the_recipe_line_counts_each_depths_parameters():
  # One layer at hidden 64, FFN 256, written out: Q, K, V, O (64 x 64 + 64 each), the FFN's two
  # matrices and biases, two LayerNorms' scale and bias.
  layer = 4 * (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64) + 2 * (2 * 64)
  twelve = plan_report.parameters(PLAN.scale)
  line = next(
    line for line in plan_report._setup(PLAN, {}, {'floors': {}}, 'CMD') if 'Recipe' in line
  )
  assert (
    f'; {twelve:,} parameters (L6: num_layers 6, {twelve - 6 * layer:,} parameters; '
    f'L24: num_layers 24, {twelve + 12 * layer:,} parameters).'
  ) in line

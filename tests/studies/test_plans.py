"""realformer_jax/studies/plan.py and realformer_jax/studies/analysis.py on fabricated results (no
training): which runs each
declared plan lists, in which order, when its rules decide (best rates with ties, diverged
runs and the extension rung, the flattening gain, the extension of a ladder), the rules per run,
Holm families, pending verdicts and the failure test."""

import math
import os

import pytest

from realformer_jax.studies import analysis, stats, study
from realformer_jax.studies.plans import budgets, layouts, stability, tuned_rates

BUDGETS = budgets.PLANS['cpu']
LADDER = stability.PLANS['cpu']
TUNED = tuned_rates.PLANS['cpu']
LAYOUTS = layouts.PLANS['cpu']
FLOORS = {'copy_unigram_loss': 5.29, 'mask_accuracy': 0.0687}


def _result(accuracy: float, seed: int = 0) -> dict:
  return {'final': {'mask_accuracy': accuracy}, 'learned': True, 'params': {'seed': seed}}


def _names(plan, results) -> list[str]:
  return [run.name for run in plan.runs(results)]


# ------------------------------------------------------------------------------------------
# The budgets plan.


def test_budgets_the_rate_check_comes_first_and_decides_the_rate():
  first = _names(BUDGETS, {})
  assert first == [
    f'b2400-lr{rate:g}-post-s{seed}' for rate in (0.002, 0.001, 0.004) for seed in (0, 1)
  ]
  # 4e-3 wins at 2,400 steps: every later run uses it, the longest budget first.
  results = {name: _result(0.30 if 'lr0.004' in name else 0.25) for name in first}
  later = _names(BUDGETS, results)[len(first) :]
  assert all('-lr0.004-' in name for name in later)
  assert later[:4] == [  # Post-LN at 4e-3, seeds 0 and 1, is the rate check's: reused
    'b2400-lr0.004-realformer-s0',
    'b2400-lr0.004-realformer-s1',
    'b2400-lr0.004-realformer-s2',
    'b2400-lr0.004-post-s2',
  ]
  steps = [int(name.split('-')[0][1:]) for name in later]
  assert steps == sorted(steps, reverse=True) and set(steps) == {2400, 1200, 600, 300}
  assert len(later) == 3 * 2 * 8 + 8 - 2


def test_best_rate_ties_choose_the_smaller_rate_and_a_diverged_run_scores_zero():
  results = {name: _result(0.25) for name in _names(BUDGETS, {})}
  results['b2400-lr0.001-post-s0'] = {'diverged_at_step': 900}  # no 'final': scores 0
  assert BUDGETS.rate('r_L', results) == 0.002
  del results['b2400-lr0.004-post-s1']  # undecided until every run of the grid finished
  assert BUDGETS.rate('r_L', results) is None


def _budget_results(accuracies: dict) -> dict:
  results = {name: _result(0.25) for name in _names(BUDGETS, {})}
  for steps, accuracy in accuracies.items():
    for layout in ('post', 'realformer'):
      for seed in range(8):
        results[BUDGETS.run_name(layout, 0.002, steps, seed)] = _result(accuracy, seed)
  return results


def test_budgets_a_longer_budget_only_when_the_curves_have_not_flattened():
  results = _budget_results({2400: 0.30, 1200: 0.295, 600: 0.2, 300: 0.1})
  assert BUDGETS.rule('longer').describe(BUDGETS, results)['gain'] == pytest.approx(0.005)
  assert BUDGETS.condition('longer', results) is False
  assert not any(name.startswith('b4800') for name in _names(BUDGETS, results))
  for seed in range(8):  # doubling to 2,400 still gains 1.5 points: 4,800 joins the plan
    for layout in ('post', 'realformer'):
      results[BUDGETS.run_name(layout, 0.002, 1200, seed)] = _result(0.285, seed)
  assert BUDGETS.condition('longer', results) is True
  assert sum(name.startswith('b4800') for name in _names(BUDGETS, results)) == 16


def test_budgets_the_longer_budget_is_pending_until_every_run_finished():
  results = _budget_results({2400: 0.31, 1200: 0.27})
  del results['b1200-lr0.002-realformer-s1']
  longer = BUDGETS.rule('longer').describe(BUDGETS, results)
  assert longer['value'] is None and longer['gain'] == pytest.approx(0.04)
  assert (longer['finished_runs'], longer['planned_runs']) == (31, 32)
  rows = analysis.analyse(BUDGETS, results)['comparisons']
  pending = [r for r in rows if r['b']['steps'] == 4800 and r['family'] == 'budgets']
  assert [r['verdict'] for r in pending] == ['pending (0 of 8 seeds)'] * 2
  assert all(r['holm_p_value'] == 1.0 for r in pending)  # members, counted at p = 1
  results['b1200-lr0.002-realformer-s1'] = _result(0.27, 1)
  results['b4800-lr0.002-post-s0'] = _result(0.36)
  longer = BUDGETS.rule('longer').describe(BUDGETS, results)
  assert longer['value'] is True and longer['gain_after'] == pytest.approx(0.05)
  assert not longer['after_complete']
  from realformer_jax.studies import plan_report  # pylint: disable=import-outside-toplevel

  assert 'the longer budget is required' in plan_report.gain_line('longer', longer)


# ------------------------------------------------------------------------------------------
# The stability plan: the ladder, the rules per run, the failure test, P2.


def _fake(*, learned=True, diverged_at=None, losses=None, final_loss=None, seed=0, layout='post'):
  """A finished run's result: learned, stuck on the unigram plateau, or non-finite."""
  if losses is None:
    losses = [7.6, 5.0, 3.4] if learned else [7.6, 5.8, 5.8]
  run = {
    'diverged_at_step': diverged_at,
    'train_loss': [[1 + 1200 * i, v] for i, v in enumerate(losses)],
    'floors': FLOORS,
    'params': {'seed': seed, 'layout': layout},
    'learned': False,
  }
  if diverged_at is None:
    loss = final_loss if final_loss is not None else losses[-1]
    run['final'] = {'loss': loss, 'mask_accuracy': 0.30 if learned else 0.0687}
    run['learned'] = study.learned(run)
  return run


def test_stability_runs_the_ladder_first_and_reuses_the_committed_runs():
  names = _names(LADDER, {})
  assert names[:4] == [
    'b2400-lr0.008-realformer-s0',
    'b2400-lr0.008-post-s0',
    'b2400-lr0.008-realformer-s1',
    'b2400-lr0.008-post-s1',
  ]
  rates = [name.split('-')[1] for name in names]
  assert rates == sorted(rates, key=['lr0.008', 'lr0.016', 'lr0.004', 'lr0.002'].index)
  assert len(names) == 4 * 2 * 4
  committed = {f[: -len('.json')] for f in os.listdir(os.path.join(budgets.STORE, 'runs'))}
  assert set(names) <= committed and LADDER.scale == BUDGETS.scale


def test_stability_the_extension_joins_only_if_post_ln_learned_everywhere():
  results = {name: _fake() for name in _names(LADDER, {})}
  assert sum('lr0.032' in name for name in _names(LADDER, results)) == 8
  results['b2400-lr0.016-post-s2'] = _fake(learned=False)
  assert LADDER.condition('extend', results) is False
  assert not any('lr0.032' in name for name in _names(LADDER, results))
  del results['b2400-lr0.016-post-s2']  # undecided until every Post-LN ladder run finished
  assert LADDER.condition('extend', results) is None


def test_the_rules_per_run():
  outcome = LADDER.outcome
  line = math.log(2000) + 1.0
  learned = outcome(_fake())
  assert learned['learned'] and not learned['failed'] and not learned['diverged']
  plateau = outcome(_fake(learned=False))  # the unigram plateau: fails without diverging
  assert plateau['failed'] and not plateau['diverged']
  nan = outcome(_fake(diverged_at=700, losses=[7.6, 6.0]))
  assert nan['diverged'] and nan['failed'] and nan['non_finite_at_step'] == 700
  # A finite explosion: it ends above ln(vocab) + 1 nat (train or eval), with finite losses.
  blown = outcome(_fake(losses=[7.6, 5.0, line + 0.1]))
  assert blown['diverged'] and blown['blew_up'] and blown['failed'] and not blown['learned']
  assert outcome(_fake(losses=[7.6, 5.0, 5.8], final_loss=9.0))['blew_up']
  spike = outcome(_fake(losses=[7.6, 12.0, 3.4]))  # recovered: reported, not a divergence
  assert spike['spiked'] and not spike['diverged'] and spike['learned']


def _ladder(post_fails_at, both_fail_at, seeds=(0, 1, 2, 3)):
  results = {}
  for name in _names(LADDER, {}):
    rate, layout, seed = float(name.split('-')[1][2:]), name.split('-')[2], int(name[-1])
    fails = rate in both_fail_at or (rate in post_fails_at and layout == 'post')
    results[name] = _fake(learned=not fails, seed=seed, layout=layout)
  return results


def _rows(plan, results) -> dict:
  out = analysis.analyse(plan, results)
  return {row['key']: row for row in out['comparisons']} | {'': out}


def test_stability_verdicts_from_fabricated_results():
  rows = _rows(LADDER, _ladder(post_fails_at={0.008}, both_fail_at={0.016}))
  assert rows['S@0.008']['failures']['p_value'] == pytest.approx(1 / 128)
  assert rows['S@0.008']['holm_p_value'] == pytest.approx(3 / 128)  # the smallest of three
  assert rows['S@0.008']['verdict'] == 'holds'
  assert rows['S@0.016']['verdict'] == 'no difference: every run failed'
  assert rows['S@0.004']['verdict'] == 'no difference: every run learned'
  assert rows['']['conclusions'] == {'P2': 'holds'}
  mirror = _ladder(post_fails_at=set(), both_fail_at=set())  # RealFormer fails where Post-LN
  for seed in range(4):  # trains: the mirror verdict (the extension rung learned)
    mirror[f'b2400-lr0.016-realformer-s{seed}'] = _fake(
      learned=False, seed=seed, layout='realformer'
    )
  mirror.update(
    {
      n: _fake(seed=int(n[-1]), layout=n.split('-')[2])
      for n in _names(LADDER, mirror)
      if n not in mirror
    }
  )
  assert _rows(LADDER, mirror)['']['conclusions'] == {'P2': 'does not hold'}
  # Post-LN learned everywhere: the extension joins the plan; until it ran, P2 is pending.
  rows = _rows(LADDER, _ladder(set(), set()))
  assert rows['S@0.032']['verdict'] == 'pending (0 of 4 seeds)'
  assert rows['']['conclusions'] == {'P2': 'pending (3 of 4 rates complete)'}


def test_a_cell_with_missing_seeds_is_pending_never_a_verdict():
  results = _ladder(post_fails_at={0.008}, both_fail_at=set())
  del results['b2400-lr0.008-realformer-s3']
  rows = _rows(LADDER, results)
  assert rows['S@0.008']['verdict'] == 'pending (3 of 4 seeds)'
  assert rows['A@0.008']['verdict'] == 'pending (3 of 4 seeds)'
  assert rows['']['conclusions']['P2'].startswith('pending (2 of 3 rates complete')


def test_boschloo_exact_against_a_closed_form():
  # 4 of 4 against 0 of 4: only the observed table is as extreme, P = pi^4 (1 - pi)^4, largest
  # at pi = 1/2: 1/256 one-sided, 1/128 two-sided, below 0.05 / 4 (the extended family).
  assert stats.boschloo_exact(0, 4, 4, 4) == pytest.approx(1 / 128, rel=1e-9)
  assert stats.boschloo_exact(0, 4, 4, 4) < 0.05 / 4
  assert stats.boschloo_exact(2, 4, 2, 4) == 1.0
  assert stats.boschloo_exact(0, 4, 0, 4) == 1.0
  with pytest.raises(ValueError, match='5 of 4'):
    stats.boschloo_exact(5, 4, 0, 4)


@pytest.mark.slow  # SciPy's optimiser takes seconds a table
def test_boschloo_exact_matches_scipy():
  scipy_stats = pytest.importorskip('scipy.stats')
  for x1, n1, x2, n2 in ((0, 4, 3, 4), (1, 4, 4, 4), (0, 3, 3, 5)):
    expected = scipy_stats.boschloo_exact([[x1, x2], [n1 - x1, n2 - x2]]).pvalue
    assert stats.boschloo_exact(x1, n1, x2, n2) == pytest.approx(expected, abs=1e-6)


# ------------------------------------------------------------------------------------------
# The tuned-rates plan (issue 58): phase A, the extension rung, phase B.


def test_tuned_rates_phase_a_lists_both_layouts_grids_side_by_side():
  names = _names(TUNED, {})
  assert names[:4] == [
    'b4800-lr0.001-post-s0',
    'b4800-lr0.001-realformer-s0',
    'b4800-lr0.001-post-s1',
    'b4800-lr0.001-realformer-s1',
  ]
  assert len(names) == 4 * 2 * 2  # rates x layouts x seeds 0-1; phase B waits for the rules
  assert {n.split('-')[1] for n in names} == {'lr0.001', 'lr0.00141', 'lr0.002', 'lr0.00283'}
  assert TUNED.scale == BUDGETS.scale and TUNED.store == BUDGETS.store


def _grid(best: dict) -> dict:
  """Phase A's runs, each layout best at `best[layout]`."""
  results = {}
  for name in _names(TUNED, {}):
    layout, rate = name.split('-')[2], float(name.split('-')[1][2:])
    results[name] = _result(0.36 if rate == best[layout] else 0.35)
  return results


def test_tuned_rates_phase_b_at_each_layouts_rate_reuses_what_exists():
  results = _grid({'post': 0.002, 'realformer': 0.00141})
  assert TUNED.rate('r_post', results) == 0.002
  assert TUNED.rate('r_realformer', results) == 0.00141
  later = _names(TUNED, results)[16:]
  # Seeds 2-7: Post-LN and RealFormer at 2e-3 (they exist in the store: reused), RealFormer at
  # 1.41e-3, seed by seed.
  assert later[:3] == [
    'b4800-lr0.002-post-s2',
    'b4800-lr0.00141-realformer-s2',
    'b4800-lr0.002-realformer-s2',
  ]
  assert len(later) == 3 * 6
  info = TUNED.rule('r_realformer').describe(TUNED, results)
  assert info['bracketed'] and not info['extended']


def test_tuned_rates_a_best_rate_at_the_edge_adds_one_rung_that_way():
  results = _grid({'post': 0.002, 'realformer': 0.001})
  assert TUNED.rate('r_realformer', results) is None  # the rung 7.07e-4 must run first
  rung = [n for n in _names(TUNED, results) if 'lr0.000707' in n]
  assert rung == ['b4800-lr0.000707-realformer-s0', 'b4800-lr0.000707-realformer-s1']
  for name in rung:
    results[name] = _result(0.37)  # the rung is better still: chosen, not bracketed
  assert TUNED.rate('r_realformer', results) == 0.000707
  info = TUNED.rule('r_realformer').describe(TUNED, results)
  assert info['extended'] and info['bracketed'] is False
  results = _grid({'post': 0.00283, 'realformer': 0.002})
  assert [n for n in _names(TUNED, results) if 'lr0.004-' in n] == [
    'b4800-lr0.004-post-s0',
    'b4800-lr0.004-post-s1',
  ]


def test_tuned_rates_declares_the_primary_and_the_holm_family():
  keys = {c.key: c for c in TUNED.comparisons}
  assert keys['P'].family == '' and keys['P'].seeds == (2, 3, 4, 5, 6, 7)
  assert (keys['S1'].metric, keys['S1'].family) == ('accuracy', 'S')
  assert (keys['S2'].a.rate, keys['S2'].b.rate, keys['S2'].family) == ('r_post', 'r_post', 'S')


def test_layouts_plan_lists_its_forty_runs():
  names = _names(LAYOUTS, {n: _result(0.2) for n in _names(LAYOUTS, {})})
  assert len(names) == 40 and 'half-lr0.001-realformer-s0' in names
  assert LAYOUTS.rate('2r*', {n: _result(0.2) for n in _names(LAYOUTS, {})}) == 0.002


def test_tuned_rates_report_says_when_the_rules_made_two_comparisons_one():
  """Both layouts best at 2.83e-3: P (each at its own rate) and S2 (both at Post-LN's) pair the
  same runs on the same metric, and the report says so instead of listing them as two results."""
  from realformer_jax.studies import plan_report  # pylint: disable=import-outside-toplevel

  results = _grid({'post': 0.00283, 'realformer': 0.00283})
  for name in _names(TUNED, results):
    if 'lr0.004-' in name:
      results[name] = _result(0.30)  # the extension rung, worse: 2.83e-3 is bracketed
  assert TUNED.rate('r_post', results) == TUNED.rate('r_realformer', results) == 0.00283
  lines = plan_report._comparisons(TUNED, analysis.analyse(TUNED, results))
  said = [line for line in lines if 'compare the same runs' in line]
  assert said == [
    'P and S2 compare the same runs on the same metric and seeds (their rates were chosen '
    "equal): one difference, judged at each one's level."
  ]
  results = _grid({'post': 0.002, 'realformer': 0.00141})  # different rates: nothing to say
  lines = plan_report._comparisons(TUNED, analysis.analyse(TUNED, results))
  assert not [line for line in lines if 'compare the same runs' in line]

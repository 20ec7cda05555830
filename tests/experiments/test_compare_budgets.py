"""experiments/compare_budgets: the declared plan (which runs, in which order, when the rate
and the longer budget are decided: fabricated results, no training), the power formula, and
the command at toy size (P1 at one budget from trained runs: table, verdict, plots)."""

import json
import math
import os

import jit_cache
import pytest
from data_fixtures import bible_config

from experiments import compare_budgets, compare_stability
from studies import stats, study

CPU = compare_budgets.PLANS['cpu']


def _result(accuracy: float) -> dict:
  return {'final': {'mask_accuracy': accuracy}, 'learned': True}


def _names(results: dict) -> list[str]:
  return [run.name for run in compare_budgets.plan_runs(results, CPU)]


def test_the_rate_check_comes_first_and_decides_the_rate():
  first = _names({})
  assert first == [
    f'b2400-lr{rate:g}-post-s{seed}' for rate in (0.002, 0.001, 0.004) for seed in (0, 1)
  ]
  # 4e-3 wins at 2,400 steps: every later run uses it, the longest budget first.
  results = {name: _result(0.30 if 'lr0.004' in name else 0.25) for name in first}
  later = _names(results)[len(first) :]
  assert all('-lr0.004-' in name for name in later)
  assert later[:4] == [  # Post-LN at 4e-3, seeds 0 and 1, is the rate check's: reused
    'b2400-lr0.004-realformer-s0',
    'b2400-lr0.004-realformer-s1',
    'b2400-lr0.004-realformer-s2',
    'b2400-lr0.004-post-s2',
  ]
  budgets = [int(name.split('-')[0][1:]) for name in later]
  assert budgets == sorted(budgets, reverse=True) and set(budgets) == {2400, 1200, 600, 300}
  assert len(later) == 3 * 2 * 8 + 8 - 2  # three budgets x two layouts x 8 seeds, RealFormer
  # at 300; the two Post-LN runs at 2,400 and r_L of the rate check are reused


def test_ties_choose_the_smaller_rate_and_a_diverged_run_scores_zero():
  first = _names({})
  results = {name: _result(0.25) for name in first}
  results['b2400-lr0.001-post-s0'] = {'diverged_at_step': 900}  # no 'final': scores 0
  assert compare_budgets.long_rate(results, CPU) == 0.002


def test_a_longer_budget_only_when_the_curves_have_not_flattened():
  rate = 0.002
  results = {name: _result(0.25) for name in _names({})}
  for steps, accuracy in ((2400, 0.30), (1200, 0.295), (600, 0.2), (300, 0.1)):
    for layout in ('post', 'realformer'):
      for seed in CPU.seeds:
        results[compare_budgets.run_name(steps, rate, layout, seed)] = _result(accuracy)
  assert compare_budgets.flattening_gain(results, CPU, rate) == pytest.approx(0.005)
  assert compare_budgets.budgets(results, CPU) == (600, 1200, 2400)
  assert not any(name.startswith('b4800') for name in _names(results))
  for seed in CPU.seeds:  # doubling to 2,400 still gains 1.5 points: 4,800 joins the plan
    for layout in ('post', 'realformer'):
      results[compare_budgets.run_name(1200, rate, layout, seed)] = _result(0.285)
  assert compare_budgets.budgets(results, CPU) == (600, 1200, 2400, 4800)
  assert sum(name.startswith('b4800') for name in _names(results)) == 16


def test_detectable_difference_matches_the_audits_figure():
  # The audit of compare_layouts: 4 seeds, per-seed SD of the paired difference ~0.83 points,
  # eval-set SE ~0.19 points -> ~1.9 points detectable at 80% power (two-sided 5%).
  comparison = stats.PairedComparison(0.0, 0.0, 1.0, 4, (), 0.0083 / 2, 0.0019)
  assert 100 * stats.detectable_difference(comparison) == pytest.approx(1.90, abs=0.01)
  # More seeds, same spread: t quantiles and 1/sqrt(n) shrink it (the plan's 8 seeds).
  eight = stats.PairedComparison(0.0, 0.0, 1.0, 8, (), 0.0083 / math.sqrt(8), 0.0019)
  assert 100 * stats.detectable_difference(eight) < 1.2


def test_holm_levels_and_power_agree_with_holm_and_the_detectable_difference():
  # The budgets study's six p-values (results.json): S7 first, then P1 at 1,200, 2,400, 600.
  p = [0.697, 3.79e-05, 0.135, 9.29e-04, 0.239, 4.71e-05]
  levels = stats.holm_levels(p)
  assert levels == pytest.approx([0.05, 0.05 / 6, 0.05 / 3, 0.05 / 4, 0.05 / 2, 0.05 / 5])
  order = sorted(range(len(p)), key=p.__getitem__)
  for rank, i in enumerate(order):  # step-down: rejected iff it and all before pass
    rejected = all(p[j] < levels[j] for j in order[: rank + 1])
    assert rejected == (stats.holm(p)[i] < 0.05)
  c = stats.PairedComparison(0.0, 0.0, 1.0, 7, (), 0.0021, 0.0013)
  for level in (0.95, 1 - 0.05 / 3):
    detectable = stats.detectable_difference(c, level=level)
    assert stats.power(c, detectable, level) == pytest.approx(0.8, abs=1e-3)
  assert stats.power(c, 0.0) == pytest.approx(0.05, abs=1e-9)  # no effect: the test's level
  assert stats.detectable_difference(c, level=1 - 0.05 / 3) > stats.detectable_difference(c)
  flat = stats.PairedComparison(0.0, 0.0, 1.0, 2, (0.0, 0.0), 0.0, 0.0)  # toy runs on the floor
  assert stats.power(flat, 0.001) == 1.0 and stats.detectable_difference(flat) == 0.0


def test_the_longer_budget_is_pending_until_every_run_finished():
  rate = 0.002
  results = {name: _result(0.25) for name in _names({})}
  for steps, accuracy in ((2400, 0.31), (1200, 0.27)):
    for layout in ('post', 'realformer'):
      for seed in CPU.seeds:
        results[compare_budgets.run_name(steps, rate, layout, seed)] = _result(accuracy)
  del results['b1200-lr0.002-realformer-s1']
  longer = compare_budgets.longer_budget(results, CPU, rate)
  assert longer['state'] == 'pending' and longer['passes_so_far']
  assert (longer['finished_runs'], longer['planned_runs']) == (31, 32)
  assert longer['gain'] == pytest.approx(0.04)
  assert 4800 not in compare_budgets.budgets(results, CPU)  # the plan waits for the rule
  results['b1200-lr0.002-realformer-s1'] = _result(0.27)
  longer = compare_budgets.longer_budget(results, CPU, rate)
  assert longer['state'] == 'required' and longer['gain_after'] is None  # no 4,800 run yet
  assert 4800 in compare_budgets.budgets(results, CPU)
  # What the required doubling gained, descriptively, as its runs arrive: 2,400 -> 4,800.
  results['b4800-lr0.002-post-s0'] = _result(0.36)
  longer = compare_budgets.longer_budget(results, CPU, rate)
  assert longer['gain_after'] == pytest.approx(0.05) and not longer['after_complete']
  for layout in ('post', 'realformer'):
    for seed in CPU.seeds:
      results[compare_budgets.run_name(4800, rate, layout, seed)] = _result(0.34)
  longer = compare_budgets.longer_budget(results, CPU, rate)
  assert longer['gain_after'] == pytest.approx(0.03) and longer['after_complete']
  line = compare_budgets._longer_line(longer, CPU)  # pylint: disable=protected-access
  assert 'Doubling again to 4,800 steps gained +3.00 points (all its runs;' in line


@pytest.mark.slow
def test_compare_budgets_quick(tmp_path, capsys):
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  argv = ['--quick', '--out', out, '--workdirs', workdirs]
  argv += ['--data_dir', bible_config().data_dir, '--runs', 'b4-*']
  with jit_cache.in_process():  # the seeds' runs compile the same programs
    report = compare_budgets.main(argv)
  assert sorted(report['results']) == [
    'b4-lr0.003-post-s0',
    'b4-lr0.003-post-s1',
    'b4-lr0.003-realformer-s0',
    'b4-lr0.003-realformer-s1',
  ]
  analysis = report['analysis']
  assert analysis['rate'] == 0.003
  rows = {(row['budget'], row['key']): row for row in analysis['rows']}
  p1 = rows[(4, 'P1')]
  assert p1['comparison']['n'] == 2 and math.isfinite(p1['detectable'])
  assert p1['verdict'] in ('holds', 'does not hold', 'inconclusive', 'not testable at this scale')
  assert rows[(4, 'S7')]['comparison'] is None  # RealFormer at 2 steps was not selected
  table = open(os.path.join(out, 'results.md')).read()
  assert "r_L = 0.003 (compare_layouts' r*" in table and '| 4 | P1 |' in table
  saved = json.load(open(os.path.join(out, 'results.json')))
  assert saved['plan']['budgets'] == [2, 4]
  for plot in ('curves.png', 'comparisons.png'):
    assert os.path.getsize(os.path.join(out, plot)) > 1000
  capsys.readouterr()
  compare_budgets.main(argv)  # every selected run is finished: nothing is trained again
  assert 'starting' not in capsys.readouterr().out


def test_the_study_pins_the_tokenizer_its_new_runs_trained():
  # A tokenizer trained again can relabel its ids; the runs of 2026-11-27 recorded the digest
  # of theirs, and every later run loads that file.
  import hashlib  # pylint: disable=import-outside-toplevel

  scale = compare_budgets.PLANS['cpu'].scale
  with open(scale.tokenizer, 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  assert digest == compare_budgets.TOKENIZER_SHA256
  store = 'docs/results/compare_layouts/budgets/runs'
  recorded = json.load(open(os.path.join(store, 'b2400-lr0.002-realformer-s1.json')))
  assert digest.startswith(recorded['origin']['checkpoint']['tokenizer_digest'])
  config = study.mlm_config(scale, seed=0)
  assert config.data.vocab_file == compare_budgets.TOKENIZER
  assert compare_stability.PLANS['cpu'].scale.tokenizer == compare_budgets.TOKENIZER
  assert not study.mlm_config(compare_budgets.PLANS['toy'].scale, seed=0).data.vocab_file

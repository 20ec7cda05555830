"""docs/experiments.md's budgets and P2 paragraphs against the committed run JSON: every number
those paragraphs state is parsed from the text and recomputed here from
docs/results/compare_layouts/budgets/runs/*.json with the runner's own analysis of the declared
plans (realformer_jax/studies/plans/; no training: a run committed later changes the numbers, and
this test then asks for the text to follow)."""

import dataclasses
import functools
import json
import math
import os
import re

import numpy as np
import pytest

from realformer_jax.studies import analysis as analysis_lib
from realformer_jax.studies import plan_report, runs, stats, study
from realformer_jax.studies.plans import budgets as budgets_plan
from realformer_jax.studies.plans import stability as stability_plan

STORE = 'docs/results/compare_layouts/budgets'
BUDGETS = budgets_plan.PLANS['cpu']
LADDER = stability_plan.PLANS['cpu']
BUDGET_STEPS, LONGER, SEEDS, LAYOUTS = (
  (600, 1200, 2400),
  4800,
  tuple(range(8)),
  ('post', 'realformer'),
)
LADDER_STEPS = 2400


@functools.cache
def _results() -> dict:
  return runs.all_results(STORE)


@functools.cache
def _text() -> str:
  text = open('docs/experiments.md').read()
  start = text.index('**At longer budgets**')
  end = text.index('**Attention (claim 5)**')
  return ' '.join(text[start:end].split())  # one line: phrases may wrap anywhere


@functools.cache
def _budgets() -> dict:
  """The budgets plan's comparisons by (budget, key), and under 'all' the whole analysis with
  'per_budget' (per budget and layout at r_L: the seeds and their final [MASK] accuracy) and
  'longer' (the flattening rule)."""
  analysis = analysis_lib.analyse(BUDGETS, _results())
  per = {}
  for row in analysis['arms']:
    if row['rate'] == 0.002 and not row['tag']:
      per.setdefault(str(row['steps']), {})[row['layout']] = row
  analysis = dict(analysis, per_budget=per, longer=analysis['rules']['longer'])
  return {(row['b']['steps'], row['key']): row for row in analysis['comparisons']} | {
    'all': analysis
  }


def _find(pattern: str) -> tuple:
  match = re.search(pattern, _text())
  assert match, f'docs/experiments.md no longer says: {pattern}'
  return match.groups()


def _points(value: float, sign: bool = True) -> str:
  return f'{100 * value:+.2f}' if sign else f'{100 * value:.2f}'


def _seeds(seeds) -> str:
  return plan_report.seeds_label(seeds)


def _longer_complete() -> bool:
  """Whether every run of the 4,800-step budget is committed (the text then states its results;
  before, an interim sentence)."""
  longer = [n for n in _results() if n.startswith(f'b{LONGER}-lr0.002-')]  # the budgets plan's
  return len(longer) == len(LAYOUTS) * len(SEEDS)


def test_seed_labels_are_the_finished_runs():
  analysis = _budgets()['all']
  per = analysis['per_budget']
  complete = _longer_complete()
  budgets = ('600', '1200', '2400') + (('4800',) if complete else ())
  (finished,) = _find(
    r'the runs finished are \*\*seeds ([0-9, and-]+)\*\* at every budget up to '
    + ('4,800 steps: all of the plan' if complete else '2,400')
  )
  for budget in budgets:
    for layout in ('post', 'realformer'):
      assert _seeds(per[budget][layout]['seeds']) == finished.replace(' and ', ', ')
  assert _seeds(per['300']['realformer']['seeds']) == finished
  rows = {r['key']: r for r in analysis['comparisons'] if r['b']['steps'] == LONGER}
  assert all(r['verdict'].startswith('pending') for r in rows.values()) != complete
  if complete:
    post, real = _find(
      r'\(at 4,800 steps, at \[MASK\]: Post-LN (\S+ ± \S+)%, RealFormer (\S+ ± \S+)%, means'
    )
    for layout, quoted in (('post', post), ('realformer', real)):
      values = per['4800'][layout]['mask_accuracy']
      assert quoted == stats.format_ci(stats.mean_ci(values), 2, 100)
    return
  (done,) = _find(r'of the 4,800-step budget (\d+) of its 16 runs have finished')
  label, post, real, mean, half, n = _find(
    r'\(seeds (\S+), at \[MASK\]: Post-LN ([\d., ]+)%; RealFormer ([\d., ]+)%; interim P1 (\S+) '
    r'± (\S+) points over (\d) seeds\)'
  )
  longer = [n for n in _results() if n.startswith(f'b{LONGER}-lr0.002-')]  # the budgets plan's
  seeds = sorted({int(n.rsplit('-s', 1)[1]) for n in longer})
  assert label == _seeds(seeds) and len(longer) == 2 * len(seeds)
  for layout, quoted in (('post', post), ('realformer', real)):
    assert quoted.split(', ') == [
      _points(_results()[f'b{LONGER}-lr0.002-{layout}-s{s}']['final']['mask_accuracy'], False)
      for s in seeds
    ]
  interim = _budgets()[(LONGER, 'P1')]['comparison']
  assert [mean, half, n] == [
    _points(interim['mean']),
    _points(interim['ci95_half_width'], False),
    str(interim['n']),
  ]
  assert int(done) == len(longer) and len(LAYOUTS) * len(SEEDS) == 16


def _step_one_spreads(results: dict) -> tuple[str, str, str, str]:
  """The step-1 loss spreads the seed-1 paragraph quotes: between the machines (same seed and
  layout; a range), the seeds for which that stays within the recipe check's tolerance ('' if
  none), within one machine (Post-LN against RealFormer), and across seeds."""
  # The 12-layer runs only: the store also holds tagged runs of other depths (L6-, L24-), whose
  # step-1 losses differ by design.
  results = {name: run for name, run in results.items() if name.startswith('b')}
  by_machine = {}
  for name, run in results.items():
    layout, seed = name.split('-')[2:4]
    by_machine.setdefault((seed, analysis_lib.machine_of(run)), {}).setdefault(layout, []).append(
      run['train_loss'][0][1]
    )
  across = {}  # seed -> the differences of the same seed and layout on the two machines
  for (seed, machine), sides in by_machine.items():
    if machine == 'not recorded':
      continue
    for layout, values in sides.items():
      for b in by_machine.get((seed, 'not recorded'), {}).get(layout, []):
        across.setdefault(seed, []).extend(abs(a - b) for a in values)
  sci = lambda x, digits: f'{x:.{digits}e}'.replace('e-0', 'e-')  # 1.3e-03 -> 1.3e-3
  every = [d for values in across.values() for d in values]
  low, high = sci(min(every), 1), sci(max(every), 1)
  if low == high:
    span = low
  elif low.split('e')[1] == high.split('e')[1]:
    span = f'{low.split("e")[0]}-{high}'
  else:
    span = f'{low} to {high}'
  within = sorted(
    int(seed[1:]) for seed, values in across.items() if max(values) <= analysis_lib.RECIPE_TOLERANCE
  )
  pairs = [
    abs(a - b)
    for s in by_machine.values()
    if len(s) == 2
    for a in s['post']
    for b in s['realformer']
  ]
  starts = [run['train_loss'][0][1] for run in results.values()]
  return (
    span,
    _seeds(within) if within else '',
    sci(max(pairs), 0),
    sci(max(starts) - min(starts), 1),
  )


def test_seed_one_came_from_another_machine():
  # The step-1 losses quoted, and the claim that the new seed-1 runs record their machine while
  # the committed ones did not (analysis_lib.machine_of).
  new, old = _find(r'RealFormer\s+seed 1 at 2,400 steps: (\S+) against (\S+) for the committed')
  results = _results()
  first = lambda name: f'{results[name]["train_loss"][0][1]:.5f}'
  assert new == first('b2400-lr0.002-realformer-s1')
  assert {first(f'b2400-lr{rate}-realformer-s1') for rate in ('0.004', '0.008', '0.016')} == {old}
  machines = {
    analysis_lib.machine_of(results[f'b{b}-lr0.002-{l}-s1'])
    for b, l in (
      (1200, 'post'),
      (1200, 'realformer'),
      (600, 'post'),
      (600, 'realformer'),
      (2400, 'realformer'),
    )
  }
  assert len(machines) == 1 and 'not recorded' not in machines
  assert analysis_lib.machine_of(results['b2400-lr0.002-post-s1']) == 'not recorded'
  quoted = _find(
    r'start (\S+(?: to \S+)?) away from the committed runs .*?, beyond the 1e-3 that the recipe '
    r'check allows(?: for every seed but (\S+))? \(both studies. reports name every seed and '
    r'layout whose runs mix machines, within the tolerance or not\); on one machine, the runs of '
    r'one seed agree to '
    r'within (\S+) \(Post-LN against RealFormer\), and seeds differ by up to (\S+)\.'
  )
  assert tuple(q or '' for q in quoted) == _step_one_spreads(results)
  # Both studies' reports name exactly the seeds and layouts whose runs (in that study) come
  # from both machines: beyond the recipe check's tolerance.
  ladder = {n for n in results if n.startswith(f'b{LADDER_STEPS}-')}  # the check's runs
  budgets = set(json.load(open(os.path.join(STORE, 'results.json')))['runs'])
  for report, names in ((STORE, budgets), ('docs/results/compare_layouts/stability', ladder)):
    analysis = json.load(open(os.path.join(report, 'results.json')))['analysis']
    mixed = set()
    for key in analysis['recipe_check']['per']:
      layout, seed = key.rsplit('-s', 1)
      own = [results[n] for n in names if n.endswith(f'-{layout}-s{seed}')]
      if len({analysis_lib.machine_of(run) for run in own}) > 1:
        mixed.add(key)
    check = analysis['recipe_check']
    assert set(check['mixed']) == mixed and mixed
    beyond = {key for key in mixed if check['per'][key]['spread'] > check['tolerance']}
    assert set(check['beyond']) == beyond
    text = open(os.path.join(report, 'results.md')).read()
    assert text.count('beyond it**') == len(beyond)
    within = sorted(mixed - beyond)
    assert ('Within it but trained on more than one machine' in text) == bool(within)
    for key in within:
      assert f'{key} by {check["per"][key]["spread"]:.1e}' in text
  diff, half = _find(r'Without seed 1, P1 at 2,400 steps is\s+(\S+) ± (\S+) points')
  p1 = next(c for c in BUDGETS.comparisons if c.key == 'P1' and c.b.steps == 2400)
  without = dataclasses.replace(p1, seeds=tuple(s for s in p1.seeds if s != 1))
  c = analysis_lib.compare(BUDGETS, results, without)
  assert (diff, half) == (
    _points(c['comparison']['mean']),
    _points(c['comparison']['ci95_half_width'], False),
  )


def _cell(row: dict) -> str:
  """'-0.23 ± 1.56 (0.737): inconclusive': a comparison as the budget table shows it."""
  c = row['comparison']
  return (
    f'{_points(c["mean"])} ± {_points(c["ci95_half_width"], False)} '
    f'({row["holm_p_value"]:.3g}): {row["verdict"]}'
  )


def test_p1_in_both_metrics_per_budget():
  rows, per = _budgets(), _budgets()['all']['per_budget']
  for budget in BUDGET_STEPS + (LONGER,):
    mask, every = rows[(budget, 'P1')], rows[(budget, 'P1-all')]
    assert every['family'] == 'all positions, added after the runs'
    ahead = [sum(v > 0 for v in r['comparison']['values']) for r in (mask, every)]
    kept = np.mean(
      [
        a - b
        for a, b in zip(
          per[str(budget)]['realformer']['kept_accuracy'], per[str(budget)]['post']['kept_accuracy']
        )
      ]
    )
    quoted = _find(
      rf'\| {budget:,} \| ([^|]+) \| ([^|]+) \| (\d) / (\d) of 8 seeds \| (\S+) points \|'
    )
    assert list(quoted) == [_cell(mask), _cell(every), str(ahead[0]), str(ahead[1]), _points(kept)]
  # "Post-LN is ahead at every budget" on the paper's metric; "4-8 points" on kept tokens
  assert all(rows[(b, 'P1-all')]['comparison']['mean'] < 0 for b in BUDGET_STEPS + (LONGER,))
  kept = [
    np.mean(
      np.subtract(per[str(b)]['realformer']['kept_accuracy'], per[str(b)]['post']['kept_accuracy'])
    )
    for b in BUDGET_STEPS + (LONGER,)
  ]
  assert all(-0.08 <= k <= -0.035 for k in kept)
  assert all(abs(rows[(b, 'P1')]['comparison']['mean']) < 0.01 for b in BUDGET_STEPS)


def test_s7_and_holm():
  rows = _budgets()
  s7 = _find(r'Claim 4 .*?: (\S+) ± (\S+), (\S+) ± (\S+), (\S+) ± (\S+) points at 600')
  expected = []
  for budget in BUDGET_STEPS:
    c = rows[(budget, 'S7')]['comparison']
    expected += [_points(c['mean']), _points(c['ci95_half_width'], False)]
  assert list(s7) == expected
  holm = _find(r'it does not hold at any of them\s+\(Holm p (\S+), (\S+), (\S+)\)')
  assert list(holm) == [f'{rows[(b, "S7")]["holm_p_value"]:.3g}' for b in BUDGET_STEPS]
  assert all(rows[(b, 'S7')]['verdict'] == 'does not hold' for b in BUDGET_STEPS)
  assert all(rows[(b, 'P1')]['verdict'] == 'inconclusive' for b in BUDGET_STEPS)
  assert all(rows[(b, 'S7')]['comparison']['p_value'] < 0.05 / 8 for b in BUDGET_STEPS)


def test_power_under_the_holm_levels_used():
  rows = _budgets()
  k1200, k2400, d1200, d2400, u1200, u2400 = _find(
    r'tested the \[MASK\] P1 at 1,200 steps at 0\.05/(\d) and at 2,400\s+steps at '
    r'0\.05/(\d), where this design detects (\S+) and (\S+) points with 80% power '
    r'\((\S+) and (\S+)\s+unadjusted\)'
  )
  for budget, k, detect, unadjusted in ((1200, k1200, d1200, u1200), (2400, k2400, d2400, u2400)):
    row = rows[(budget, 'P1')]
    assert row['holm_level'] == pytest.approx(0.05 / int(k))
    assert _points(row['detectable_at_level'], False) == detect
    assert _points(row['detectable'], False) == unadjusted
    assert not row.get('power')  # the paper's gains are compared with all positions only
  uppers = _find(r"unadjusted intervals' upper ends are (\S+) and (\S+)\)")
  assert list(uppers) == [_points(rows[(b, 'P1')]['comparison']['high']) for b in (1200, 2400)]
  assert max(rows[(b, 'P1')]['detectable_at_level'] for b in (1200, 2400)) < 0.01  # "a point"
  gains = _find(r"The paper's masked-LM gains are (\S+) / (\S+) / (\S+) / (\S+) points")
  assert list(gains) == [_points(g) for g in budgets_plan.PAPER_GAINS.values()]
  low_h, high_h, low_u, high_u, low_x, high_x = _find(
    r'for \+0\.13 \.\.\. \+0\.30 it has\s+(\d+)-(\d+)% power at its Holm levels '
    r"\((\d+)-(\d+)% unadjusted\) at 1,200 and 2,400 steps; only xLarge's \S+\s+would likely be "
    r'found \((\d+)-(\d+)%'
  )
  every = [rows[(b, 'P1-all')] for b in (1200, 2400)]
  small = [r['power'][s] for r in every for s in ('Small', 'Base', 'Large')]
  xlarge = [r['power']['xLarge']['at_level'] for r in every]
  percent = lambda values: (f'{100 * min(values):.0f}', f'{100 * max(values):.0f}')
  assert (low_h, high_h) == percent([p['at_level'] for p in small])
  assert (low_u, high_u) == percent([p['unadjusted'] for p in small])
  assert (low_x, high_x) == percent(xlarge)


def test_within_the_runs_realformer_leads_early_then_trails():
  """The 4,800-step runs' evaluation curves: the step where the lead changes hands."""
  results = _results()
  name = lambda layout, s: f'b{LONGER}-lr0.002-{layout}-s{s}'
  steps = [step for step, _ in results[name('post', 0)]['eval_mask_accuracy']]
  diff = {
    step: [
      results[name('realformer', s)]['eval_mask_accuracy'][i][1]
      - results[name('post', s)]['eval_mask_accuracy'][i][1]
      for s in SEEDS
    ]
    for i, step in enumerate(steps)
  }
  mean = lambda step: _points(np.mean(diff[step]))
  ahead = lambda step: sum(d > 0 for d in diff[step])
  quoted = _find(
    r'RealFormer leads at step 600 in (\d) of 8 seeds \((\S+) points\), the two are\s+level at '
    r'step 1,200 \((\S+), RealFormer ahead in (\d) of 8\) and Post-LN leads from step 1,800 on\s+'
    r'\((\S+) at 1,800, (\S+) at 2,400, (\S+) at 4,800; RealFormer ahead in at most (\d) of 8'
  )
  assert list(quoted) == [
    str(ahead(600)),
    mean(600),
    mean(1200),
    str(ahead(1200)),
    mean(1800),
    mean(2400),
    mean(4800),
    str(max(ahead(step) for step in steps if step >= 2400)),
  ]
  assert all(np.mean(diff[step]) < 0 for step in steps if step >= 1800)


def test_s7_is_p1_at_half_the_budget_minus_post_lns_gain():
  rows, analysis = _budgets(), _budgets()['all']
  quoted = _find(r'1,200 steps: (\S+) - (\S+) = (\S+); 2,400 steps: (\S+) - (\S+) = (\S+)\)')
  per = analysis['per_budget']
  expected = []
  for budget in (1200, 2400):
    seeds = rows[(budget, 'S7')]['seeds']
    post = lambda b: {
      s: v for s, v in zip(per[str(b)]['post']['seeds'], per[str(b)]['post']['mask_accuracy'])
    }
    gain = np.mean([post(budget)[s] - post(budget // 2)[s] for s in seeds])
    p1 = rows[(budget // 2, 'P1')]['comparison']['mean']
    s7 = rows[(budget, 'S7')]['comparison']['mean']
    assert s7 == pytest.approx(p1 - gain, abs=1e-9)  # the identity, exactly
    expected += [_points(p1), _points(gain, False), _points(s7)]
  assert list(quoted) == expected


def test_flattening_and_the_longer_budget():
  longer = _budgets()['all']['longer']
  (gain,) = _find(r'1,200 -> 2,400 steps gained (\S+) points over\s+all 32 runs')
  assert gain == _points(longer['gain']) and longer['value'] is True
  then = '; its results follow' if _longer_complete() else ' and pending'
  assert f'the 4,800-step budget is required by the declared rule**{then}' in _text()
  results_md = open(os.path.join(STORE, 'results.md')).read()
  assert 'the longer budget is required' in results_md
  assert longer['after_complete'] == _longer_complete()


def test_the_longer_budgets_paragraph():
  if not _longer_complete():
    assert '**At 4,800 steps**' not in _text()
    return
  rows, longer = _budgets(), _budgets()['all']['longer']
  p1, s7 = rows[(4800, 'P1')], rows[(4800, 'S7')]
  quoted = _find(
    r'\*\*At 4,800 steps\*\* .*?P1 is (\S+) ± (\S+) points \(Holm p (\S+), tested at 0\.05/(\d), '
    r'where this design detects (\S+) points with 80% power\): \*\*([^*]+)\*\*'
  )
  assert list(quoted) == [
    _points(p1['comparison']['mean']),
    _points(p1['comparison']['ci95_half_width'], False),
    f'{p1["holm_p_value"]:.3g}',
    str(round(0.05 / p1['holm_level'])),
    _points(p1['detectable_at_level'], False),
    p1['verdict'],
  ]
  c = p1['comparison']  # an inconclusive P1 whose unadjusted interval excludes 0 says so
  unadjusted = re.search(r'(\S+) ahead on the unadjusted interval \(p (\S+)\), not after', _text())
  excludes_zero = c['low'] > 0 or c['high'] < 0
  assert bool(unadjusted) == (excludes_zero and p1['verdict'] == 'inconclusive')
  if unadjusted:
    ahead = 'RealFormer' if c['mean'] > 0 else 'Post-LN'
    assert unadjusted.groups() == (ahead, f'{c["p_value"]:.3g}')
  rate = "chosen as Post-LN's best at 2,400 steps (step 1 of the plan)"  # the caveat of a lead
  assert (rate in _text()) == (c['mean'] < 0)
  quoted = _find(
    r'S7, RealFormer at 2,400 steps against Post-LN at 4,800, is (\S+) ± (\S+) points \(Holm p '
    r'(\S+)\): \*\*([^*]+)\*\*; it is again P1 at 2,400 steps minus Post-LN.s gain from '
    r'doubling \((\S+) - (\S+) = (\S+)\)'
  )
  per = _budgets()['all']['per_budget']
  post = lambda b: dict(zip(per[str(b)]['post']['seeds'], per[str(b)]['post']['mask_accuracy']))
  gain = np.mean([post(4800)[s] - post(2400)[s] for s in s7['seeds']])
  assert s7['comparison']['mean'] == pytest.approx(
    rows[(2400, 'P1')]['comparison']['mean'] - gain, abs=1e-9
  )
  assert list(quoted) == [
    _points(s7['comparison']['mean']),
    _points(s7['comparison']['ci95_half_width'], False),
    f'{s7["holm_p_value"]:.3g}',
    s7['verdict'],
    _points(rows[(2400, 'P1')]['comparison']['mean']),
    _points(gain, False),
    _points(s7['comparison']['mean']),
  ]
  (after, rule) = _find(
    r'Doubling from 2,400 to 4,800 steps gained (\S+) points over all 32 runs \((\w+) than'
  )
  assert after == _points(longer['gain_after'])
  assert rule == ('more' if longer['gain_after'] >= longer['threshold'] else 'less')


def test_the_scale_table():
  # The count the stability report computed (tracing the model takes seconds on a loaded
  # machine; tests/studies/test_committed_studies.py checks it against the model).
  plan = json.load(open('docs/results/compare_layouts/stability/results.json'))['plan']
  facts = {
    'parameters': plan['parameters'],
    'tokens_per_run': LONGER * LADDER.scale.batch * LADDER.scale.seq_len,
  }
  params, tokens = _find(
    r'\| model \| 12 layers x 64, ([\d,]+) parameters .*?\| tokens per run \| ([\d,]+)'
  )
  assert (params, tokens) == (f'{facts["parameters"]:,}', f'{facts["tokens_per_run"]:,}')
  per = _budgets()['all']['per_budget']['4800']
  quoted = _find(
    r'\| (\S+) / (\S+)% at \[MASK\], (\S+) / (\S+)% at all positions \(Post-LN / RealFormer, '
    r'4,800 steps; floors (\S+) / (\S+)%\)'
  )
  floors = next(r['floors'] for r in _results().values() if r.get('floors'))
  assert list(quoted) == [
    _points(np.mean(per['post']['mask_accuracy']), False),
    _points(np.mean(per['realformer']['mask_accuracy']), False),
    _points(np.mean(per['post']['accuracy']), False),
    _points(np.mean(per['realformer']['accuracy']), False),
    _points(floors['mask_accuracy'], False),
    _points(floors['mlm_accuracy'], False),
  ]
  quoted = _find(
    r'\| RealFormer - Post-LN \| (\S+) ± (\S+) points at \[MASK\], (\S+) ± (\S+) at all '
    r'positions \(4,800 steps'
  )
  expected = []
  for key in ('P1', 'P1-all'):
    c = _budgets()[(LONGER, key)]['comparison']
    expected += [_points(c['mean']), _points(c['ci95_half_width'], False)]
  assert list(quoted) == expected
  paper = _find(
    r'\| RealFormer - Post-LN \| .*?\| (\S+) / (\S+) / (\S+) / (\S+) points \(all positions\) \|'
  )
  assert list(paper) == [_points(g) for g in budgets_plan.PAPER_GAINS.values()]


def test_p2_paragraph():
  analysis = analysis_lib.analyse(LADDER, _results())
  rows = {row['key']: row for row in analysis['comparisons']}
  (blowup,) = _find(r'ends above ln\(2,000\) \+ 1 = (\S+) nats')
  assert blowup == f'{math.log(LADDER.scale.vocab) + LADDER.blowup_margin:.2f}'
  (p,) = _find(r'0-of-4 split, p = (\S+), is significant')
  assert p == f'{stats.boschloo_exact(0, 4, 4, 4):.4f}'
  done, new = _find(r'Status from the committed runs: (\d+) of the (\d+) new runs finished')
  names = [r.name for r in LADDER.runs({})]
  reused = 9  # the committed runs of the plan before it was declared
  assert int(new) == len(names) - reused
  assert int(done) == sum(name in _results() for name in names) - reused
  (verdict,) = _find(r'\*\*P2 verdict: (.*?)\*\*')
  assert verdict == analysis['conclusions']['P2']
  post_4e3 = _find(r'at 2,400 steps Post-LN learns at 4e-3 \((\S+) and (\S+)%\)')
  assert list(post_4e3) == [
    _points(_results()[f'b2400-lr0.004-post-s{s}']['final']['mask_accuracy'], False) for s in (0, 1)
  ]
  accuracy = lambda name: _points(_results()[name]['final']['mask_accuracy'], False)
  four = r'(\S+), (\S+), (\S+) and (\S+)%'
  found = _find(rf'\(RealFormer {four} at \[MASK\], Post-LN {four};')
  assert list(found) == [
    accuracy(f'b2400-lr0.004-{layout}-s{s}') for layout in ('realformer', 'post') for s in range(4)
  ]
  comparison = rows['A@0.004']['comparison']
  difference = _find(r'paired difference (\S+) ± (\S+) points over (\d) seeds')
  assert list(difference) == [
    _points(comparison['mean']),
    _points(comparison['ci95_half_width'], False),
    str(comparison['n']),
  ]
  failure = rows['S@0.004']['failures']
  stated = _find(r'failed (\d)/4 RealFormer against (\d)/4 Post-LN, Boschloo p = (\S+),')
  assert list(stated) == [
    str(failure['failed_a']),
    str(failure['failed_b']),
    f'{failure["p_value"]:.3f}',
  ]
  for rate, pattern in (
    ('0.008', r'8e-3 is complete too:\s+all (\d) runs \(both layouts, seeds 0-3\) failed'),
    ('0.016', r'1\.6e-2\s+is the same: all (\d) runs failed without diverging'),
  ):
    s_row, a_row = rows[f'S@{rate}'], rows[f'A@{rate}']
    (runs,) = _find(pattern)
    failed = s_row['failures']['failed_a'] + s_row['failures']['failed_b']
    assert s_row['complete'] and int(runs) == failed == 8
    assert a_row['diverged'] == []  # "without diverging"
  s_verdict, a_verdict = _find(r'that is "([^"]+)" on the failure test and "([^"]+)" on accuracy')
  assert (s_verdict, a_verdict) == (rows['S@0.008']['verdict'], rows['A@0.008']['verdict'])
  s_verdict, a_verdict = _find(r'on the floor \("([^"]+)"; accuracy "([^"]+)"\)')
  assert (s_verdict, a_verdict) == (rows['S@0.016']['verdict'], rows['A@0.016']['verdict'])
  # "no run diverged": at any rate, either layout
  assert all(not r['diverged'] for r in analysis['comparisons'])
  assert study.learned  # the rule the text names


def test_p2_what_the_ladder_shows_against_the_claim():
  results = _results()
  rows = {row['key']: row for row in analysis_lib.analyse(LADDER, results)['comparisons']}
  failed = rows['S@0.004']['failures']
  quoted = _find(
    r'RealFormer failed (\d) of 4 runs at 4e-3 where Post-LN failed\s+none, and where both '
    r'learned \(seeds (\d), (\d) and (\d)\) going from 2e-3 to 4e-3 cost RealFormer (\S+)\s+'
    r"points at \[MASK\] against Post-LN's (\S+); at all positions the paired difference at "
    r'4e-3 is\s+(\S+) ± (\S+) points \(added after the runs, Holm p (\S+): (\w+)\)'
  )
  both = [
    s for s in range(4) if all(results[f'b2400-lr0.004-{l}-s{s}']['learned'] for l in LAYOUTS)
  ]
  cost = lambda layout: _points(
    np.mean(
      [
        results[f'b2400-lr0.002-{layout}-s{s}']['final']['mask_accuracy']
        - results[f'b2400-lr0.004-{layout}-s{s}']['final']['mask_accuracy']
        for s in both
      ]
    ),
    False,
  )
  every = rows['A@0.004-all']
  assert failed['failed_b'] == 0
  assert list(quoted) == [
    str(failed['failed_a']),
    *map(str, both),
    cost('realformer'),
    cost('post'),
    _points(every['comparison']['mean']),
    _points(every['comparison']['ci95_half_width'], False),
    f'{every["holm_p_value"]:.3g}',
    every['verdict'],
  ]


def test_layouts_p1_in_both_metrics():
  """The layouts study's claim-1 sentence: P1 at [MASK] and on all positions (the paper's
  gains are compared with the latter only)."""
  from realformer_jax.studies.plans import layouts  # pylint: disable=import-outside-toplevel

  plan = layouts.PLANS['cpu']
  results = runs.all_results(plan.out)
  rows = {r['key']: r for r in analysis_lib.analyse(plan, results)['comparisons']}
  whole = ' '.join(open('docs/experiments.md').read().split())
  quoted = re.search(
    r'is \*\*(\S+) ± (\S+) points at \[MASK\]: no detectable difference at this power\*\* '
    r'\(P1, verdict "(\w+)": the interval \[(\S+), (\S+)\] contains 0\)\. On all selected '
    r'positions, .*? it is (\S+) ± (\S+) points, interval \[(\S+), (\S+)\]',
    whole,
  ).groups()
  mask, every = rows['P1']['comparison'], rows['P1-all']['comparison']
  assert list(quoted) == [
    _points(mask['mean']),
    _points(mask['ci95_half_width'], False),
    rows['P1']['verdict'],
    _points(mask['low']),
    _points(mask['high']),
    _points(every['mean']),
    _points(every['ci95_half_width'], False),
    _points(every['low']),
    _points(every['high']),
  ]

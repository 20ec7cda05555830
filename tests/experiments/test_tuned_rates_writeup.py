"""docs/experiments.md's tuned-rates section (issue 58) against the committed run JSON: each number
it states is parsed from the text and recomputed here with the runner's own analysis of the declared
plan (realformer_jax/studies/plans/tuned_rates.py; no training), and the depth study's figures
(plans/depth.py, its attention analysis) that the lead and the depth section quote. A run
committed later changes the numbers, and this test then asks for the text to follow."""

import functools
import json
import math
import os
import re

import numpy as np
import pytest

from realformer_jax.studies import analysis as analysis_lib
from realformer_jax.studies import plan_report, runs, stats
from realformer_jax.studies.plans import budgets, depth, tuned_rates

PLAN = tuned_rates.PLANS['cpu']
LAYOUTS = ('post', 'realformer')
NAMES = {'post': 'Post-LN', 'realformer': 'RealFormer'}


@functools.cache
def _results() -> dict:
  return runs.all_results(PLAN.store)


@functools.cache
def _analysis() -> dict:
  return analysis_lib.analyse(PLAN, _results())


def _section(start: str, end: str) -> str:
  text = open('docs/experiments.md').read()
  begin = text.index(start)
  return ' '.join(text[begin : text.index(end, begin)].split())  # phrases may wrap anywhere


@functools.cache
def _text() -> str:
  return _section('### Each layout at its own learning rate', '### Post-LN vs Pre-LN vs RealFormer')


@functools.cache
def _lead() -> str:
  return _section('## What the experiments show', '### Declaring a study')


def _find(pattern: str, text=None) -> tuple:
  match = re.search(pattern, text if text is not None else _text())
  assert match, f'docs/experiments.md no longer says: {pattern}'
  return match.groups()


def _final(layout: str, rate: str, seed: int, metric: str):
  run = _results().get(f'b{PLAN.rules[0].steps}-lr{rate}-{layout}-s{seed}')
  return None if run is None else run[metric][-1][1]


def _cell(layout: str, rate: float, metric: str) -> str:
  """A layout's cell at a rate: '-' where the rate is not in its grid (an extension rung of the
  other layout), 'not finished' before both seeds are."""
  key = next((k for k in _rules()[layout]['per_rate'] if float(k) == rate), None)
  if key is None:
    return '-'
  values = [_final(layout, key, seed, metric) for seed in PLAN.rules[0].seeds]
  if any(v is None for v in values):
    return 'not finished'
  return plan_report.seed_cell(values, scale=100)


def _rules() -> dict:
  return {layout: _analysis()['rules'][f'r_{layout}'] for layout in LAYOUTS}


def _comparison(key: str) -> dict:
  (row,) = [row for row in _analysis()['comparisons'] if row['key'] == key]
  return row


def _points(comparison: dict) -> tuple:
  """A paired difference as the text writes it: ('-0.45', '0.60'), mean and 95% half-width."""
  return f'{100 * comparison["mean"]:+.2f}', f'{100 * comparison["ci95_half_width"]:.2f}'


def _rate_label(rate) -> str:
  return f'{float(rate):.3g}'


def test_phase_a_table_in_both_metrics():
  """One row per rate of either layout's grid (the extension rung too, once it is planned):
  [MASK] and all-position accuracy, seeds 0-1, each layout."""
  rates = sorted({float(r) for rule in _rules().values() for r in rule['per_rate']})
  for rate in rates:
    quoted = _find(
      rf'\| {re.escape(_rate_label(rate))} \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|'
    )
    expected = [
      _cell(layout, rate, metric)
      for layout in LAYOUTS
      for metric in ('eval_mask_accuracy', 'eval_accuracy')
    ]
    assert [q.strip() for q in quoted] == expected, rate


def test_each_layouts_rate_by_the_declared_rule():
  for layout, rule in _rules().items():
    (said,) = _find(rf"{NAMES[layout]}'s rate by the rule: (.+?)[;.](?: |$)")
    if rule['value'] is None:
      assert said == 'not decided yet (its grid is still running)'
    else:
      label = _rate_label(rule['value'])
      assert said == (label if rule['bracketed'] else f'{label}, not bracketed'), layout


def test_each_comparison_as_its_verdict_stands():
  tests = _text()[_text().index('**The tests, as their verdicts stand**') :]
  for row in _analysis()['comparisons']:
    (said,) = _find(rf'\*\*{row["key"]}\*\* [^:]*: ([^;]+);', tests)
    if row['comparison'] is None:
      assert said == row['verdict'], row['key']
    else:
      c = row['comparison']
      p = row['holm_p_value'] if row.get('family') else c['p_value']
      mean, half = _points(c)
      # Two significant figures: the eval-set SE comes from a 2,000-resample bootstrap, so a
      # third digit of p is noise.
      assert said == f'{mean} ± {half} points (p {p:.2g}): {row["verdict"]}', row['key']


def test_recipe_check_and_machines():
  check = _analysis()['recipe_check']
  spread, run_count = _find(r'step-1 training loss spreads by at most (\S+) over (\d+) runs')
  assert float(spread) == check['max_spread']
  assert int(run_count) == sum(v['runs'] for v in check['per'].values())
  machines = _find(r'trained on (\d) machines')
  assert int(machines[0]) == len(check['machines'])


def _differences() -> str:
  """'-0.05 / -0.23 at 0.001, ...': RealFormer - Post-LN per rate with both layouts finished,
  mean over seeds 0-1 of the paired differences, [MASK] / all positions, in points."""
  parts = []
  for key in _rules()['post']['per_rate']:
    pair = []
    for metric in ('eval_mask_accuracy', 'eval_accuracy'):
      values = [
        (_final('realformer', key, s, metric), _final('post', key, s, metric))
        for s in PLAN.rules[0].seeds
      ]
      if any(None in v for v in values):
        break
      pair.append(f'{100 * sum(a - b for a, b in values) / len(values):+.2f}')
    if len(pair) == 2:
      parts.append(f'{pair[0]} / {pair[1]} at {_rate_label(key)}')
  return ', '.join(parts)


def test_phase_a_differences_per_rate():
  (said,) = _find(r'RealFormer - Post-LN, seeds 0-1, \[MASK\] / all positions: (.+?) \(means of')
  assert said == _differences()


def test_the_lead_says_how_far_the_study_is():
  rules = _rules()
  planned = sum(len(rule['per_rate']) * len(rule['seeds']) for rule in rules.values())
  finished = sum(
    _final(layout, key, seed, 'eval_mask_accuracy') is not None
    for layout, rule in rules.items()
    for key in rule['per_rate']
    for seed in rule['seeds']
  )
  done, of = _find(r'its phase A has finished (\d+) of (\d+) runs', _lead())
  assert (int(done), int(of)) == (finished, planned)
  if all(rule['value'] is not None for rule in rules.values()):
    done, of = _find(r'phase B has finished (\d+) of (\d+) runs', _lead())
    assert (int(done), int(of)) == _phase_b_progress()
  pending = [
    row['key'] for row in _analysis()['comparisons'] if row['verdict'].startswith('pending')
  ]
  if pending:
    assert 'no verdict yet' in _lead().lower()
  else:
    _the_lead_quotes_the_primary_verdict()


def _the_lead_quotes_the_primary_verdict():
  """With every seed in, the lead answers its question with P's figures and verdict as the
  analysis has them, and with its detectable difference (how small an effect could be missed)."""
  assert 'no verdict yet' not in _lead().lower()
  primary = _comparison('P')
  c = primary['comparison']
  mean, half, p, verdict, detectable = _find(
    r'RealFormer - Post-LN, each at its own rate, is (\S+) ± (\S+) points at \[MASK\] '
    r'\(seeds 2-7, p (\S+)\), verdict by the declared rule: (.+?)\. .*?'
    r'detects (\S+) points with 80% power',
    _lead(),
  )
  assert (mean, half) == _points(c)
  assert p == f'{c["p_value"]:.2g}'
  assert verdict == primary['verdict']
  assert detectable == f'{100 * primary["detectable"]:.2f}'
  all_positions = _comparison('S1')
  c = all_positions['comparison']
  mean, half, p, verdict = _find(
    r'[Oo]n all selected positions \(S1[^)]*\) it is (\S+) ± (\S+) points '
    r'\(Holm p (\S+)\): ([^;.]+)',
    _lead(),
  )
  assert (mean, half) == _points(c)
  assert (p, verdict) == (f'{all_positions["holm_p_value"]:.2g}', all_positions['verdict'])
  kept = _find(r'RealFormer predicts (\S+)% of them and Post-LN (\S+)%', _lead())
  assert kept == tuple(
    f'{100 * _phase_b_mean(layout, "kept_accuracy"):.1f}' for layout in LAYOUTS[::-1]
  )


def _phase_b_mean(layout: str, metric: str) -> float:
  """A final metric of `layout` at its chosen rate, mean over the tests' seeds."""
  primary = _comparison('P')
  (arm,) = [
    a for group in PLAN.arms for a in group if (a.variant, a.rate) == (layout, f'r_{layout}')
  ]
  rate = _analysis()['rules'][arm.rate]['value']
  finals = [
    _results()[PLAN.run_name(layout, rate, arm.steps, seed, arm.tag)]['final'][metric]
    for seed in primary['finished_seeds']
  ]
  return sum(finals) / len(finals)


def test_phase_b_per_seed_differences():
  """Once every seed is in, the write-up lists P's per-seed differences and counts the seeds
  where RealFormer is ahead."""
  primary = _comparison('P')
  if primary['verdict'].startswith('pending'):
    return
  values = primary['comparison']['values']
  said, ahead, of = _find(
    r'RealFormer - Post-LN per seed \(2-7, \[MASK\], points\): ([^;]+); RealFormer is ahead in '
    r'(\d) of (\d)'
  )
  assert said == ', '.join(f'{100 * v:+.2f}' for v in values)
  assert (int(ahead), int(of)) == (sum(v > 0 for v in values), len(values))


def _phase_b_progress() -> tuple:
  """(finished, planned) runs of phase B once both rates are chosen: one run per distinct
  name (an arm at the rate another arm of its layout has adds none)."""
  names = {
    PLAN.run_name(arm.variant, _analysis()['rules'][arm.rate]['value'], arm.steps, seed, arm.tag)
    for group in PLAN.arms
    for arm in group
    for seed in arm.seeds
  }
  finished = sum(
    'eval_mask_accuracy' in _results().get(name, {})
    and bool(_results()[name]['eval_mask_accuracy'])
    for name in names
  )
  return finished, len(names)


def test_the_committed_report_is_what_the_documented_command_writes(tmp_path):
  """`python -m experiments.study --plan=tuned_rates --runs=none` (here into tmp_path) writes
  the committed results.md, and every picture that it links."""
  from realformer_jax.commands import study as study_command  # pylint: disable=import-outside-toplevel

  study_command.main(
    ['--plan=tuned_rates', '--runs=none', f'--out={tmp_path}', f'--store={PLAN.store}']
  )
  written = (tmp_path / 'results.md').read_text()
  assert written == open(os.path.join(PLAN.out, 'results.md')).read()
  for picture in re.findall(r'\]\((\w+\.png)\)', written):
    assert (tmp_path / picture).is_file(), picture


def test_where_a_best_rate_sits_so_far():
  """While a grid runs the text may say where a layout's best finished rate sits and by how
  much it leads the next: recomputed from the seed 0-1 means (in points)."""
  for layout, rule in _rules().items():
    match = re.search(
      rf"{NAMES[layout]}'s best so far is at (\S+), the top of its grid \(by (\S+) points over "
      r'(\S+),',
      _text(),
    )
    if match is None:
      continue
    means = {
      float(k): sum(v) / len(v)
      for k, v in rule['per_rate'].items()
      if v and all(x is not None for x in v)
    }
    ranked = sorted(means, key=means.get, reverse=True)
    assert float(match[1]) == ranked[0] and float(match[3]) == ranked[1]
    assert match[2] == f'{100 * (means[ranked[0]] - means[ranked[1]]):.2f}'
    assert ranked[0] == max(float(k) for k in rule['per_rate'] if float(k) in means)


# ------------------------------------------------------------------------------------------
# Issue 66: what the lead says of P's resolution, the rate, the budget, power and S1's parts.


def _paired(key: str) -> stats.PairedComparison:
  c = _comparison(key)['comparison']
  return stats.PairedComparison(
    c['mean'],
    c['ci95_half_width'],
    c['p_value'],
    c['n'],
    tuple(c['values']),
    c['seed_se'],
    c['eval_se'],
  )


def test_the_lead_says_why_p_is_inconclusive():
  """Every seed on one side (the seeds alone: a t-test of the per-seed values), and a held-out
  sampling error above the seeds' that no number of seeds removes."""
  p = _paired('P')
  values = np.asarray(p.per_seed)
  seeds_only = stats.t_p_value(values.mean(), values.std(ddof=1) / math.sqrt(p.n), p.n - 1)
  said = _find(
    r'Every one of the six seeds puts Post-LN ahead \(the seeds alone: p (\S+)\).*?'
    r'sampling error of (\S+) points on the difference, more than the seeds\' (\S+), .*?'
    r'brings the detectable difference below (\S+) points',
    _lead(),
  )
  assert all(v < 0 for v in values)
  # Infinitely many seeds: only the held-out SE is left; the normal quantiles of 80% power.
  floor = (stats.t_quantile(0.975, 1e9) + stats.t_quantile(0.8, 1e9)) * p.eval_se
  assert said == (
    f'{seeds_only:.2g}',
    f'{100 * p.eval_se:.2f}',
    f'{100 * p.seed_se:.2f}',
    f'{100 * floor:.2f}',
  )
  assert p.eval_se > p.seed_se


def _sums(name: str, metric: str = 'mask_accuracy'):
  return analysis_lib._sums(_results()[name], metric)


def test_the_rate_did_not_demonstrably_move_the_gap():
  """gap(2.83e-3) - gap(2e-3), [MASK], matched seeds 2-7: a trend across rates, tested as the
  depth plan tests one across depths ((a + b2) - (b + a2), sequence by sequence)."""
  plus, minus = [], []
  for seed in _comparison('P')['seeds']:
    name = lambda rate, layout: f'b4800-lr{rate}-{layout}-s{seed}'
    plus.append(_sums(name(0.00283, 'realformer'))[0] + _sums(name(0.002, 'post'))[0])
    minus.append(_sums(name(0.00283, 'post'))[0] + _sums(name(0.002, 'realformer'))[0])
  count = _sums(f'b4800-lr0.002-post-s{_comparison("P")["seeds"][0]}')[1]
  change = stats.paired_ratio_comparison(np.stack(plus), np.stack(minus), count)
  mean, half, p = _find(
    r'changes by (\S+) ± (\S+) points on matched seeds 2-7 \(p (\S+)\)', _lead()
  )
  assert (mean, half) == (f'{100 * change.mean:+.2f}', f'{100 * change.half_width:.2f}')
  assert p == f'{change.p_value:.2g}'
  assert f'+{mean.lstrip("+")} ± {half} points on matched seeds 2-7 (p {p})' in _text()


def _parts_by_kind(pairs) -> dict[str, str]:
  """RealFormer - Post-LN all-position accuracy in parts, as the text writes them: each kind of
  selected position's accuracy difference times its share of the predictions, mean over the
  (RealFormer, Post-LN) metric pairs, one a seed."""
  part = {}
  for kind in ('kept', 'mask', 'random'):
    values = [
      real[f'{kind}_predictions']
      / real['predictions']
      * (real[f'{kind}_accuracy'] - post[f'{kind}_accuracy'])
      for real, post in pairs
    ]
    part[kind] = f'{100 * np.mean(values):+.2f}'
  return part


def test_s1_in_parts_by_the_kind_of_selected_position():
  """Each kind's accuracy difference times its share of the predictions, means over seeds 2-7:
  the parts add up to S1."""
  seeds = _comparison('S1')['seeds']
  rate = _analysis()['rules']['r_post']['value']
  part = _parts_by_kind(
    [
      tuple(
        _results()[PLAN.run_name(layout, rate, 4800, seed)]['final']
        for layout in ('realformer', 'post')
      )
      for seed in seeds
    ]
  )
  said = _find(
    r'the kept tokens give (\S+) of S1\'s points, the \[MASK\] slots (\S+) and the random '
    r'replacements (\S+)\.',
    _lead(),
  )
  assert said == (part['kept'], part['mask'], part['random'])


def test_the_gap_depends_on_the_budget():
  """[MASK] gap per evaluation step at the chosen rate, mean over seeds 2-7: RealFormer ahead
  at the first evaluations, behind from the step the text names on."""
  rate = _analysis()['rules']['r_post']['value']
  seeds = _comparison('P')['seeds']
  curve = lambda layout, seed: dict(
    map(tuple, _results()[PLAN.run_name(layout, rate, 4800, seed)]['eval_mask_accuracy'])
  )
  steps = sorted(curve('post', seeds[0]))
  gap = {
    step: np.mean([curve('realformer', s)[step] - curve('post', s)[step] for s in seeds])
    for step in steps
  }
  first, second, behind = _find(
    r'RealFormer is ahead at 600 and 1,200 steps \((\S+) and (\S+) points at\s+2.83e-3, '
    r'seeds 2-7\) and behind from (\S+) steps on',
    _lead(),
  )
  assert (first, second) == (f'{100 * gap[600]:+.2f}', f'{100 * gap[1200]:+.2f}')
  assert all(gap[s] < 0 for s in steps if s >= int(behind.replace(',', '')))
  assert gap[600] > 0 and gap[1200] > 0


def test_the_power_for_the_papers_gains():
  """S1's design (all positions, the paper's metric) against each of the paper's gains."""
  power = {k: stats.power(_paired('S1'), g) for k, g in budgets.PAPER_GAINS.items()}
  low, high, xlarge = _find(
    r'the design has (\d+)-(\d+)% power for the\s+paper\'s Small, Base and Large gains.*?'
    r'and (\d+)% for\s+xLarge',
    _lead(),
  )
  small = [power[k] for k in ('Small', 'Base', 'Large')]
  assert (int(low), int(high)) == (round(100 * min(small)), round(100 * max(small)))
  assert int(xlarge) == round(100 * power['xLarge'])


def test_the_lead_says_how_far_the_depth_study_is():
  plan = depth.PLANS['cpu']
  new = [run.name for run in plan.runs({}) if run.name.startswith('L')]
  finished = sum(os.path.isfile(os.path.join(plan.store, 'runs', f'{n}.json')) for n in new)
  done, of = _find(r'It has finished (\d+) of (\d+) new runs', _lead())
  assert (int(done), int(of)) == (finished, len(new))
  status = _section('### Does RealFormer', '### Post-LN vs Pre-LN vs RealFormer')
  assert f'**Status**: {finished} of {len(new)} new runs finished' in status


@functools.cache
def _depth_analysis() -> dict:
  plan = depth.PLANS['cpu']
  return analysis_lib.analyse(plan, runs.all_results(plan.store))


def _depth_status() -> str:
  return _section('**Status**: ', '### Post-LN vs Pre-LN vs RealFormer')


def _depth_row(key: str) -> dict:
  (row,) = [row for row in _depth_analysis()['comparisons'] if row['key'] == key]
  return row


def _holm(p: float) -> str:
  return f'{p:.2g}'


def test_the_depth_studys_trend_and_gaps_as_the_text_states():
  """T with its p, one-draw figure and detectable trend; S1-S3 with their Holm p and
  verdicts, in the status and the lead (every run of both depths is committed)."""
  t = _depth_row('T')
  assert t['verdict'] == 'inconclusive'
  mean, half = _points(t['comparison'])
  p = f'{t["comparison"]["p_value"]:.2f}'
  one_draw = _points(t['first_draw'])
  detectable = f'{100 * t["detectable"]:.2f}'
  assert (
    f'T {mean} ± {half} points (p {p}): inconclusive (the first mask draw alone: '
    f'{one_draw[0]} ± {one_draw[1]}; detectable with 80% power: {detectable} points)'
  ) in _depth_status()
  assert f'T = {mean} ± {half} points (p {p})' in _lead()
  low, high = (100 * t['comparison'][k] for k in ('low', 'high'))
  assert f'an interval from a {-low:.2f}-point fall to a {high:.2f}-point rise' in _lead()
  assert f'The design detects {detectable} points with 80% power' in _lead()
  s1, s2, s3 = map(_depth_row, ('S1', 'S2', 'S3'))
  assert [r['verdict'] for r in (s1, s2, s3)] == ['does not hold', 'inconclusive', 'does not hold']
  said = _find(
    r'S3 \(6 layers\) (\S+) ± (\S+) points \(Holm p (\S+)\) and S1 \(24 layers\) (\S+) ± (\S+) '
    r'\(Holm p (\S+)\): do not hold; at \[MASK\], 24 layers, S2 (\S+) ± (\S+) \(Holm p (\S+)\): '
    r'inconclusive',
    _depth_status(),
  )
  want = ()
  for row in (s3, s1, s2):
    want += (*_points(row['comparison']), _holm(row['holm_p_value']))
  assert said == want
  lead = _find(
    r'\(S3 (\S+) ± (\S+) points at 6 layers, S1 (\S+) ± (\S+) at 24: does not hold\).*?'
    r'ahead by (\S+) ± (\S+) points \(S2: inconclusive\)',
    _lead(),
  )
  assert lead == (
    *_points(s3['comparison']),
    *_points(s1['comparison']),
    *_points(s2['comparison']),
  )


@pytest.mark.parametrize('layers', [6, 24])
def test_the_depth_studys_attention_as_the_text_states(layers):
  """Each depth's three statements from the committed attention analysis (its reproduction
  from the per-model JSON: tests/studies/test_committed_attention_study.py)."""
  path = 'docs/results/compare_layouts/depth/attention/results.json'
  claims = json.load(open(path))['summary']['tags'][f'L{layers}-']['claims']
  status = _depth_status()
  sentence = status[status.index(f'At {layers} layers: 5a') :].split('. ')[0]
  for row in claims:
    key = row['key'].removeprefix(f'L{layers}-')
    digits = 3 if key == '5c' else 2
    d = row['difference']
    holm = row['holm_p_value']
    stated = _find(
      rf'{key} [a-zA-Z -]*?([+-]\d\.\d+) ± (\d\.\d+) nats \(Holm p ([\d.e-]+), ([a-z ]+)\)',
      sentence,
    )
    assert stated == (
      f'{d["mean"]:+.{digits}f}',
      f'{d["ci95_half_width"]:.{digits}f}',
      f'{holm:.1g}' if holm < 0.01 else f'{holm:.3f}',
      row['verdict'],
    ), key


def _depth_pairs(layers: int) -> list[tuple[dict, dict]]:
  """(RealFormer, Post-LN) 4-draw held-out metrics of one depth, one pair a seed."""
  results = runs.all_results(depth.PLANS['cpu'].store)
  return [
    tuple(
      results[f'L{layers}-b4800-lr0.002-{layout}-s{seed}']['scored']['metrics']
      for layout in ('realformer', 'post')
    )
    for seed in range(2, 8)
  ]


@pytest.mark.parametrize(
  'layers, key, sentence',
  [
    (
      6,
      'S3',
      r'at 6 layers the \[MASK\] slots give (?P<mask>\S+) of S3\'s points, the kept tokens '
      r'(?P<kept>\S+) and the random replacements (?P<random>\S+);',
    ),
    (
      24,
      'S1',
      r'at 24 layers the kept tokens give (?P<kept>\S+) of S1\'s points, the \[MASK\] slots '
      r'(?P<mask>\S+) and the random replacements (?P<random>\S+),',
    ),
  ],
)
def test_each_depths_gap_in_parts_by_the_kind_of_selected_position(layers, key, sentence):
  """As S1's parts above, from the 4-draw scoring of each depth's runs: the parts add up to
  the gap the text splits."""
  part = _parts_by_kind(_depth_pairs(layers))
  said = re.search(sentence, _depth_status())
  assert said, sentence
  assert said.groupdict() == part
  total = sum(map(float, part.values()))
  assert total == pytest.approx(100 * _depth_row(key)['comparison']['mean'], abs=0.015)


def test_the_24_layer_kept_token_accuracies():
  pairs = _depth_pairs(24)
  real, post = (f'{100 * np.mean([p[i]["kept_accuracy"] for p in pairs]):.1f}' for i in (0, 1))
  said = f"RealFormer predicts {real}% of the kept tokens against Post-LN's {post}%"
  assert said in _depth_status()

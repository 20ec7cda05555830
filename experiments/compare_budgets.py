r"""RealFormer vs Post-LN at longer budgets: do P1 or claim 4 change when the curves flatten?

    python -m experiments.compare_budgets --runs='*-s[0246]' &   # split over 2 cores: one
    python -m experiments.compare_budgets --runs='*-s[1357]'     # process per half of the seeds
    python -m experiments.compare_budgets --runs=none            # then: the report (no training)
    python -m experiments.compare_budgets --quick --out=/tmp/cb --workdirs=/tmp/cb_runs

compare_layouts' 600 steps measure early learning speed: RealFormer leads at step 200, Post-LN
catches up by step 600, and P1's interval (4 seeds) was wider than every effect the paper
reports. This study repeats P1 and claim 4 with the same model and data (compare_layouts'
12 x 64 RoPE recipe, `compare_layouts.PLANS['cpu'].scale`) at several budgets, with more seeds
and the whole held-out split scored (`eval_batches=-1`).

Plan, declared before any run (the code below follows it; `plan_runs`):
  1. rate      Post-LN at the longest budget (2,400 steps) at compare_layouts' r* (2e-3) and its
               neighbours 1e-3 and 4e-3, seeds 0 and 1. r_L = the best of the three (highest
               mean [MASK] accuracy; a diverged run scores 0; ties: the smaller rate). Every
               run below uses r_L, at every budget (one rate for the whole study).
  2. budgets   Post-LN and RealFormer at r_L with budgets of 2,400, 1,200 and 600 steps (each
               its own schedule: 10% warmup, linear decay to 0 at the budget), seeds 0-7, then
               RealFormer at 300 steps (claim 4 at 600). In that order of priority: the longest
               budget first, seeds interleaved so that pairs finish together.
  3. longer    4,800 steps (Post-LN and RealFormer, seeds 0-7) only if the curves have not
               flattened at 2,400: the mean [MASK] accuracy over both layouts and every seed
               gains >= 1.0 point from the 1,200 to the 2,400 budget (a doubling that still pays
               as much as the effects in question).
Seeds: the paired differences' SD at 600 steps was ~0.83 points; with 8 seeds the 95%
half-width t_7 * 0.83 / sqrt(8) ~ 0.69 points (<= 0.8, the target), before the eval set's
share. Runs are named `b<steps>-lr<rate>-<layout>-s<seed>` and one run serves every
comparison it belongs to (RealFormer at 1,200 steps is P1's at 1,200 and claim 4's at 2,400).

Comparisons per budget B, [MASK] accuracy, paired by seed (95% intervals adding the seeds'
variance and the eval set's: stats.paired_ratio_comparison):
  P1  RealFormer(B) - Post-LN(B)          (paper: RealFormer better)
  S7  RealFormer(B / 2) - Post-LN(B)      (claim 4: RealFormer on half the schedule is better)
The six (two per budget) are one Holm-corrected family (eight once step 3 adds its budget: every
comparison of the plan's budgets). Verdicts by compare_layouts' rule:
"not testable at this scale" when no run on either side learned (study.learned), else "holds" /
"does not hold" when the adjusted p-value is below 0.05 with the paper's / the opposite sign,
else "inconclusive". Power: the smallest difference the budget's design detects with 80%
power at two-sided 5% (stats.detectable_difference, from the measured SD of the differences).
Reported since (issue 44, after the results of steps 1-2): that power also at the level Holm's
step-down tested each comparison at (stats.holm_levels), the power for the paper's masked-LM
gains (PAPER_GAINS), and "pending (k of 8 seeds)" as the verdict of a comparison whose seeds
are not all finished (the numbers shown are then interim). Seed 1 was never run at 600 and
1,200 steps nor for RealFormer at 2,400 (no file was dropped): the committed verdicts rest on
seeds 0 and 2-7 until it finishes (launched with compare_stability, which shares the runs).

The tokenizer: runs until 2026-11-26 trained theirs (SentencePiece, 4 threads) on their machine;
every run since loads `TOKENIZER`, the one the first runs of 2026-11-27 trained, committed
beside the results. A tokenizer trained again can relabel its ids (its piece scores depend on
floating-point detail), which moved the new runs' step-1 loss beyond the recipe check's
tolerance from the earlier runs of the same seed (by how much: docs/experiments.md, "Seed 1
came from another machine"); each run's JSON records its tokenizer digest (`origin`) and the
report's recipe check names the seeds whose runs disagree.

Writes to --out (default docs/results/compare_layouts/budgets/): results.md, results.json,
curves.png (learning curves, the budgets marked), comparisons.png, runs/*.json (one per
finished run, with per-sequence sums). Workdirs go to --workdirs (default
results/compare_budgets/); a run resumes from its checkpoints and a finished run is never
trained again.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any, Optional, Sequence

import numpy as np

from experiments import compare_layouts
from studies import runs as runs_lib
from studies import stats, study
from studies.report import LAYOUT_COLORS, LAYOUT_NAMES, comparison_cells, seed_cell, write_lines

LAYOUTS = ('post', 'realformer')

# The paper's masked-LM accuracy after 1M steps, Post-LN and RealFormer (docs/design.md §5):
# the gains this study's power is stated against.
PAPER_MLM = {
  'Small': (0.6157, 0.6170),
  'Base': (0.7020, 0.7042),
  'Large': (0.7364, 0.7394),
  'xLarge': (0.7372, 0.7476),
}
PAPER_GAINS = {size: real - post for size, (post, real) in PAPER_MLM.items()}


@dataclasses.dataclass(frozen=True)
class Plan:
  scale: study.Scale
  budgets: tuple[int, ...]  # ascending; the last is the longest of step 2
  longer: int  # step 3's budget
  rates: tuple[float, ...]  # step 1's grid; the first is compare_layouts' r*
  rate_seeds: tuple[int, ...]
  seeds: tuple[int, ...]
  flattened_gain: float = 0.01  # step 3's rule, [MASK] accuracy (fraction)


def _scale(base: study.Scale, **changes) -> study.Scale:
  return dataclasses.replace(base, eval_batches=-1, **changes)


def _scored_on(scale: study.Scale) -> str:
  """What each run is scored on, for the reports."""
  if scale.eval_batches == -1:
    return 'the whole held-out split'
  return f'{scale.eval_batches} held-out batches of {scale.batch}'


# The tokenizer of every run trained since 2026-11-27 (the seed-1 runs and the 4,800-step
# budget): the one those first runs trained (4 threads), committed so that runs of later days
# and machines start where they did. The earlier runs trained their own; its file is lost
# (module docstring: "Seed 1 came from another machine").
TOKENIZER = 'docs/results/compare_layouts/budgets/tokenizer/bible_web-unigram-2000.model'
TOKENIZER_SHA256 = '885a1796363319c43cde34e473c499c7010ca13a891cf162dc64dffccda387db'

PLANS = {
  # 2 CPU cores, one process per core: ~0.45 s a step, ~18 min a 2,400-step run.
  'cpu': Plan(
    _scale(compare_layouts.PLANS['cpu'].scale, evals=8, tokenizer=TOKENIZER),
    budgets=(600, 1200, 2400),
    longer=4800,
    rates=(2e-3, 1e-3, 4e-3),
    rate_seeds=(0, 1),
    seeds=tuple(range(8)),
  ),
  # The smoke test: seconds a run. It scores the toy scale's 2 held-out batches, not the whole
  # split (~190 batches at sequence 32, scored at every evaluation and again per sequence: most
  # of a toy run's time).
  'toy': Plan(
    compare_layouts.PLANS['toy'].scale,
    budgets=(2, 4),
    longer=8,
    rates=(3e-3,),
    rate_seeds=(0,),
    seeds=(0, 1),
  ),
}


def run_name(steps: int, rate: float, layout: str, seed: int) -> str:
  return f'b{steps}-lr{rate:g}-{layout}-s{seed}'


def _run(steps: int, rate: float, layout: str, seed: int) -> runs_lib.Run:
  params = dict(steps=steps, learning_rate=rate, layout=layout, seed=seed)
  return runs_lib.Run(run_name(steps, rate, layout, seed), params, cost=steps)


def _mask_accuracy(run: Optional[dict]) -> float:
  return compare_layouts._final(run, 'mask_accuracy', 0.0)  # pylint: disable=protected-access


def long_rate(results: dict, plan: Plan) -> Optional[float]:
  """Step 1: r_L, or None until every rate run finished."""
  means = []
  for rate in plan.rates:
    runs = [results.get(run_name(plan.budgets[-1], rate, 'post', s)) for s in plan.rate_seeds]
    if any(r is None for r in runs):
      return None
    means.append(np.mean([_mask_accuracy(r) for r in runs]))
  best = max(means)
  return min(rate for rate, mean in zip(plan.rates, means) if mean == best)


def flattening_gain(
  results: dict,
  plan: Plan,
  rate: float,
  partial: bool = False,
  between: Optional[tuple[int, int]] = None,
) -> Optional[float]:
  """Step 3's rule: the mean [MASK] accuracy at the longest budget minus at the one before
  (or at the two budgets `between`), over both layouts and every seed; None until all those
  runs finished (`partial`: over the runs finished so far, None while a budget has none)."""
  means = []
  for steps in between or plan.budgets[-2:]:
    runs = [results.get(run_name(steps, rate, l, s)) for l in LAYOUTS for s in plan.seeds]
    if any(r is None for r in runs) and not partial:
      return None
    runs = [r for r in runs if r is not None]
    if not runs:
      return None
    means.append(np.mean([_mask_accuracy(r) for r in runs]))
  return float(means[1] - means[0])


def longer_budget(results: dict, plan: Plan, rate: float) -> dict:
  """Step 3's state: 'required' / 'not required' by the rule on every run, or 'pending' with
  the gain of the runs finished so far (and whether it already passes the threshold)."""
  gain = flattening_gain(results, plan, rate)
  if gain is not None:
    state = {'state': 'required' if gain >= plan.flattened_gain else 'not required', 'gain': gain}
    if state['state'] == 'required':
      # Descriptive (the plan has no budget beyond step 3's): what that doubling gained.
      between = (plan.budgets[-1], plan.longer)
      state['gain_after'] = flattening_gain(results, plan, rate, partial=True, between=between)
      state['after_complete'] = flattening_gain(results, plan, rate, between=between) is not None
    return state
  partial = flattening_gain(results, plan, rate, partial=True)
  runs = sum(
    run_name(steps, rate, l, s) in results
    for steps in plan.budgets[-2:]
    for l in LAYOUTS
    for s in plan.seeds
  )
  return {
    'state': 'pending',
    'gain': partial,
    'finished_runs': runs,
    'planned_runs': 2 * len(LAYOUTS) * len(plan.seeds),
    'passes_so_far': partial is not None and partial >= plan.flattened_gain,
  }


def _budget_runs(steps: int, rate: float, seeds) -> list[runs_lib.Run]:
  return [_run(steps, rate, layout, s) for s in seeds for layout in ('realformer', 'post')]


def budgets(results: dict, plan: Plan) -> tuple[int, ...]:
  """The budgets the plan compares: step 2's, and step 3's once its rule says so."""
  rate = long_rate(results, plan)
  gain = None if rate is None else flattening_gain(results, plan, rate)
  return plan.budgets + ((plan.longer,) if gain is not None and gain >= plan.flattened_gain else ())


def plan_runs(results: dict, plan: Plan) -> list[runs_lib.Run]:
  """Every run of the plan the results so far define, in priority order (module docstring)."""
  longest = plan.budgets[-1]
  runs = [_run(longest, r, 'post', s) for r in plan.rates for s in plan.rate_seeds]
  rate = long_rate(results, plan)
  if rate is not None:
    for steps in reversed(plan.budgets):
      runs += _budget_runs(steps, rate, plan.seeds)
    runs += [_run(plan.budgets[0] // 2, rate, 'realformer', s) for s in plan.seeds]
    if plan.longer in budgets(results, plan):
      runs += _budget_runs(plan.longer, rate, plan.seeds)
  unique = {}
  for run in runs:
    unique.setdefault(run.name, run)
  return list(unique.values())


def train_one(plan: Plan, args, run: runs_lib.Run, report: runs_lib.Report) -> dict:
  """Trains and scores one run; of the plan it reads `scale` only (compare_stability passes
  its own plan, at the same scale)."""
  p = run.params
  config = study.mlm_config(
    plan.scale,
    seed=p['seed'],
    learning_rate=p['learning_rate'],
    data_dir=args.data_dir,
    steps=p['steps'],
    # Fully unrolled layer scan: ~25% faster steps for this deep, narrow model on CPU.
    model=dict(compare_layouts.LAYOUTS[p['layout']], scan_unroll=plan.scale.layers),
  )
  # Long runs keep a checkpoint every ~5 minutes of this machine: a fault loses little.
  config.train.checkpoint_every_steps = min(config.train.checkpoint_every_steps, 600)
  workdir = os.path.join(args.workdirs, run.name)
  result = study.train_run(config, workdir, report, progress_share=0.95)
  result['params'] = dict(p)
  if result['diverged_at_step'] is None:
    report(0.95, 'scoring per sequence')
    result['scored'] = study.score_workdir(workdir)
  return result


# ------------------------------------------------------------------------------------------
# Analysis.


@dataclasses.dataclass(frozen=True)
class Comparison:
  key: str
  label: str
  a: tuple[str, float]  # (layout, fraction of the budget)
  b: tuple[str, float]
  expected: int  # the paper's sign: +1 a > b


COMPARISONS = (
  Comparison('P1', 'RealFormer - Post-LN', ('realformer', 1.0), ('post', 1.0), +1),
  Comparison(
    'S7', 'RealFormer (half the steps) - Post-LN (claim 4)', ('realformer', 0.5), ('post', 1.0), +1
  ),
)


def _side(results: dict, plan: Plan, rate: float, steps: int, side: tuple) -> dict[int, dict]:
  layout, fraction = side
  name = lambda s: run_name(int(steps * fraction), rate, layout, s)
  return {s: results[name(s)] for s in plan.seeds if name(s) in results}


def compare(results: dict, plan: Plan, rate: float, steps: int, comparison: Comparison) -> dict:
  """One comparison at one budget, paired by seed, with what its verdict and power need."""
  side_a = _side(results, plan, rate, steps, comparison.a)
  side_b = _side(results, plan, rate, steps, comparison.b)
  row = {
    'key': comparison.key,
    'label': comparison.label,
    'budget': steps,
    'primary': True,  # compare_layouts.verdict's rule without its secondary branch
    'expected_sign': comparison.expected,
    'learned': {
      'a': [bool(r.get('learned')) for r in side_a.values()],
      'b': [bool(r.get('learned')) for r in side_b.values()],
    },
    'comparison': None,
  }
  seeds, row['diverged'], result = study.paired_mask_accuracy(
    side_a, side_b, f'{comparison.label} at {steps} steps'
  )
  if result is None:
    return row
  row['comparison'] = result.as_dict()
  row['seeds'] = seeds
  row['detectable'] = stats.detectable_difference(result)
  return row


def analyse(results: dict, plan: Plan) -> dict:
  rate = long_rate(results, plan)
  analysis: dict[str, Any] = {'rate_grid': rate_table(results, plan), 'rate': rate, 'rows': []}
  if rate is None:
    return analysis
  longer = longer_budget(results, plan, rate)
  analysis['longer'] = longer
  analysis['flattening_gain'] = longer['gain'] if longer['state'] != 'pending' else None
  # The budgets reported: the plan's, and the longer one once the rule requires it or the
  # runs finished so far already pass it (then its rows say pending).
  shown = budgets(results, plan)
  if longer['state'] == 'pending' and longer['passes_so_far']:
    shown += (plan.longer,)
  analysis['budgets'] = list(shown)
  rows = [compare(results, plan, rate, b, c) for b in analysis['budgets'] for c in COMPARISONS]
  tested = [r for r in rows if r['comparison']]
  p_values = [r['comparison']['p_value'] for r in tested]
  for row, p, level in zip(tested, stats.holm(p_values), stats.holm_levels(p_values)):
    row['holm_p_value'] = p
    row['holm_level'] = level
    add_power(row)
  for row in rows:
    complete = len(row.get('seeds', [])) == len(plan.seeds)
    row['verdict'] = (
      compare_layouts.verdict(row, row.get('holm_p_value', math.nan))
      if complete
      else f'pending ({len(row.get("seeds", []))} of {len(plan.seeds)} seeds)'
    )
  analysis['rows'] = rows
  analysis['recipe_check'] = recipe_check(results, plan.seeds)
  analysis['per_budget'] = {
    str(b): {layout: _per_seed(results, plan, rate, b, layout) for layout in LAYOUTS}
    for b in analysis['budgets'] + [plan.budgets[0] // 2]
  }
  return analysis


RECIPE_TOLERANCE = 1e-3  # step-1 loss spread of one seed and layout that counts as one recipe


def recipe_check(results: dict, seeds: Sequence[int]) -> dict:
  """Per seed and layout: the spread of the step-1 training loss (taken before the first
  update, so it does not depend on the rate or the budget) over every run of `results` with
  that seed and layout: 0 up to float noise when the runs share weights, first batch and
  dropout (the recipe), whichever process or day trained them.
  'beyond' lists the seeds and layouts whose spread exceeds RECIPE_TOLERANCE, each with the
  machines its runs were trained on (`machine_of`); 'mixed' lists those whose runs come from
  more than one machine, whatever their spread: runs trained on another machine than the
  committed ones start away from them, by less than the tolerance for some seeds
  (docs/experiments.md, "Seed 1 came from another machine"), so the tolerance alone does not
  find every mix."""
  spread, beyond, mixed = {}, {}, {}
  for layout in LAYOUTS:
    for seed in seeds:
      suffix = f'-{layout}-s{seed}'
      runs = {
        name: run
        for name, run in results.items()
        if name.endswith(suffix) and run.get('train_loss')
      }
      first = [run['train_loss'][0][1] for run in runs.values()]
      if not first:
        continue
      key = f'{layout}-s{seed}'
      spread[key] = {'runs': len(first), 'spread': max(first) - min(first)}
      by_machine = {}
      for name, run in sorted(runs.items()):
        by_machine.setdefault(machine_of(run), []).append(name)
      if spread[key]['spread'] > RECIPE_TOLERANCE:
        beyond[key] = by_machine
      if len(by_machine) > 1:
        mixed[key] = by_machine
  return {
    'max_spread': max((v['spread'] for v in spread.values()), default=0.0),
    'tolerance': RECIPE_TOLERANCE,
    'per': spread,
    'beyond': beyond,
    'mixed': mixed,
  }


def machine_of(run: dict) -> str:
  """The machine a run's result records (study.origin), 'not recorded' for a run finished
  before results recorded it (before 2026-11-27's seed-1 runs)."""
  machine = (run.get('origin') or {}).get('machine')
  if not machine:
    return 'not recorded'
  return f'{machine.get("cpu")} ({machine.get("simd")}, {machine.get("libc")})'


def recipe_line(check: dict) -> str:
  runs = sum(v['runs'] for v in check['per'].values())
  line = (
    f'Recipe check: the step-1 training loss per seed and layout spreads by at most '
    f'{check["max_spread"]:.1e} over {runs} runs (tolerance {check["tolerance"]:.0e}: same '
    'weights, first batch and dropout).'
  )
  for key, by_machine in sorted(check['beyond'].items()):
    spread = check['per'][key]['spread']
    where = '; '.join(f'{m}: {", ".join(names)}' for m, names in sorted(by_machine.items()))
    line += f' **{key} spreads by {spread:.1e}, beyond it**, by machine: {where}.'
  within = sorted(set(check['mixed']) - set(check['beyond']))
  if within:
    spreads = ', '.join(f'{key} by {check["per"][key]["spread"]:.1e}' for key in within)
    line += f' Within it but trained on more than one machine: {spreads}.'
  return line


def add_power(row: dict) -> None:
  """The design's power under the level Holm's step-down actually tested the row at: the
  detectable difference (80% power) there and unadjusted, and the power for the paper's
  masked-LM gains (PAPER_GAINS)."""
  c = stats.PairedComparison(
    **{k: row['comparison'][k] for k in ('mean', 'p_value', 'n', 'seed_se', 'eval_se')},
    half_width=row['comparison']['ci95_half_width'],
    per_seed=tuple(row['comparison']['values']),
  )
  level = 1 - row['holm_level']
  row['detectable_holm'] = stats.detectable_difference(c, level=level)
  row['power_paper_gains'] = {
    size: {'holm': stats.power(c, gain, level), 'unadjusted': stats.power(c, gain)}
    for size, gain in PAPER_GAINS.items()
  }


def _per_seed(results: dict, plan: Plan, rate: float, steps: int, layout: str) -> dict:
  runs = [results.get(run_name(steps, rate, layout, s)) for s in plan.seeds]
  runs = [r for r in runs if r is not None]
  return {
    'seeds': [r['params']['seed'] for r in runs],
    'mask_accuracy': [compare_layouts._final(r, 'mask_accuracy') for r in runs],  # pylint: disable=protected-access
    'loss': [compare_layouts._final(r, 'loss') for r in runs],  # pylint: disable=protected-access
    'learned': [bool(r.get('learned')) for r in runs],
  }


def rate_table(results: dict, plan: Plan) -> dict:
  """Step 1 per rate: the Post-LN runs' final [MASK] accuracy (None: not finished)."""
  return {
    f'{rate:g}': [
      compare_layouts._final(
        results.get(run_name(plan.budgets[-1], rate, 'post', s)), 'mask_accuracy'
      )  # pylint: disable=protected-access
      if run_name(plan.budgets[-1], rate, 'post', s) in results
      else None
      for s in plan.rate_seeds
    ]
    for rate in plan.rates
  }


# ------------------------------------------------------------------------------------------
# Report.


def _points(c: Optional[dict], key: str = 'mean') -> str:
  return 'n/a' if c is None else f'{100 * c[key]:+.2f}'


def write_markdown(path: str, results: dict, analysis: dict, plan: Plan, command: str) -> None:
  scale = plan.scale
  predictions = next((r['scored']['metrics'] for r in results.values() if r.get('scored')), {})
  floors = compare_layouts.floors_of(results)
  lines = [
    '# RealFormer vs Post-LN at longer budgets: P1 and claim 4 per budget',
    '',
    f'Regenerate: `{command} --runs=none` (the report from the finished runs; without '
    '`--runs=none` it trains what is missing, split over processes with `--runs`: see the '
    "script, whose docstring declares the plan). compare_layouts' recipe: "
    f'{scale.layers} layers x {scale.hidden} hidden, {scale.heads} heads, FFN {scale.mlp}, '
    f'{scale.position_embedding} positions, sequence {scale.seq_len}, batch {scale.batch}, '
    'AdamW with 10% warmup and linear decay to 0 at each budget, dropout '
    f'{scale.dropout}; scored on {_scored_on(scale)} '
    f'({predictions.get("predictions", math.nan):,.0f} predictions, '
    f'{predictions.get("mask_predictions", math.nan):,.0f} at [MASK]); the floor at [MASK] '
    f'(most frequent token) is {100 * floors.get("mask_accuracy", math.nan):.2f}%.',
    '',
    f'## 1. The rate: Post-LN at {plan.budgets[-1]:,} steps, seeds {list(plan.rate_seeds)}',
    '',
    '| peak rate | final [MASK] accuracy (%) per seed |',
    '|---|---|',
  ]
  for rate, values in analysis['rate_grid'].items():
    cells = ', '.join('running' if v is None else f'{100 * v:.2f}' for v in values)
    lines.append(f'| {rate} | {cells} |')
  rate = analysis['rate']
  if rate is None:
    lines += ['', 'r_L is not known yet: step 1 is unfinished.', '']
    _write(path, lines)
    return
  first = plan.rates[0]
  lines += [
    '',
    f'r_L = {rate:g}'
    + (
      f" (compare_layouts' r*, still the best at {plan.budgets[-1]:,} steps)."
      if rate == first
      else f" (not compare_layouts' r* = {first:g}: the longer budget prefers another rate)."
    ),
    '',
    f'## 2. Final [MASK] accuracy (%) per budget at r_L (planned seeds {_seeds(plan.seeds)})',
    '',
    '| steps | Post-LN | RealFormer | seeds finished (Post-LN / RealFormer) | learned |',
    '|---|---|---|---|---|',
  ]
  for steps, row in sorted(analysis['per_budget'].items(), key=lambda kv: int(kv[0])):
    post, real = row['post'], row['realformer']
    cell = lambda side: seed_cell(side['mask_accuracy'], scale=100) if side['seeds'] else 'n/a'
    lines.append(
      f'| {int(steps):,} | {cell(post)} | {cell(real)} | {_seeds(post["seeds"])} / '
      f'{_seeds(real["seeds"])} | {sum(post["learned"])}/{len(post["learned"])} / '
      f'{sum(real["learned"])}/{len(real["learned"])} |'
    )
  lines += ['', _longer_line(analysis['longer'], plan), '', recipe_line(analysis['recipe_check'])]
  lines += [
    '',
    '## 3. Comparisons of [MASK] accuracy (percentage points), paired by seed',
    '',
    'Interval: 95%, seeds and eval-set sampling (bootstrap over held-out sequences). Holm p: '
    'the comparisons shown as one family; a comparison whose seeds are not all finished is '
    '"pending" (its numbers are interim). Detectable: the smallest difference this design '
    '(its seeds, its measured standard error) finds with 80% power, two-sided, at the level '
    "Holm's step-down tested it at (alpha / k) and unadjusted (5%).",
    '',
    '| budget | | comparison | paper expects | difference | p | Holm p | Holm level '
    '| detectable (Holm / 5%) | seeds | verdict |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for row in analysis['rows']:
    diff, p, holm = comparison_cells(row)
    level = f'0.05 / {round(0.05 / row["holm_level"])}' if 'holm_level' in row else 'n/a'
    detect = (
      f'{100 * row["detectable_holm"]:.2f} / {100 * row["detectable"]:.2f}'
      if 'detectable' in row
      else 'n/a'
    )
    lines.append(
      f'| {row["budget"]:,} | {row["key"]} | {row["label"]} | > 0 | {diff} | {p} | {holm} | '
      f'{level} | {detect} | {_seeds(row.get("seeds", []))} | {row["verdict"]} |'
    )
  powered = [r for r in analysis['rows'] if r['key'] == 'P1' and 'power_paper_gains' in r]
  if powered:
    sizes = list(PAPER_GAINS)
    lines += [
      '',
      "Power of P1 for the paper's masked-LM gains (RealFormer - Post-LN after 1M steps: "
      + ', '.join(f'{size} {100 * PAPER_GAINS[size]:+.2f}' for size in sizes)
      + ' points), at the Holm level / unadjusted:',
      '',
      '| budget | ' + ' | '.join(sizes) + ' |',
      '|---|' + '---|' * len(sizes),
    ]
    for row in powered:
      cells = [row['power_paper_gains'][size] for size in sizes]
      lines.append(
        f'| {row["budget"]:,} | '
        + ' | '.join(f'{100 * c["holm"]:.0f}% / {100 * c["unadjusted"]:.0f}%' for c in cells)
        + ' |'
      )
  lines += [
    '',
    '![[MASK] accuracy during training per budget](curves.png)',
    '',
    '![comparisons per budget with intervals](comparisons.png)',
    '',
  ]
  _write(path, lines)


def _seeds(seeds) -> str:
  """'0, 2-7': a seed list as ranges."""
  seeds, parts = sorted(seeds), []
  for seed in seeds:
    if parts and seed == parts[-1][1] + 1:
      parts[-1][1] = seed
    else:
      parts.append([seed, seed])
  return ', '.join(f'{a}' if a == b else f'{a}-{b}' for a, b in parts) or 'none'


def _longer_line(longer: dict, plan: Plan) -> str:
  rule = (
    f'(rule: a gain >= {100 * plan.flattened_gain:.1f} point from {plan.budgets[-2]:,} to '
    f'{plan.budgets[-1]:,} steps adds {plan.longer:,} steps)'
  )
  if longer['state'] != 'pending':
    line = (
      f'Flattening (step 3): doubling the budget to {plan.budgets[-1]:,} steps gained '
      f'{100 * longer["gain"]:+.2f} points {rule} -> '
      + (
        f'the {plan.longer:,}-step budget is required by the declared rule.'
        if longer['state'] == 'required'
        else 'no longer budget.'
      )
    )
    if longer.get('gain_after') is not None:
      runs = 'all its runs' if longer['after_complete'] else 'the runs finished so far'
      line += (
        f' Doubling again to {plan.longer:,} steps gained {100 * longer["gain_after"]:+.2f} '
        f'points ({runs}; descriptive: the plan has no budget beyond {plan.longer:,} steps).'
      )
    return line
  if longer['gain'] is None:
    return f'Flattening (step 3): not known yet {rule}; no run of the last two budgets finished.'
  so_far = (
    f'{100 * longer["gain"]:+.2f} points over the {longer["finished_runs"]} of '
    f'{longer["planned_runs"]} runs finished'
  )
  if longer['passes_so_far']:
    return (
      f'Flattening (step 3): {so_far} {rule} -> the {plan.longer:,}-step budget is required '
      'by the declared rule, pending (the rule is evaluated on every planned run: the '
      'missing ones are being trained).'
    )
  return f'Flattening (step 3): {so_far} {rule}; the rule waits for the missing runs.'


def _write(path: str, lines: list[str]) -> None:
  write_lines(path, lines)


def write_plots(out: str, results: dict, analysis: dict, plan: Plan) -> list[str]:
  plt = study.pyplot()
  rate = analysis['rate']
  if plt is None or rate is None:
    return []
  floors = compare_layouts.floors_of(results)
  paths = []
  # 1. Learning curves: one panel per budget, thin lines per seed, the mean thick; the
  # shorter budgets' ends marked on the longest panel.
  shown = [  # a budget with no finished run yet (a pending 4,800) gets no empty panel
    int(b)
    for b, sides in sorted(analysis['per_budget'].items(), key=lambda kv: int(kv[0]))
    if any(side['seeds'] for side in sides.values())
  ]
  fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 4.4), sharey=True)
  for ax, steps in zip(np.atleast_1d(axes), shown):
    for layout in LAYOUTS:
      study.plot_seed_curves(
        ax,
        results,
        (run_name(steps, rate, layout, s) for s in plan.seeds),
        LAYOUT_COLORS[layout],
        lambda n, layout=layout: f'{LAYOUT_NAMES[layout]}: mean of {n}',
        alpha=0.25,
      )
    for budget in shown:
      if budget < steps:
        ax.axvline(budget, color='gray', lw=0.6, ls='--')
    study.draw_floors(ax, floors, 'mask_accuracy')
    ax.set_xlabel('training step (dashed: the shorter budgets)')
    ax.set_title(f'budget {steps:,} steps, rate {rate:g}')
    ax.legend(fontsize=7)
  # Once every panel is drawn: the shared axis then spans them all (set per panel, it froze
  # at the first panel's top and cut the longer budgets off).
  np.atleast_1d(axes)[0].set_ylim(bottom=0)
  np.atleast_1d(axes)[0].set_ylabel('eval accuracy at [MASK] (%)')
  paths.append(study.save_figure(fig, os.path.join(out, 'curves.png'), dpi=100))
  # 2. The comparisons per budget: mean and 95% interval, each seed as x.
  rows = [r for r in analysis['rows'] if r['comparison']]
  if rows:
    paths.append(
      study.plot_comparisons(
        os.path.join(out, 'comparisons.png'),
        [r['comparison'] for r in rows],
        [f'{r["budget"]:,} steps, {r["key"]}: {r["label"]}' for r in rows],
        ['black' if r['key'] == 'P1' else 'tab:purple' for r in rows],
        xlabel='difference in [MASK] accuracy (percentage points; paper: > 0)',
        title='mean and 95% interval (seeds + eval-set bootstrap); x: each seed',
      )
    )
  return paths


def main(argv=None) -> dict:
  args = study.argument_parser(
    __doc__,
    out='docs/results/compare_layouts/budgets',
    workdirs='results/compare_budgets',
    scales=PLANS,
  ).parse_args(argv)
  plan, results = study.run_plan(args, PLANS, plan_runs, train_one)
  analysis = analyse(results, plan)
  record = {
    'scale': dataclasses.asdict(plan.scale),
    'plan': {k: v for k, v in dataclasses.asdict(plan).items() if k != 'scale'},
    'analysis': analysis,
    'runs': compare_layouts._summary_for_json(results),  # pylint: disable=protected-access
  }
  return study.write_plan_report(
    args, 'compare_budgets', record, results, analysis, plan, write_markdown, write_plots
  )


if __name__ == '__main__':
  main(sys.argv[1:])

"""A plan's results analysed by its declared rule (studies/plan.py): the rules' decisions, every
arm's runs, the comparisons with their intervals, p-values, Holm adjustment, power and
verdicts, and the recipe check.

    analysis = analyse(plan, results)   # JSON-ready; studies/plan_report.py writes it out
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from realformer_jax.studies import stats
from realformer_jax.studies.plan import METRICS, Arm, Comparison, Plan, Results, final_metric

# The spread of one seed and layout's step-1 training loss (before the first update: the same
# weights, first batch and dropout whatever the rate or budget) that still counts as one recipe.
RECIPE_TOLERANCE = 1e-3
# What an arm's table shows per run, besides the outcome flags.
ARM_METRICS = ('mask_accuracy', 'accuracy', 'loss', 'kept_accuracy', 'random_accuracy')


def analyse(plan: Plan, results: Results) -> dict:
  """Everything the report shows, from the finished runs `results` (by name)."""
  rules = {rule.name: rule.describe(plan, results) for rule in plan.rules}
  rows = [compare(plan, results, c) for c in plan.comparisons]
  rows = [row for row in rows if row is not None]
  adjust(plan, rows)
  analysis: dict[str, Any] = {
    'rules': rules,
    'arms': arms_table(plan, results),
    'comparisons': rows,
    'floors': floors_of(results),
    'recipe_check': recipe_check(plan_results(plan, results)),
  }
  if plan.conclude is not None:
    analysis['conclusions'] = plan.conclude(analysis)
  return analysis


def plan_results(plan: Plan, results: Results) -> dict[str, dict]:
  """The finished runs the plan lists (a store may hold other studies' runs too)."""
  return {run.name: results[run.name] for run in plan.runs(results) if run.name in results}


def floors_of(results: Results) -> dict:
  """The context-free floors of the eval set (the same for every run of a recipe)."""
  return next((r['floors'] for r in results.values() if r.get('floors')), {})


# ------------------------------------------------------------------------------------------
# Arms.


def all_arms(plan: Plan, results: Results) -> list[Arm]:
  """The rules' grids, then the plan's arms (planned or not yet); arms that resolve to the same
  layout, rate, budget and tag are one arm with the seeds of all (named by the declared arm's
  rule, if one has)."""
  arms = [arm for rule in plan.rules for arm in rule.needs(plan, results)] + plan.all_arms()
  merged: dict[tuple, Arm] = {}
  for arm in arms:
    rate = plan.rate(arm.rate, results)
    key = (arm.variant, rate if rate is not None else arm.rate, arm.steps, arm.tag)
    if key in merged:
      old = merged[key]
      seeds = tuple(sorted(set(old.seeds) | set(arm.seeds)))
      name = arm.rate if isinstance(arm.rate, str) else old.rate
      merged[key] = dataclasses.replace(old, seeds=seeds, rate=name)
    else:
      merged[key] = arm
  return list(merged.values())


def arm_row(plan: Plan, results: Results, arm: Arm) -> Optional[dict]:
  """One arm's finished runs: per-seed metrics and outcome flags (None before its rate)."""
  rate = plan.rate(arm.rate, results)
  if rate is None:
    return None
  names = {s: plan.run_name(arm.variant, rate, arm.steps, s, arm.tag) for s in arm.seeds}
  runs = {s: results[n] for s, n in names.items() if n in results}
  outcomes = [plan.outcome(r) for r in runs.values()]
  row = {
    'layout': arm.variant,
    'rate': rate,
    'rate_rule': arm.rate if isinstance(arm.rate, str) else '',
    'steps': arm.steps,
    'tag': arm.tag,
    'planned_seeds': list(arm.seeds),
    'seeds': sorted(runs),
    'learned': [bool(r.get('learned')) for r in runs.values()],
  }
  for key in ARM_METRICS:
    row[key] = [final_metric(r, key) for r in runs.values()]
  for flag in ('failed', 'diverged', 'blew_up', 'spiked'):
    row[flag] = [o[flag] for o in outcomes]
  row['non_finite'] = [o['non_finite_at_step'] is not None for o in outcomes]
  return row


def arms_table(plan: Plan, results: Results) -> list[dict]:
  rows = [arm_row(plan, results, arm) for arm in all_arms(plan, results)]
  return [row for row in rows if row is not None]


# ------------------------------------------------------------------------------------------
# Comparisons.


def _sums(run: Mapping, metric: str, key: str = 'sequence_sums') -> tuple[np.ndarray, np.ndarray]:
  numerator, denominator = METRICS[metric]
  sums = run['scored'][key]
  return np.asarray(sums[numerator], np.float64), np.asarray(sums[denominator], np.float64)


def compare(plan: Plan, results: Results, comparison: Comparison) -> Optional[dict]:
  """One comparison's row (None when its condition decided False: not a member at all)."""
  condition = plan.condition(comparison.when, results)
  if condition is False:
    return None
  names = ('a', 'b', 'a2', 'b2')[: len(comparison.sides)]
  sides = {
    name: {
      s: results[n]
      for s, n in plan.side_runs(side, comparison.seeds, results).items()
      if n in results
    }
    for name, side in zip(names, comparison.sides)
  }
  finished = [s for s in comparison.seeds if all(s in runs for runs in sides.values())]
  row: dict[str, Any] = {
    'key': comparison.key,
    'label': comparison.label,
    'metric': comparison.metric,
    'test': comparison.test,
    'family': comparison.family,
    'expected_sign': comparison.expected,
    **{name: side_dict(plan, results, side) for name, side in zip(names, comparison.sides)},
    'planned_seeds': list(comparison.seeds),
    'finished_seeds': finished,
    'complete': condition is True and len(finished) == len(comparison.seeds),
    'learned': {
      name: [bool(runs[s].get('learned')) for s in sorted(runs)] for name, runs in sides.items()
    },
    'diverged': [
      s
      for s in comparison.seeds
      if any((runs.get(s) or {}).get('diverged_at_step') is not None for runs in sides.values())
    ],
    'comparison': None,
  }
  side_a, side_b = sides['a'], sides['b']
  if comparison.test == 'failures':
    if row['complete']:
      row['failures'] = failure_test(
        plan, [side_a[s] for s in finished], [side_b[s] for s in finished]
      )
    return row
  scored = [s for s in finished if all(runs[s].get('scored') for runs in sides.values())]
  row['seeds'] = scored
  if len(scored) < 2:
    return row
  result = _paired(plan, comparison, sides, scored, 'sequence_sums')
  row['comparison'] = result.as_dict()
  row['detectable'] = stats.detectable_difference(result)
  key = 'first_draw_sequence_sums'  # the one-draw figure beside a many-draw one
  if all(key in runs[s]['scored'] for runs in sides.values() for s in scored):
    first = _paired(plan, comparison, sides, scored, key)
    row['first_draw'] = {**first.as_dict(), 'detectable': stats.detectable_difference(first)}
  return row


def _paired(
  plan: Plan, comparison: Comparison, sides: Mapping[str, Mapping], seeds: Sequence[int], key: str
) -> stats.PairedComparison:
  """The paired test of a - b (minus a2 - b2 for a trend: (a + b2) - (b + a2), sequence by
  sequence) over `seeds`, on the per-sequence sums stored under `key`."""
  sums = {
    name: [_sums(runs[s], comparison.metric, key) for s in seeds] for name, runs in sides.items()
  }
  count = sums['a'][0][1]
  if any(not np.array_equal(d, count) for per_seed in sums.values() for _, d in per_seed):
    raise ValueError(f'{plan.name} {comparison.key}: runs scored on different eval sets')
  numerators = {name: np.stack([n for n, _ in per_seed]) for name, per_seed in sums.items()}
  plus, minus = numerators['a'], numerators['b']
  if comparison.minus is not None:
    plus, minus = plus + numerators['b2'], minus + numerators['a2']
  return stats.paired_ratio_comparison(plus, minus, count)


def side_dict(plan: Plan, results: Results, side) -> dict:
  return {
    'layout': side.variant,
    'rate': plan.rate(side.rate, results),
    'rate_rule': side.rate if isinstance(side.rate, str) else '',
    'steps': side.steps,
    'tag': side.tag,
  }


def failure_test(plan: Plan, runs_a: Sequence[Mapping], runs_b: Sequence[Mapping]) -> dict:
  """Boschloo's exact test (two-sided) of the fractions of runs that failed (Plan.outcome)."""
  x_a = sum(plan.outcome(r)['failed'] for r in runs_a)
  x_b = sum(plan.outcome(r)['failed'] for r in runs_b)
  return {
    'failed_a': x_a,
    'failed_b': x_b,
    'n_a': len(runs_a),
    'n_b': len(runs_b),
    'p_value': stats.boschloo_exact(x_a, len(runs_a), x_b, len(runs_b)),
  }


def p_value(row: Mapping) -> float:
  """A row's own p-value; 1 without a result yet (conservative inside a Holm family)."""
  if row['test'] == 'failures':
    return row['failures']['p_value'] if row.get('failures') else 1.0
  return row['comparison']['p_value'] if row['comparison'] else 1.0


def adjust(plan: Plan, rows: Sequence[dict]) -> None:
  """Holm within each family, then every row's verdict (and power where it has a result)."""
  families: dict[str, list[dict]] = {}
  for row in rows:
    if row['family']:
      families.setdefault(row['family'], []).append(row)
  for members in families.values():
    p = [p_value(r) for r in members]
    for row, adjusted, level in zip(members, stats.holm(p), stats.holm_levels(p, plan.alpha)):
      row['holm_p_value'] = adjusted
      row['holm_level'] = level
  for row in rows:
    level = row.get('holm_level', plan.alpha)
    if row['comparison'] is not None:
      effects = plan.effects if row['metric'] == plan.effects_metric else {}
      add_power(row, level, effects)
    row['verdict'] = verdict(plan, row)


def add_power(row: dict, level: float, effects: Mapping[str, float]) -> None:
  """The smallest difference found with 80% power at the level the row was tested at (Holm's
  step-down level in a family) and the power for each named effect there and unadjusted."""
  c = row['comparison']
  comparison = stats.PairedComparison(
    **{k: c[k] for k in ('mean', 'p_value', 'n', 'seed_se', 'eval_se')},
    half_width=c['ci95_half_width'],
    per_seed=tuple(c['values']),
  )
  row['detectable_at_level'] = stats.detectable_difference(comparison, level=1 - level)
  row['power'] = {
    name: {
      'at_level': stats.power(comparison, effect, 1 - level),
      'unadjusted': stats.power(comparison, effect),
    }
    for name, effect in effects.items()
  }


def verdict(plan: Plan, row: Mapping) -> str:
  """The declared rule (studies/plan.py)."""
  planned = len(row['planned_seeds'])
  if not row['complete']:
    return f'pending ({len(row["finished_seeds"])} of {planned} seeds)'
  p = row['holm_p_value'] if row['family'] else p_value(row)
  if row['test'] == 'failures':
    test = row['failures']
    if test['failed_a'] == test['failed_b'] and test['failed_a'] in (0, test['n_a']):
      return f'no difference: every run {"learned" if test["failed_a"] == 0 else "failed"}'
    if p >= plan.alpha:
      return 'inconclusive'
    b_fails_more = test['failed_b'] / test['n_b'] > test['failed_a'] / test['n_a']
    return 'holds' if b_fails_more == (row['expected_sign'] > 0) else 'does not hold'
  pairs = [('a', 'b'), ('a2', 'b2')] if 'a2' in row['learned'] else [('a', 'b')]
  if any(not any(row['learned'][x]) and not any(row['learned'][y]) for x, y in pairs):
    return 'not testable at this scale'  # for a trend: either gap between two floors
  c = row['comparison']
  if c is None or not math.isfinite(p):
    return 'inconclusive (too few paired seeds)'
  return stats.p_verdict(c['mean'], p, row['expected_sign'], plan.alpha)


# ------------------------------------------------------------------------------------------
# The recipe check.


def machine_of(run: Mapping) -> str:
  """The machine a run's result records (study.origin); 'not recorded' for runs finished
  before results recorded it (2026-11-27)."""
  machine = (run.get('origin') or {}).get('machine')
  if not machine:
    return 'not recorded'
  return f'{machine.get("cpu")} ({machine.get("simd")}, {machine.get("libc")})'


def recipe_check(results: Mapping[str, dict], tolerance: float = RECIPE_TOLERANCE) -> dict:
  """Per seed and layout: the spread of the step-1 training loss over every run of `results`
  with that seed and layout (0 up to float noise when they share weights, first batch and
  dropout, whichever process, day or rate trained them). 'beyond' lists the seeds and layouts
  whose spread exceeds `tolerance`, 'mixed' those whose runs come from more than one machine
  (runs from another machine can start a little away, within the tolerance: the tolerance
  alone does not find every mix), each with its runs by machine; 'machines' counts runs per
  machine."""
  groups: dict[str, dict[str, dict]] = {}
  for name, run in results.items():
    if not run.get('train_loss'):
      continue
    params = run.get('params') or {}
    # Model fields an arm overrides (e.g. num_layers) make another recipe: another start.
    model = ''.join(f'-{k}={v}' for k, v in sorted((params.get('model') or {}).items()))
    key = f'{params.get("layout")}-s{params.get("seed")}{model}'
    groups.setdefault(key, {})[name] = run
  per, beyond, mixed, machines = {}, {}, {}, {}
  for key in sorted(groups):
    runs = groups[key]
    first = [run['train_loss'][0][1] for run in runs.values()]
    per[key] = {'runs': len(first), 'spread': max(first) - min(first)}
    by_machine: dict[str, list[str]] = {}
    for name, run in sorted(runs.items()):
      by_machine.setdefault(machine_of(run), []).append(name)
      machines[machine_of(run)] = machines.get(machine_of(run), 0) + 1
    if per[key]['spread'] > tolerance:
      beyond[key] = by_machine
    if len(by_machine) > 1:
      mixed[key] = by_machine
  return {
    'max_spread': max((v['spread'] for v in per.values()), default=0.0),
    'tolerance': tolerance,
    'per': per,
    'beyond': beyond,
    'mixed': mixed,
    'machines': machines,
  }

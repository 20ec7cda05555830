r"""Post-LN vs Pre-LN vs RealFormer at depth, over a learning-rate grid: the RealFormer paper's
claims where its effects should live, with models that learn masked-LM.

    python -m experiments.compare_layouts --runs='*-s[02]' &   # split over 2 cores: one process
    python -m experiments.compare_layouts --runs='*-s[13]'     # per pair of seeds (~2-3 h each)
    python -m experiments.compare_layouts                      # then: the report (or run it all)
    python -m experiments.compare_layouts --scale=bert_small   # accelerator size (not run here)
    python -m experiments.compare_layouts --quick --out=/tmp/cl --workdirs=/tmp/cl_runs

The CPU scale: 12 layers x 64 (2 heads of 32), FFN 256, sequence 64, batch 32, rotary
positions (learned positions do not learn at this budget: experiments/position_probe.py),
dropout 0.1, 600 AdamW steps (10% warmup, linear decay to 0), a 2,000-piece tokenizer, scored
on the first 16 held-out batches (the same masked tokens for every run). For a seed, every
layout sees the same batches in the same order, and Post-LN and RealFormer start from the same
weights, so differences are paired by seed.

Plan, declared before any run (the code below follows it; `plan`):
  1. grid      every layout at peak rates 1e-3, 2e-3, 4e-3, 8e-3, seeds 0 and 1. Per layout:
               its best rate (highest mean [MASK] accuracy) and its largest rate at which every
               seed learned.
  2. confirm   r* = Post-LN's best grid rate (ties: the smaller), and 2 r*: every layout at
               both, seeds 0-3 (the grid's seeds are reused where the rate is in the grid).
  3. half      RealFormer at r* with a schedule that ends at half the steps, seeds 0-3
               (claim 4 against Post-LN's full schedule; not a mid-schedule checkpoint).
Runs are listed in that order of priority (Post-LN's grid first, so r* is known early) and the
plan is re-read after every finished run; with --runs each process trains only its share.

Primary comparisons (95% intervals, no correction), [MASK] accuracy, paired by seed:
  P1  RealFormer - Post-LN at r*        (paper: RealFormer better)
  P2  RealFormer - Post-LN at 2 r*      (paper: Post-LN breaks at a larger rate, RealFormer not)
Secondary comparisons, Holm-corrected as one family: Post-LN - Pre-LN and RealFormer - Pre-LN
at r* and at 2 r*; RealFormer(2 r*) - RealFormer(r*); Post-LN(2 r*) - Post-LN(r*);
RealFormer(half schedule) - Post-LN(full) at r*. Intervals add the seeds' variance and the
eval set's (a bootstrap over held-out sequences): stats.paired_ratio_comparison.

Verdicts: "not testable at this scale" when no run on either side learned (study.learned: eval
loss below the copy-aware unigram loss and [MASK] accuracy above the most frequent token's);
otherwise "holds" / "does not hold" when the (Holm-adjusted, for secondaries) p-value is below
0.05 with the paper's / the opposite sign, else "inconclusive".

Writes to --out (default docs/results/compare_layouts/): results.md, results.json,
lr_grid.png, curves.png, comparisons.png, runs/*.json (one per finished run, with per-sequence
sums). Workdirs go to --workdirs (default results/compare_layouts/): the attention analysis and
the fine-tuning comparison read the r* runs' checkpoints.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Any, Optional

import numpy as np

from studies import runs as runs_lib
from studies import stats, study
from studies.report import LAYOUT_COLORS, LAYOUT_NAMES, comparison_cells, seed_cell, write_lines

LAYOUTS = {  # name: model overrides
  'post': dict(ln_placement='post'),
  'pre': dict(ln_placement='pre'),
  'realformer': dict(ln_placement='realformer'),
}


@dataclasses.dataclass(frozen=True)
class Plan:
  scale: study.Scale
  rates: tuple[float, ...]
  grid_seeds: tuple[int, ...] = (0, 1)
  confirm_seeds: tuple[int, ...] = (0, 1, 2, 3)


OUT, WORKDIRS = 'docs/results/compare_layouts', 'results/compare_layouts'  # the defaults


def add_reader_arguments(parser: argparse.ArgumentParser, runs_flag: str) -> None:
  """The arguments of a script that reads this study's outputs: `runs_flag` (where its runs
  are: its --workdirs), --layouts_results (its --out: results.json with r* and the seeds, runs/
  with each run's record) and --rate (default: r*)."""
  parser.add_argument(runs_flag, default=WORKDIRS, help="compare_layouts' --workdirs")
  parser.add_argument(
    '--layouts_results', default=OUT, help="compare_layouts' --out (r*, seeds, run records)"
  )
  parser.add_argument('--rate', type=float, default=None, help='pretraining peak rate (default r*)')


PLANS = {
  # 2 CPU cores, one process per core: ~0.5-1 s a step, 36-40 runs of 600 steps.
  'cpu': Plan(
    study.Scale(
      layers=12,
      hidden=64,
      heads=2,
      mlp=256,
      seq_len=64,
      batch=32,
      steps=600,
      learning_rate=2e-3,
      vocab=2000,
      evals=6,
      eval_batches=16,
    ),
    rates=(1e-3, 2e-3, 4e-3, 8e-3),
  ),
  # BERT-Small width at BERT-Base depth, sequence 128: one accelerator, hours.
  'bert_small': Plan(
    study.Scale(
      layers=12,
      hidden=512,
      heads=8,
      mlp=2048,
      seq_len=128,
      batch=256,
      steps=20_000,
      learning_rate=5e-4,
      vocab=8000,
      eval_batches=64,
    ),
    rates=(1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3),
  ),
  # The smoke test: seconds a run.
  'toy': Plan(study.TOY, rates=(3e-3,), grid_seeds=(0, 1), confirm_seeds=(0, 1)),
}


def run_name(rate: float, layout: str, seed: int, prefix: str = '') -> str:
  return f'{prefix}lr{rate:g}-{layout}-s{seed}'


def _run(rate, layout, seed, scale, half=False) -> runs_lib.Run:
  return runs_lib.Run(
    run_name(rate, layout, seed, 'half-' if half else ''),
    dict(layout=layout, seed=seed, learning_rate=rate, half=half),
    cost=scale.steps / (2 if half else 1),
  )


def best_rate(results: dict, plan: Plan, layout: str) -> Optional[float]:
  """The grid rate with the highest mean final [MASK] accuracy over the grid seeds (ties: the
  smaller rate); a run that diverged scores 0. None until every such grid run finished."""
  means = []
  for rate in plan.rates:
    runs = [results.get(run_name(rate, layout, s)) for s in plan.grid_seeds]
    if any(r is None for r in runs):
      return None
    means.append(np.mean([_final(r, 'mask_accuracy', 0.0) for r in runs]))
  return plan.rates[int(np.argmax(means))]


def plan_runs(results: dict, plan: Plan) -> list[runs_lib.Run]:
  """Every run of the plan the results so far define, in priority order (module docstring)."""
  scale = plan.scale
  runs = [_run(r, 'post', s, scale) for r in plan.rates for s in plan.grid_seeds]
  star = best_rate(results, plan, 'post')
  if star is not None:
    for rate in (star, 2 * star):
      runs += [
        _run(rate, layout, s, scale)
        for layout in ('post', 'realformer', 'pre')
        for s in plan.confirm_seeds
      ]
  runs += [
    _run(r, layout, s, scale)
    for layout in ('realformer', 'pre')
    for r in plan.rates
    for s in plan.grid_seeds
  ]
  if star is not None:
    runs += [_run(star, 'realformer', s, scale, half=True) for s in plan.confirm_seeds]
  unique = {}
  for run in runs:
    unique.setdefault(run.name, run)
  return list(unique.values())


def train_one(plan: Plan, args, run: runs_lib.Run, report: runs_lib.Report) -> dict:
  p, scale = run.params, plan.scale
  config = study.mlm_config(
    scale,
    seed=p['seed'],
    learning_rate=p['learning_rate'],
    data_dir=args.data_dir,
    steps=scale.steps // 2 if p['half'] else scale.steps,
    # Fully unrolled layer scan: ~25% faster steps for this deep, narrow model on CPU.
    model=dict(LAYOUTS[p['layout']], scan_unroll=scale.layers),
  )
  workdir = os.path.join(args.workdirs, run.name)
  result = study.train_run(config, workdir, report, progress_share=0.95)
  if result['diverged_at_step'] is None:
    report(0.95, 'scoring per sequence')
    result['scored'] = study.score_workdir(workdir)
  return result


# ------------------------------------------------------------------------------------------
# Analysis.


def _final(run: Optional[dict], key: str, default=math.nan) -> float:
  if not run or not run.get('final'):
    return default
  return float(run['final'][key])


def grid_table(results: dict, plan: Plan) -> dict:
  """Per layout and rate: per-seed [MASK] accuracy, loss, learned; the layout's best rate and
  its largest rate at which every seed learned."""
  table = {}
  for layout in LAYOUTS:
    rows = {}
    for rate in plan.rates:
      runs = [results.get(run_name(rate, layout, s)) for s in plan.grid_seeds]
      runs = [r for r in runs if r is not None]
      if not runs:
        continue
      rows[f'{rate:g}'] = {
        'mask_accuracy': [_final(r, 'mask_accuracy') for r in runs],
        'loss': [_final(r, 'loss') for r in runs],
        'learned': [bool(r.get('learned')) for r in runs],
        'diverged_at_step': [r.get('diverged_at_step') for r in runs],
      }
    complete = len(rows) == len(plan.rates) and all(
      len(row['learned']) == len(plan.grid_seeds) for row in rows.values()
    )
    best = best_rate(results, plan, layout) if complete else None
    trainable = [float(rate) for rate, row in rows.items() if all(row['learned'])]
    table[layout] = {
      'rates': rows,
      'best_rate': best,
      'largest_trainable_rate': max(trainable) if complete and trainable else None,
    }
  return table


@dataclasses.dataclass(frozen=True)
class Comparison:
  key: str
  label: str
  a: tuple  # (rate factor: 1 = r*, 2 = 2 r*; layout; half schedule)
  b: tuple
  expected: int  # the paper's sign: +1 a > b, -1 a < b
  primary: bool = False


COMPARISONS = (
  Comparison(
    'P1',
    'RealFormer - Post-LN at r*',
    (1, 'realformer', False),
    (1, 'post', False),
    +1,
    primary=True,
  ),
  Comparison(
    'P2',
    'RealFormer - Post-LN at 2 r*',
    (2, 'realformer', False),
    (2, 'post', False),
    +1,
    primary=True,
  ),
  Comparison('S1', 'Post-LN - Pre-LN at r*', (1, 'post', False), (1, 'pre', False), +1),
  Comparison('S2', 'RealFormer - Pre-LN at r*', (1, 'realformer', False), (1, 'pre', False), +1),
  Comparison('S3', 'Post-LN - Pre-LN at 2 r*', (2, 'post', False), (2, 'pre', False), +1),
  Comparison('S4', 'RealFormer - Pre-LN at 2 r*', (2, 'realformer', False), (2, 'pre', False), +1),
  Comparison(
    'S5', 'RealFormer at 2 r* - at r*', (2, 'realformer', False), (1, 'realformer', False), +1
  ),
  Comparison('S6', 'Post-LN at 2 r* - at r*', (2, 'post', False), (1, 'post', False), -1),
  Comparison(
    'S7',
    'RealFormer (half schedule) - Post-LN (full) at r*',
    (1, 'realformer', True),
    (1, 'post', False),
    +1,
  ),
)


def _side_runs(results: dict, plan: Plan, star: float, side: tuple) -> dict[int, dict]:
  factor, layout, half = side
  out = {}
  for seed in plan.confirm_seeds:
    run = results.get(run_name(factor * star, layout, seed, 'half-' if half else ''))
    if run is not None:
      out[seed] = run
  return out


def compare(results: dict, plan: Plan, star: float, comparison: Comparison) -> dict:
  """One comparison of [MASK] accuracy, paired by seed, with its verdict inputs."""
  side_a = _side_runs(results, plan, star, comparison.a)
  side_b = _side_runs(results, plan, star, comparison.b)
  learned = {
    'a': [bool(r.get('learned')) for r in side_a.values()],
    'b': [bool(r.get('learned')) for r in side_b.values()],
  }
  out = {
    'key': comparison.key,
    'label': comparison.label,
    'primary': comparison.primary,
    'expected_sign': comparison.expected,
    'learned': learned,
    'seeds_a': sorted(side_a),
    'seeds_b': sorted(side_b),
  }
  # A diverged run has no evaluation: it counts as a comparison we cannot pair, and is listed.
  seeds, out['diverged'], result = study.paired_mask_accuracy(side_a, side_b, comparison.label)
  if result is None:
    out['comparison'] = None
    return out
  out['comparison'] = result.as_dict()
  out['seeds'] = seeds
  return out


def verdict(row: dict, p_value: float) -> str:
  """The stated rule (module docstring)."""
  if not row['learned']['a'] or not row['learned']['b']:
    return 'not run'
  if not any(row['learned']['a']) and not any(row['learned']['b']):
    return 'not testable at this scale'
  c = row['comparison']
  if c is None or not math.isfinite(p_value):
    return 'inconclusive (too few paired seeds)'
  return stats.p_verdict(c['mean'], p_value, row['expected_sign'])


def analyse(results: dict, plan: Plan) -> dict:
  grid = grid_table(results, plan)
  star = grid['post']['best_rate']
  analysis: dict[str, Any] = {'grid': grid, 'r_star': star, 'comparisons': []}
  if star is None:
    return analysis
  rows = [compare(results, plan, star, c) for c in COMPARISONS]
  secondary = [r for r in rows if not r['primary'] and r['comparison']]
  adjusted = stats.holm([r['comparison']['p_value'] for r in secondary])
  for row, p in zip(secondary, adjusted):
    row['holm_p_value'] = p
  for row in rows:
    p = (
      row['comparison']['p_value']
      if row['primary'] and row['comparison']
      else row.get('holm_p_value', math.nan)
    )
    row['verdict'] = verdict(row, p)
  analysis['comparisons'] = rows
  analysis['at_rates'] = {f'{f * star:g}': confirm_table(results, plan, f * star) for f in (1, 2)}
  analysis['half'] = confirm_table(results, plan, star, half=True)
  return analysis


def confirm_table(results: dict, plan: Plan, rate: float, half: bool = False) -> dict:
  """Per layout at one rate over the confirmation seeds: per-seed metrics and summaries."""
  table = {}
  for layout in ('realformer',) if half else LAYOUTS:
    runs = [
      results.get(run_name(rate, layout, s, 'half-' if half else '')) for s in plan.confirm_seeds
    ]
    runs = [r for r in runs if r is not None]
    if not runs:
      continue
    table[layout] = {
      key: [_final(r, key) for r in runs]
      for key in ('mask_accuracy', 'mlm_accuracy', 'loss', 'kept_accuracy', 'random_accuracy')
    }
    table[layout]['seeds'] = [r['params']['seed'] for r in runs]
    table[layout]['learned'] = [bool(r.get('learned')) for r in runs]
    table[layout]['diverged_at_step'] = [r.get('diverged_at_step') for r in runs]
  return table


def floors_of(results: dict) -> dict:
  return next((r['floors'] for r in results.values() if r.get('floors')), {})


# ------------------------------------------------------------------------------------------
# Report.


def _percent(fractions: list[float]) -> str:
  return seed_cell(fractions, scale=100)


def _count(flags: list[bool]) -> str:
  return f'{sum(flags)}/{len(flags)}'


def write_markdown(path: str, results: dict, analysis: dict, plan: Plan, command: str) -> None:
  """results.md: the setup and floors, then one section per step of the plan."""
  floors = floors_of(results)
  lines = _setup(results, plan.scale, command) + _floors(floors) + _grid_section(analysis, plan)
  if analysis['r_star'] is None:
    lines += ['', "r* (Post-LN's best rate) is not known yet: the grid is unfinished.", '']
  else:
    lines += _confirm_section(analysis, plan, floors) + _comparisons_section(analysis)
  lines += [
    '',
    '![[MASK] accuracy over the learning-rate grid](lr_grid.png)',
    '',
    '![[MASK] accuracy during training at r* and 2 r*](curves.png)',
    '',
    '![comparisons with intervals](comparisons.png)',
    '',
  ]
  write_lines(path, lines)


def _setup(results: dict, scale: study.Scale, command: str) -> list[str]:
  predictions = next((r['scored']['metrics'] for r in results.values() if r.get('scored')), {})
  return [
    '# Post-LN vs Pre-LN vs RealFormer at depth, over a learning-rate grid',
    '',
    f'Regenerate: `{command}` (split over processes with `--runs`, see the script). '
    f'{scale.layers} layers x {scale.hidden} hidden, {scale.heads} heads, FFN {scale.mlp}, '
    f'{scale.position_embedding} positions, sequence {scale.seq_len}, batch {scale.batch}, '
    f'{scale.steps} AdamW steps (10% warmup, linear decay to 0), dropout {scale.dropout}, a '
    f'{scale.vocab}-piece tokenizer on the embedded corpus; scored on the first '
    f'{scale.eval_batches} held-out batches (the same masked tokens for every run: '
    f'{predictions.get("predictions", math.nan):,.0f} predictions, '
    f'{predictions.get("mask_predictions", math.nan):,.0f} of them at [MASK]).',
    '',
  ]


def _floors(floors: dict) -> list[str]:
  if not floors:
    return []
  return [
    f'Floors (context-free predictors from the train split, on this eval set): most '
    f'frequent token {100 * floors["mask_accuracy"]:.2f}% at [MASK] and '
    f'{100 * floors["mlm_accuracy"]:.2f}% of all predictions; copy-aware (copy the visible '
    f'token, else the most frequent) {100 * floors["mask_accuracy"]:.2f}% at [MASK] and '
    f'{100 * floors["copy_accuracy"]:.2f}% of all predictions; copy-aware unigram loss '
    f'{floors["copy_unigram_loss"]:.3f} nats. A run learned when its eval loss is below '
    'that loss and its [MASK] accuracy above the floor.',
    '',
  ]


def _grid_section(analysis: dict, plan: Plan) -> list[str]:
  """Step 1: every layout at every grid rate, its best rate and its largest trainable one."""
  lines = [
    '## 1. Learning-rate grid: [MASK] accuracy (%)',
    '',
    f'Seeds {list(plan.grid_seeds)}: mean ± 95% Student-t half-width (per-seed values); '
    '"learned" counts seeds that learned. A diverged run scores 0 for the choice of '
    'the best rate.',
    '',
    '| layout | '
    + ' | '.join(f'{r:g}' for r in plan.rates)
    + ' | best rate | largest rate where every seed learned |',
    '|---' * (len(plan.rates) + 3) + '|',
  ]
  for layout, info in analysis['grid'].items():
    cells = []
    for rate in plan.rates:
      row = info['rates'].get(f'{rate:g}')
      cells.append(
        'n/a'
        if row is None
        else f'{_percent(row["mask_accuracy"])}; learned {_count(row["learned"])}'
      )
    cells += [_rate(info['best_rate']), _rate(info['largest_trainable_rate'])]
    lines.append(f'| {LAYOUT_NAMES[layout]} | ' + ' | '.join(cells) + ' |')
  return lines


def _confirm_section(analysis: dict, plan: Plan, floors: dict) -> list[str]:
  """Steps 2 and 3: every layout at r* and 2 r*, RealFormer's half schedule, the floors."""
  star = analysis['r_star']
  lines = [
    '',
    f"r* = Post-LN's best grid rate = {star:g}; 2 r* = {2 * star:g}.",
    '',
    f'## 2. At r* and 2 r*, seeds {list(plan.confirm_seeds)}',
    '',
    '| rate | layout | [MASK] accuracy (%) | all predictions (%) | eval loss | '
    'learned | kept / random accuracy (%) |',
    '|---|---|---|---|---|---|---|',
  ]
  for rate, table in analysis['at_rates'].items():
    for layout, row in table.items():
      lines.append(_confirm_line(rate, LAYOUT_NAMES[layout], row))
  half = f'{star:g}, half schedule ({plan.scale.steps // 2} steps)'
  for layout, row in analysis['half'].items():
    lines.append(_confirm_line(half, LAYOUT_NAMES[layout], row))
  if floors:
    lines.append(
      f'| floors | most frequent | {100 * floors["mask_accuracy"]:.2f} | '
      f'{100 * floors["mlm_accuracy"]:.2f} | | | |'
    )
    lines.append(
      f'| floors | copy-aware | {100 * floors["mask_accuracy"]:.2f} | '
      f'{100 * floors["copy_accuracy"]:.2f} | {floors["copy_unigram_loss"]:.3f} '
      f'| | 100 / 0 |'
    )
  return lines


def _comparisons_section(analysis: dict) -> list[str]:
  """The declared comparisons with their intervals, p-values and verdicts."""
  lines = [
    '',
    '## 3. Comparisons of [MASK] accuracy (percentage points), paired by seed',
    '',
    'Interval: 95%, seeds and eval-set sampling (bootstrap over held-out '
    'sequences). P: primary, declared before the runs, uncorrected; S: secondary, '
    'Holm-adjusted as one family.',
    '',
    '| | comparison | paper expects | difference | p | Holm p | seeds | learned '
    '(a / b) | verdict |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for row in analysis['comparisons']:
    diff, p, holm = comparison_cells(row)
    holm = '' if row['primary'] else holm  # primaries are not adjusted
    learned = f'{_count(row["learned"]["a"])} / {_count(row["learned"]["b"])}'
    lines.append(
      f'| {row["key"]} | {row["label"]} | {"> 0" if row["expected_sign"] > 0 else "< 0"}'
      f' | {diff} | {p} | {holm} | {len(row.get("seeds", []))} | {learned} | '
      f'{row["verdict"]} |'
    )
  return lines


def _rate(rate: Optional[float]) -> str:
  return 'n/a' if rate is None else f'{rate:g}'


def _confirm_line(rate, name: str, row: dict) -> str:
  kept = [v for v in row['kept_accuracy'] if math.isfinite(v)]
  random = [v for v in row['random_accuracy'] if math.isfinite(v)]
  kept_random = (
    f'{100 * np.mean(kept):.1f} / {100 * np.mean(random):.1f}' if kept and random else 'n/a'
  )
  return (
    f'| {rate} | {name} | {_percent(row["mask_accuracy"])} | {_percent(row["mlm_accuracy"])} | '
    f'{seed_cell(row["loss"], 3)} | {_count(row["learned"])} | '
    f'{kept_random} |'
  )


def write_plots(out: str, results: dict, analysis: dict, plan: Plan) -> list[str]:
  plt = study.pyplot()
  if plt is None:
    return []
  floors = floors_of(results)
  paths = []
  # 1. The grid: per-seed points (outcomes can be bimodal) and the mean over seeds.
  fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(13, 4.8))
  offsets = {'post': 0.94, 'pre': 1.0, 'realformer': 1.06}
  for layout, info in analysis['grid'].items():
    rates = [float(r) for r in info['rates']]
    for ax, key, scale_by in ((ax_acc, 'mask_accuracy', 100.0), (ax_loss, 'loss', 1.0)):
      per_seed = [[v * scale_by for v in info['rates'][f'{r:g}'][key]] for r in rates]
      for rate, values in zip(rates, per_seed):
        finite = [v for v in values if math.isfinite(v)]
        ax.scatter(
          [rate * offsets[layout]] * len(finite),
          finite,
          color=LAYOUT_COLORS[layout],
          s=18,
          alpha=0.7,
        )
      means = [
        np.mean([v for v in values if math.isfinite(v)])
        if any(math.isfinite(v) for v in values)
        else np.nan
        for values in per_seed
      ]
      ax.plot(
        rates, means, color=LAYOUT_COLORS[layout], label=f'{LAYOUT_NAMES[layout]}: mean of seeds'
      )
  ax_acc.scatter([], [], color='gray', s=18, label='one seed (points)')
  study.draw_floors(ax_acc, floors, 'mask_accuracy')
  study.draw_floors(ax_loss, floors, 'loss')
  for ax in (ax_acc, ax_loss):
    ax.set_xscale('log', base=2)
    ax.set_xticks(plan.rates, [f'{r:g}' for r in plan.rates])
    ax.set_xlabel('peak learning rate')
    ax.legend(fontsize=8)
  ax_acc.set_ylim(bottom=0)
  ax_acc.set_ylabel('final eval accuracy at [MASK] (%)')
  ax_acc.set_title(f'[MASK] accuracy after {plan.scale.steps} steps, seeds {list(plan.grid_seeds)}')
  ax_loss.set_ylabel('final eval loss (nats)')
  ax_loss.set_title('eval loss (all predictions)')
  paths.append(study.save_figure(fig, os.path.join(out, 'lr_grid.png')))

  star = analysis['r_star']
  if star is None:
    return paths
  # 2. Curves at r* and 2 r*: one thin line per seed, the mean thick.
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
  for ax, factor in zip(axes, (1, 2)):
    for layout in LAYOUTS:
      study.plot_seed_curves(
        ax,
        results,
        (run_name(factor * star, layout, s) for s in plan.confirm_seeds),
        LAYOUT_COLORS[layout],
        lambda n, layout=layout: f'{LAYOUT_NAMES[layout]}: mean of {n} seeds (thin: each seed)',
      )
    study.draw_floors(ax, floors, 'mask_accuracy')
    ax.set_ylim(bottom=0)
    ax.set_xlabel('training step')
    ax.set_title(f'peak rate {factor * star:g} ({"r*" if factor == 1 else "2 r*"})')
    ax.legend(fontsize=8)
  axes[0].set_ylabel('eval accuracy at [MASK] (%)')
  paths.append(study.save_figure(fig, os.path.join(out, 'curves.png')))

  # 3. The comparisons: estimate and 95% interval; the paper's expected sign.
  rows = [r for r in analysis['comparisons'] if r['comparison']]
  if rows:
    sign = lambda r: '> 0' if r['expected_sign'] > 0 else '< 0'
    paths.append(
      study.plot_comparisons(
        os.path.join(out, 'comparisons.png'),
        [r['comparison'] for r in rows],
        [f'{r["key"]}: {r["label"]} (paper: {sign(r)})' for r in rows],
        ['black' if r['primary'] else 'tab:gray' for r in rows],
        xlabel='difference in [MASK] accuracy (percentage points)',
        title='mean and 95% interval (seeds + eval-set bootstrap); x: each seed; black: primary',
      )
    )
  return paths


def _summary_for_json(results: dict) -> dict:
  """Per run: everything but the per-sequence sums (those stay in runs/<name>.json)."""
  out = {}
  for name, run in results.items():
    run = dict(run)
    if 'scored' in run:
      run['scored'] = {k: v for k, v in run['scored'].items() if k != 'sequence_sums'}
    out[name] = run
  return out


def main(argv=None) -> dict:
  args = study.argument_parser(__doc__, out=OUT, workdirs=WORKDIRS, scales=PLANS).parse_args(argv)
  plan, results = study.run_plan(args, PLANS, plan_runs, train_one)
  analysis = analyse(results, plan)
  record = {
    'scale': dataclasses.asdict(plan.scale),
    'rates': list(plan.rates),
    'grid_seeds': list(plan.grid_seeds),
    'confirm_seeds': list(plan.confirm_seeds),
    'floors': floors_of(results),
    'analysis': analysis,
    'runs': _summary_for_json(results),
  }
  return study.write_plan_report(
    args, 'compare_layouts', record, results, analysis, plan, write_markdown, write_plots
  )


if __name__ == '__main__':
  main(sys.argv[1:])

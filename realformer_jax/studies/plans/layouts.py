r"""Post-LN vs Pre-LN vs RealFormer at depth, over a learning-rate grid: the RealFormer paper's
claims where its effects should live, with models that learn masked-LM.

    python -m experiments.study --plan=layouts --runs='*-s[02]' &   # split over 2 cores: one
    python -m experiments.study --plan=layouts --runs='*-s[13]'     # process per pair of seeds
    python -m experiments.study --plan=layouts                      # then: the report
    python -m experiments.study --plan=layouts --scale=bert_small   # accelerator (not run here)

The CPU scale: 12 layers x 64 (2 heads of 32), FFN 256, sequence 64, batch 32, rotary
positions (learned positions do not learn at this budget: studies/plans/position_probe.py),
dropout 0.1, 600 AdamW steps (10% warmup, linear decay to 0), a 2,000-piece tokenizer, scored
on the first 16 held-out batches (the same masked tokens for every run). For a seed, every
layout sees the same batches in the same order, and Post-LN and RealFormer start from the same
weights, so differences are paired by seed.

Plan, declared before any run (2026-11-25; since 2026-11-28 written as this plan, run by
studies/runner.py, which reproduces its committed numbers):
  1. grid      every layout at peak rates 1e-3, 2e-3, 4e-3, 8e-3, seeds 0 and 1. Per layout:
               its best rate (highest mean [MASK] accuracy; a diverged run scores 0; ties: the
               smaller) and its largest rate at which every seed learned.
  2. confirm   r* = Post-LN's best grid rate, and 2 r*: every layout at both, seeds 0-3 (the
               grid's seeds are reused where the rate is in the grid).
  3. half      RealFormer at r* with a schedule that ends at half the steps, seeds 0-3
               (claim 4 against Post-LN's full schedule; not a mid-schedule checkpoint).
Primary comparisons (95% intervals, no correction), [MASK] accuracy, paired by seed:
  P1  RealFormer - Post-LN at r*        (paper: RealFormer better)
  P2  RealFormer - Post-LN at 2 r*      (paper: Post-LN breaks at a larger rate, RealFormer not)
Secondary comparisons, Holm-corrected as one family: Post-LN - Pre-LN and RealFormer - Pre-LN
at r* and at 2 r*; RealFormer(2 r*) - RealFormer(r*); Post-LN(2 r*) - Post-LN(r*);
RealFormer(half schedule) - Post-LN(full) at r*. Verdicts: studies/plan.py's rule.
Added 2026-11-28, after the runs: P1 and P2 on all selected positions (the paper's metric), in
their own family (they change no declared verdict).

Runs: `lr<rate>-<layout>-s<seed>` (`half-` in front for step 3) in docs/results/compare_layouts/
runs/; workdirs in results/compare_layouts/ (experiments.attention_analysis and
experiments.finetune_compare read the r* runs' checkpoints).
"""

from __future__ import annotations

import json
import os
from typing import Optional

from realformer_jax.studies.plan import (
  Arm,
  BestRate,
  Comparison,
  Plan,
  Scaled,
  Side,
  all_positions_twins,
)
from realformer_jax.studies.scale import ACCELERATOR, CPU, TOY, Scale

LAYOUTS = ('post', 'realformer', 'pre')

SCALE = CPU


def make(scale: Scale, rates, grid_seeds, confirm_seeds, **where) -> Plan:
  steps = scale.steps
  best = lambda layout, name: BestRate(name, layout, rates, steps, grid_seeds)
  side = lambda layout, rate, tag='': Side(layout, rate, steps // 2 if tag else steps, tag)
  primary = lambda key, label, a, b: Comparison(key, label, a, b, confirm_seeds)
  secondary = lambda key, label, a, b, expected=+1: Comparison(
    key, label, a, b, confirm_seeds, expected=expected, family='S'
  )
  return Plan(
    name='layouts',
    title='Post-LN vs Pre-LN vs RealFormer at depth, over a learning-rate grid',
    scale=scale,
    name_format='{tag}lr{rate:g}-{layout}-s{seed}',
    rules=(
      best('post', 'r*'),
      best('realformer', 'best_realformer'),
      best('pre', 'best_pre'),
      Scaled('2r*', 'r*', 2.0),
    ),
    arms=(
      *(Arm(layout, 'r*', steps, confirm_seeds) for layout in LAYOUTS),
      *(Arm(layout, '2r*', steps, confirm_seeds) for layout in LAYOUTS),
      Arm('realformer', 'r*', steps // 2, confirm_seeds, tag='half-'),
    ),
    comparisons=with_twins(
      primary('P1', 'RealFormer - Post-LN at r*', side('realformer', 'r*'), side('post', 'r*')),
      primary('P2', 'RealFormer - Post-LN at 2 r*', side('realformer', '2r*'), side('post', '2r*')),
      secondary('S1', 'Post-LN - Pre-LN at r*', side('post', 'r*'), side('pre', 'r*')),
      secondary('S2', 'RealFormer - Pre-LN at r*', side('realformer', 'r*'), side('pre', 'r*')),
      secondary('S3', 'Post-LN - Pre-LN at 2 r*', side('post', '2r*'), side('pre', '2r*')),
      secondary('S4', 'RealFormer - Pre-LN at 2 r*', side('realformer', '2r*'), side('pre', '2r*')),
      secondary(
        'S5', 'RealFormer at 2 r* - at r*', side('realformer', '2r*'), side('realformer', 'r*')
      ),
      secondary(
        'S6', 'Post-LN at 2 r* - at r*', side('post', '2r*'), side('post', 'r*'), expected=-1
      ),
      secondary(
        'S7',
        'RealFormer (half schedule) - Post-LN (full) at r*',
        side('realformer', 'r*', 'half-'),
        side('post', 'r*'),
      ),
    ),
    **where,
  )


def with_twins(*comparisons: Comparison) -> tuple[Comparison, ...]:
  """The declared comparisons, then P1 and P2 on all positions (added after the runs)."""
  return comparisons + all_positions_twins(comparisons, ('P1', 'P2'))


PLANS = {
  # 2 CPU cores, one process per core: ~0.5-1 s a step, 36-40 runs of 600 steps.
  'cpu': make(
    SCALE,
    rates=(1e-3, 2e-3, 4e-3, 8e-3),
    grid_seeds=(0, 1),
    confirm_seeds=(0, 1, 2, 3),
    out='docs/results/compare_layouts',
    workdirs='results/compare_layouts',
  ),
  # BERT-Small width at BERT-Base depth, sequence 128: one accelerator, hours (not run here).
  'bert_small': make(
    ACCELERATOR,
    rates=(1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3),
    grid_seeds=(0, 1),
    confirm_seeds=(0, 1, 2, 3),
    out='results/compare_layouts_bert_small/report',
    workdirs='results/compare_layouts_bert_small',
  ),
  # The smoke test: seconds a run.
  'toy': make(TOY, rates=(3e-3,), grid_seeds=(0, 1), confirm_seeds=(0, 1)),
}


# ------------------------------------------------------------------------------------------
# For the scripts that read this study's runs (experiments.attention_analysis,
# experiments.finetune_compare).


def add_reader_arguments(parser, runs_flag: str) -> None:
  """`runs_flag` (where the runs' workdirs are: this plan's workdirs), --layouts_results (its
  report folder: results.json with r*, runs/ with each run's record) and --rate (default r*)."""
  cpu = PLANS['cpu']
  parser.add_argument(runs_flag, default=cpu.workdirs, help="the layouts plan's workdirs")
  parser.add_argument(
    '--layouts_results', default=cpu.out, help="the layouts plan's report folder (r*, runs/)"
  )
  parser.add_argument('--rate', type=float, default=None, help='pretraining peak rate (default r*)')


def decisions(layouts_results: str) -> tuple[Optional[float], list[int], dict]:
  """r*, the seeds of the comparisons at r* and the recipe (the scale's fields) from the
  report's results.json; (None, [], {}) before the study reported."""
  path = os.path.join(layouts_results, 'results.json')
  if not os.path.exists(path):
    return None, [], {}
  with open(path) as f:
    saved = json.load(f)
  star = saved['analysis']['rules']['r*']['value']
  p1 = next(c for c in saved['plan']['comparisons'] if c['key'] == 'P1')
  return star, list(p1['seeds']), saved['plan']['scale']

r"""Is Post-LN really ahead? RealFormer and Post-LN at 4,800 steps, each at its own learning rate.

    python -m experiments.study --plan=tuned_rates --runs='*-s[0246]' &   # one process per
    python -m experiments.study --plan=tuned_rates --runs='*-s[1357]'     # half of the seeds
    python -m experiments.study --plan=tuned_rates --runs=none            # the report only

Why (issue 58): the budgets study found Post-LN ahead at 4,800 steps ([MASK] accuracy, P1 =
-0.86 +- 0.55 points, Holm p 0.032) at a rate chosen for Post-LN alone (its best at 2,400
steps, 2e-3), which is the paper's protocol (it reused BERT's hyperparameters) but says nothing
of the layouts each tuned: RealFormer's standing improved as the rate fell in every budget run
so far. Declared 2026-11-28, before any of its runs (the 2e-3 runs exist: compare_budgets').

Recipe: compare_budgets' (12 layers x 64, 2 heads, FFN 256, RoPE, sequence 64, batch 32,
dropout 0.1, AdamW, 10% warmup, linear decay to 0 at 4,800 steps, the committed 2,000-piece
tokenizer, the whole held-out split scored), one store with it: a run is one file
(docs/results/compare_layouts/budgets/runs/b4800-lr<rate>-<layout>-s<seed>.json).

Phase A, choose rates: each layout at 1e-3, 1.41e-3, 2e-3 and 2.83e-3 (steps of sqrt 2),
  seeds 0 and 1. A layout's rate = the rate of the best mean final [MASK] accuracy over the two
  seeds (a diverged run scores 0; ties: the smaller rate). A best rate at the grid's edge adds
  one rung that way (7.07e-4 below, 4e-3 above) before phase B, and the rate is chosen again
  over the five; a best rate at the edge of the grid as run is reported "not bracketed".
Phase B, confirm: seeds 2-7 for Post-LN at its rate r_P, RealFormer at its rate r_R and
  RealFormer at r_P (runs that exist are reused: at 2e-3, every seed 0-7 does).
Primary test P: RealFormer at r_R - Post-LN at r_P, [MASK] accuracy, paired on seeds 2-7 (they
  took no part in choosing the rates), two-sided at alpha 0.05, with the smallest difference
  it detects with 80% power.
Secondary, one Holm family of two:
  S1 the same on all selected positions (BERT's MLM accuracy, the paper's metric);
  S2 RealFormer - Post-LN both at r_P (the paper's protocol: Post-LN's tuned rate), [MASK]
     accuracy, seeds 2-7.
Verdicts: "not testable at this scale" when no run on either side learned (study.learned),
else "holds" / "does not hold" when the (Holm-adjusted) p-value is below 0.05 with the paper's
sign (RealFormer ahead) / the opposite one, else "inconclusive".

Compute: 12 phase-A runs (4 exist) + <= 4 extension runs + <= 18 phase-B runs of 4,800 steps;
the committed 4,800-step runs took ~33 min each with two processes on 2 cores: ~3.3 h for
phase A, ~3.3-5 h for phase B.
"""

from __future__ import annotations

import dataclasses

from realformer_jax.studies.plan import Arm, BestRate, Comparison, Plan, Side
from realformer_jax.studies.plans import budgets
from realformer_jax.studies.scale import TOY, Scale

# The budgets plan's recipe (its SCALE: compare_budgets' until 2026-11-28), with its store.
SCALE = budgets.SCALE


def make(scale: Scale, steps: int, rates, extend, choose_seeds, confirm_seeds, **where):
  choose = lambda layout: BestRate(f'r_{layout}', layout, rates, steps, choose_seeds, extend=extend)
  side = lambda layout, rate: Side(layout, rate, steps)
  return Plan(
    name='tuned_rates',
    title='RealFormer vs Post-LN, each at its own learning rate',
    scale=scale,
    rules=(choose('post'), choose('realformer')),
    arms=(  # one group: seed by seed
      (
        Arm('post', 'r_post', steps, confirm_seeds),
        Arm('realformer', 'r_realformer', steps, confirm_seeds),
        Arm('realformer', 'r_post', steps, confirm_seeds),
      ),
    ),
    comparisons=(
      Comparison(
        'P',
        'RealFormer at r_R - Post-LN at r_P',
        side('realformer', 'r_realformer'),
        side('post', 'r_post'),
        confirm_seeds,
      ),
      Comparison(
        'S1',
        'RealFormer at r_R - Post-LN at r_P, all positions',
        side('realformer', 'r_realformer'),
        side('post', 'r_post'),
        confirm_seeds,
        metric='accuracy',
        family='S',
      ),
      Comparison(
        'S2',
        'RealFormer - Post-LN, both at r_P',
        side('realformer', 'r_post'),
        side('post', 'r_post'),
        confirm_seeds,
        family='S',
      ),
    ),
    **where,
  )


PLANS = {
  'cpu': make(
    SCALE,
    4800,
    rates=(1e-3, 1.41e-3, 2e-3, 2.83e-3),
    extend=(7.07e-4, 4e-3),
    choose_seeds=(0, 1),
    confirm_seeds=(2, 3, 4, 5, 6, 7),
    store=budgets.STORE,
    out='docs/results/compare_layouts/tuned_rates',
    workdirs=budgets.WORKDIRS,
  ),
  # The smoke test: seconds a run.
  'toy': make(
    dataclasses.replace(TOY, steps=4),
    4,
    rates=(1e-3, 3e-3),
    extend=(3e-4, 1e-2),
    choose_seeds=(0,),
    confirm_seeds=(1, 2),
  ),
}

r"""P2 at 2,400 steps: does Post-LN fail at a peak learning rate where RealFormer still trains?

    python -m experiments.compare_stability --runs='*-s[02]' &   # split over 2 cores: one
    python -m experiments.compare_stability --runs='*-s[13]'     # process per pair of seeds
    python -m experiments.compare_stability --runs=none          # the report from what finished
    python -m experiments.compare_stability --quick --out=/tmp/cs --workdirs=/tmp/cs_runs

The paper's stability claim (claim 2): Post-LN diverges at a learning rate where RealFormer
trains (BERT-Large at 2e-4; RealFormer reaches 74.31). compare_layouts tested it at 600 steps
only, where both layouts failed to learn at 4e-3 (2 r*) and nothing could be decided. At 2,400
steps Post-LN learns at 4e-3 (compare_budgets' rate check: 28.35 and 29.71 % at [MASK]), so a
ladder of larger rates can reach the rate where Post-LN breaks. A divergence is a large,
qualitative effect: the kind of claim a miniature can decide.

The recipe is compare_budgets' (`compare_budgets.PLANS['cpu'].scale`: 12 layers x 64, RoPE,
2,000 pieces, sequence 64, batch 32, dropout 0.1, AdamW, 10% warmup, linear decay to 0, the
whole held-out split scored), trained by `compare_budgets.train_one` under the same run names
(`b2400-lr<rate>-<layout>-s<seed>`), so one run is one file in one store
(docs/results/compare_layouts/budgets/runs/) and serves both studies. Reused from it:
Post-LN and RealFormer at 2e-3 (r*; seeds 0, 2, 3 in both, 1 in Post-LN) and Post-LN at 4e-3,
seeds 0 and 1. The recipe check (analysis 'recipe_check'): for a seed and layout, every run's
step-1 training loss (taken before the first update, so it does not depend on the rate) must
agree to 1e-3 with the committed runs': same weights, same first batch, same dropout.

Plan, declared before any run (the code below follows it; `plan_runs`):
  cells     Post-LN and RealFormer at 2,400 steps, peak rates 2e-3 (r*), 4e-3, 8e-3, 1.6e-2;
            12 layers. Pre-LN (the stable reference) is left out: the compute does not allow
            it (see the compute plan).
  seeds     0, 1, 2, 3 in every cell, paired by seed (for a seed both layouts start from the
            same weights and see the same batches). Seeds 0-3 rather than 0, 2, 3, 4: both
            need three new runs to complete the reused cells (0-3: Post-LN 4e-3 s2, s3 and
            RealFormer 2e-3 s1; {0,2,3,4}: Post-LN 4e-3 s2, s3, s4), and 0-3 keeps the
            committed Post-LN 4e-3 seed-1 run while its new RealFormer 2e-3 seed-1 run is the
            one the budgets study is missing at 2,400 steps.
  order     8e-3, 1.6e-2, 4e-3, then 2e-3 (r*: only RealFormer seed 1 is new); per rate the
            seeds in turn, RealFormer then Post-LN, so pairs finish together.
  extension 3.2e-2 (both layouts, seeds 0-3) joins the plan only if Post-LN still learns in
            every run at 4e-3, 8e-3 and 1.6e-2 (decided once those 12 runs finished).
Rules per run (`outcome`):
  diverged  a non-finite loss, gradient or state ended it (train.DivergenceError), OR a finite
            blow-up: its last logged training loss or its final eval loss exceeds ln(vocab) +
            1 nat (ln 2000 = 7.60: the loss of a uniform guess, where every run starts; a model
            that ends a nat worse than guessing has blown up). A logged training loss above
            that line at any earlier step is reported as a spike, not a divergence.
  learned   study.learned: finished, final eval loss below the copy-aware unigram loss and
            [MASK] accuracy above the most frequent token's (the floors of the eval set).
  failed    diverged or not learned (a run stuck at the unigram plateau fails without
            diverging: the failure mode compare_layouts saw at 600 steps).
Tests, per rate above r* (4e-3, 8e-3, 1.6e-2, and 3.2e-2 if it is run), RealFormer vs Post-LN:
  S(rate)   the fraction failed: Boschloo's exact test, two-sided (`boschloo_exact`, unpaired:
            conservative for paired seeds). Family S = these rates, Holm. Verdict per rate:
            "holds" (adjusted p < 0.05, Post-LN fails more), "does not hold" (RealFormer fails
            more), "inconclusive"; "no difference: every run learned / failed" when the two
            sides agree in every run. With 4 seeds a side only a 4-of-4 vs 0-of-4 split is
            significant (p = 0.0078 < 0.05 / 4): the design is for the paper's qualitative
            effect, not for a shift in failure rates.
  A(rate)   final [MASK] accuracy, RealFormer - Post-LN, paired by seed over the seeds where
            both runs finished (a non-finite run has no model to score; its failure counts in
            S): stats.paired_ratio_comparison (seeds + eval-set bootstrap), family A = the same
            rates, Holm; verdict by compare_layouts.verdict ("not testable at this scale" when
            no run on either side learned), with the detectable difference (80% power).
  P2        the study's verdict, from family S: "holds" if some rate holds and none does not
            hold, "does not hold" in the mirror case, "mixed" if both occur; else "not testable:
            Post-LN learns at every rate" when it never failed, else "inconclusive". The two
            families answer two claims (stability, accuracy at a high rate), each at 5%.
A cell with fewer finished seeds than planned has the verdict "pending (k of n seeds)", and P2
stays pending until every planned cell is complete; pending rates enter Holm's family with
p = 1 (conservative: a later p can only lower the others' adjusted values).

Compute plan (2 cores, one process per core): the committed 2,400-step runs took 916 s each
(0.38 s a step) on an idle machine (470 s on a faster CPU; up to 2,833 s while the machine was
shared). New runs: 23 (8e-3: 8, 1.6e-2: 8, 4e-3: 6, 2e-3: 1) x 2,400 steps = 55,200 steps x
0.38 s / 2 processes = 2.9 h (less for runs that end non-finite); the extension adds 8 runs
(+1.0 h). Then (launched behind this study in the same processes) compare_budgets' missing
seed-1 runs (3,900 steps, 0.2 h) and its declared 4,800-step budget (16 runs x 4,800 steps,
4.1 h): ~7-8 h in all on an idle machine, more while it is shared.
Measured after the launch (two processes at nice 19 on a machine shared by seven sessions,
load average 17-28): 3.2 s a step over the first 600 steps, then under 1% of a core each while
the other sessions' work ran; the runs resume from their checkpoints (every 600 steps).

Writes to --out (default docs/results/compare_layouts/stability/): results.md, results.json,
curves.png (training loss per rate: failures and divergences visible), ladder.png (fraction
learned and [MASK] accuracy per rate). Run results go to --store/runs/<name>.json (default:
compare_budgets' folder at the CPU scale, --out otherwise); workdirs to --workdirs (default
results/compare_budgets/, compare_budgets' own: the same run resumes from the same
checkpoints). `--runs=none` selects no run: the report of whatever finished, nothing trained.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
from typing import Optional, Sequence

import numpy as np

from experiments import compare_budgets, compare_layouts
from studies import runs as runs_lib
from studies import stats, study
from studies.report import LAYOUT_COLORS, LAYOUT_NAMES, difference_cell, seed_cell, write_lines

LAYOUTS = compare_budgets.LAYOUTS  # ('post', 'realformer')
ALPHA = 0.05


@dataclasses.dataclass(frozen=True)
class Plan:
  scale: study.Scale
  steps: int
  reference: float  # r*: its cells are reused and reported, not tested
  rates: tuple[float, ...]  # the ladder above r*, in order of priority
  extension: float  # one rung more if Post-LN learns at every rate of the ladder
  seeds: tuple[int, ...]
  blowup_margin: float = 1.0  # nats above ln(vocab): a finite blow-up

  @property
  def blowup_loss(self) -> float:
    return math.log(self.scale.vocab) + self.blowup_margin


PLANS = {
  'cpu': Plan(
    compare_budgets.PLANS['cpu'].scale,
    steps=2400,
    reference=2e-3,
    rates=(8e-3, 1.6e-2, 4e-3),
    extension=3.2e-2,
    seeds=(0, 1, 2, 3),
  ),
  # The smoke test: seconds a run (compare_budgets' toy recipe).
  'toy': Plan(
    compare_budgets.PLANS['toy'].scale,
    steps=4,
    reference=3e-3,
    rates=(3e-2,),
    extension=3e-1,
    seeds=(0, 1),
  ),
}


def run_name(plan: Plan, rate: float, layout: str, seed: int) -> str:
  return compare_budgets.run_name(plan.steps, rate, layout, seed)


# ------------------------------------------------------------------------------------------
# The rules per run.


def outcome(run: Optional[dict], plan: Plan) -> Optional[dict]:
  """The declared rules for one run (module docstring); None while it has not finished."""
  if run is None:
    return None
  losses = [v for _, v in run.get('train_loss') or []]
  final = run.get('final') or {}
  ends = [x for x in (losses[-1] if losses else None, final.get('loss')) if x is not None]
  non_finite = run.get('diverged_at_step') is not None
  blew_up = any(not math.isfinite(x) or x > plan.blowup_loss for x in ends)
  diverged = non_finite or blew_up
  learned = bool(study.learned(run)) and not diverged
  return {
    'diverged': diverged,
    'non_finite_at_step': run.get('diverged_at_step'),
    'blew_up': blew_up and not non_finite,
    'spiked': any(math.isfinite(x) and x > plan.blowup_loss for x in losses) and not blew_up,
    'learned': learned,
    'failed': diverged or not learned,
    'mask_accuracy': float(final['mask_accuracy']) if 'mask_accuracy' in final else math.nan,
    'step1_loss': losses[0] if losses else math.nan,
  }


# ------------------------------------------------------------------------------------------
# The plan.


def ladder(results: dict, plan: Plan) -> tuple[float, ...]:
  """The tested rates: the plan's, and the extension once Post-LN learned in every run of
  them (all finished)."""
  outcomes = [
    outcome(results.get(run_name(plan, r, 'post', s)), plan) for r in plan.rates for s in plan.seeds
  ]
  extend = all(o is not None and o['learned'] for o in outcomes)
  return plan.rates + ((plan.extension,) if extend else ())


def extension_decided(results: dict, plan: Plan) -> bool:
  return all(results.get(run_name(plan, r, 'post', s)) for r in plan.rates for s in plan.seeds)


def plan_runs(results: dict, plan: Plan) -> list[runs_lib.Run]:
  """Every run of the plan the results so far define, in priority order (module docstring)."""
  rates = ladder(results, plan)
  rates = rates[: len(plan.rates)] + (plan.reference,) + rates[len(plan.rates) :]
  return [
    compare_budgets._run(plan.steps, rate, layout, seed)  # pylint: disable=protected-access
    for rate in rates
    for seed in plan.seeds
    for layout in ('realformer', 'post')
  ]


# ------------------------------------------------------------------------------------------
# Boschloo's exact test (no SciPy here: tests check it against scipy.stats.boschloo_exact).


def _hypergeom_cdf(k: int, total: int, successes: int, draws: int) -> float:
  """P(X <= k), X the successes among `draws` drawn from `total` holding `successes`."""
  low = max(0, draws - (total - successes))
  norm = math.comb(total, draws)
  return (
    sum(
      math.comb(successes, i) * math.comb(total - successes, draws - i)
      for i in range(low, min(k, successes, draws) + 1)
    )
    / norm
  )


def _boschloo_one_sided(x1: int, n1: int, x2: int, n2: int) -> float:
  """H1: group 1's rate is below group 2's. The statistic is Fisher's one-sided p-value
  P(X1 <= x1 | x1 + x2); the p-value its supremum over the common rate pi of
  P(statistic <= observed), on a grid of pi fine enough for a handful of runs a side."""
  fisher = np.array(
    [[_hypergeom_cdf(a, n1 + n2, a + b, n1) for b in range(n2 + 1)] for a in range(n1 + 1)]
  )
  extreme = fisher <= fisher[x1, x2] * (1 + 1e-13)  # scipy's guard against rounding
  pi = np.linspace(0.0, 1.0, 20001)

  def pmf(n):  # (n + 1, grid): P(X = k | pi), X ~ Binomial(n, pi)
    k = np.arange(n + 1)[:, None]
    return np.array([math.comb(n, int(i)) for i in k[:, 0]])[:, None] * pi**k * (1 - pi) ** (n - k)

  prob = np.einsum('ag,bg,ab->g', pmf(n1), pmf(n2), extreme.astype(np.float64))
  return float(min(1.0, prob.max()))


def boschloo_exact(x1: int, n1: int, x2: int, n2: int) -> float:
  """Two-sided p-value of Boschloo's exact test that two binomial rates are equal (x1 of n1
  against x2 of n2): twice the smaller one-sided p-value, as scipy.stats.boschloo_exact."""
  if n1 < 1 or n2 < 1 or not (0 <= x1 <= n1 and 0 <= x2 <= n2):
    raise ValueError(f'boschloo_exact: {x1} of {n1} against {x2} of {n2}')
  if x1 + x2 in (0, n1 + n2):
    return 1.0
  less = _boschloo_one_sided(x1, n1, x2, n2)
  greater = _boschloo_one_sided(n1 - x1, n1, n2 - x2, n2)
  return float(min(1.0, 2 * min(less, greater)))


# ------------------------------------------------------------------------------------------
# Analysis.


def cell(results: dict, plan: Plan, rate: float) -> dict:
  """One rate: per layout its runs' outcomes by seed; the seeds finished on both sides."""
  sides = {}
  for layout in LAYOUTS:
    finished = {
      s: outcome(results.get(run_name(plan, rate, layout, s)), plan)
      for s in plan.seeds
      if run_name(plan, rate, layout, s) in results
    }
    sides[layout] = {
      'seeds': sorted(finished),
      'failed': [finished[s]['failed'] for s in sorted(finished)],
      'diverged': [finished[s]['diverged'] for s in sorted(finished)],
      'non_finite': [finished[s]['non_finite_at_step'] is not None for s in sorted(finished)],
      'blew_up': [finished[s]['blew_up'] for s in sorted(finished)],
      'spiked': [finished[s]['spiked'] for s in sorted(finished)],
      'learned': [finished[s]['learned'] for s in sorted(finished)],
      'mask_accuracy': [finished[s]['mask_accuracy'] for s in sorted(finished)],
      'step1_loss': {s: finished[s]['step1_loss'] for s in sorted(finished)},
    }
  paired = [s for s in plan.seeds if all(s in sides[l]['seeds'] for l in LAYOUTS)]
  return {
    'rate': rate,
    'sides': sides,
    'paired_seeds': paired,
    'complete': paired == list(plan.seeds),
  }


def _pending(row: dict, plan: Plan) -> str:
  return f'pending ({len(row["paired_seeds"])} of {len(plan.seeds)} seeds)'


def failure_test(row: dict) -> dict:
  post, real = row['sides']['post'], row['sides']['realformer']
  x_post, x_real = sum(post['failed']), sum(real['failed'])
  return {
    'failed_post': x_post,
    'failed_realformer': x_real,
    'n_post': len(post['failed']),
    'n_realformer': len(real['failed']),
    'p_value': boschloo_exact(x_real, len(real['failed']), x_post, len(post['failed'])),
  }


def failure_verdict(row: dict, plan: Plan) -> str:
  if not row['complete']:
    return _pending(row, plan)
  test = row['failure']
  n = len(plan.seeds)
  same = test['failed_post'] == test['failed_realformer']
  if same and test['failed_post'] in (0, n):
    return f'no difference: every run {"learned" if test["failed_post"] == 0 else "failed"}'
  if row['holm_p_value'] >= ALPHA:
    return 'inconclusive'
  return 'holds' if test['failed_post'] > test['failed_realformer'] else 'does not hold'


def p2_verdict(rows: Sequence[dict], decided: bool, plan: Plan) -> str:
  if not decided or not all(r['complete'] for r in rows):
    done = sum(r['complete'] for r in rows)
    return f'pending ({done} of {len(rows)} rates complete' + (
      ')' if decided else '; the extension is not decided yet)'
    )
  verdicts = [r['failure_verdict'] for r in rows]
  holds, opposite = 'holds' in verdicts, 'does not hold' in verdicts
  if holds and opposite:
    return 'mixed'
  if holds or opposite:
    return 'holds' if holds else 'does not hold'
  if not any(any(r['sides']['post']['failed']) for r in rows):
    return 'not testable: Post-LN learns at every rate'
  return 'inconclusive'


def recipe_check(results: dict, plan: Plan) -> dict:
  """compare_budgets.recipe_check over this study's budget (any rate)."""
  at_budget = {n: r for n, r in results.items() if n.startswith(f'b{plan.steps}-')}
  return compare_budgets.recipe_check(at_budget, plan.seeds)


def analyse(results: dict, plan: Plan) -> dict:
  rates = ladder(results, plan)
  decided = extension_decided(results, plan)
  rows = [cell(results, plan, rate) for rate in rates]
  for row in rows:
    row['failure'] = failure_test(row) if row['complete'] else None
    comparison = compare_budgets.compare(
      results, plan, row['rate'], plan.steps, compare_budgets.COMPARISONS[0]
    )
    row['accuracy'] = comparison
  family = len(rates) + (0 if decided else 1)  # an undecided extension counts as pending
  padding = [1.0] * (family - len(rows))
  adjusted = stats.holm([r['failure']['p_value'] if r['failure'] else 1.0 for r in rows] + padding)
  for row, p in zip(rows, adjusted):
    row['holm_p_value'] = p
    row['failure_verdict'] = failure_verdict(row, plan)
  accuracy_p = [
    r['accuracy']['comparison']['p_value'] if r['accuracy']['comparison'] else 1.0 for r in rows
  ]
  for row, p in zip(rows, stats.holm(accuracy_p + padding)):
    row['accuracy']['holm_p_value'] = p
    row['accuracy']['verdict'] = (
      compare_layouts.verdict(row['accuracy'], p) if row['complete'] else _pending(row, plan)
    )
  reference = cell(results, plan, plan.reference)
  return {
    'rates': list(rates),
    'extension_decided': decided,
    'rows': rows,
    'reference': reference,
    'p2_verdict': p2_verdict(rows, decided, plan),
    'recipe_check': recipe_check(results, plan),
  }


@functools.cache
def scale_facts(plan: Plan) -> dict:
  """What a reader compares with the paper's scale: the model's parameters (both layouts have
  the same), the tokens one run trains on and the vocabulary."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from realformer_jax import MaskedLM, train  # pylint: disable=import-outside-toplevel
  from realformer_jax.model.params import count_params  # pylint: disable=import-outside-toplevel

  config = study.mlm_config(plan.scale, seed=0, model=compare_layouts.LAYOUTS['realformer'])
  model = train.validate_config(config).model
  ids = jnp.zeros((1, 8), jnp.int32)
  abstract = jax.eval_shape(lambda: MaskedLM(model).init(jax.random.key(0), ids))
  return {
    'parameters': count_params(abstract['params']),
    'tokens_per_run': plan.steps * plan.scale.batch * plan.scale.seq_len,
    'vocab': plan.scale.vocab,
  }


# ------------------------------------------------------------------------------------------
# Report.


def _fraction(flags: list[bool]) -> str:
  return f'{sum(flags)}/{len(flags)}' if flags else 'n/a'


def _accuracy(side: dict) -> str:
  return seed_cell(side['mask_accuracy'], scale=100) if side['seeds'] else 'n/a'


def write_markdown(path: str, results: dict, analysis: dict, plan: Plan, command: str) -> None:
  scale = plan.scale
  floors = compare_layouts.floors_of(results)
  check = analysis['recipe_check']
  lines = [
    '# P2 at 2,400 steps: Post-LN vs RealFormer on a learning-rate ladder',
    '',
    f'Regenerate: `{command} --runs=none` (train: see the script; the plan is declared in its '
    f"docstring). compare_budgets' recipe: {scale.layers} layers x {scale.hidden} hidden, "
    f'{scale.heads} heads, FFN {scale.mlp}, {scale.position_embedding} positions, sequence '
    f'{scale.seq_len}, batch {scale.batch}, {plan.steps:,} AdamW steps (10% warmup, linear '
    f'decay to 0), dropout {scale.dropout}, planned seeds {list(plan.seeds)}. Floor at [MASK] '
    f'(most frequent token): {100 * floors.get("mask_accuracy", math.nan):.2f}%. '
    f'{analysis["scale"]["parameters"]:,} parameters; a run trains on '
    f'{analysis["scale"]["tokens_per_run"]:,} tokens ({plan.steps:,} x {scale.batch} x '
    f'{scale.seq_len}).',
    '',
    'Rules per run: **diverged** = a non-finite loss ended it, or its last training loss or '
    f'final eval loss is above ln(vocab) + {plan.blowup_margin:g} = {plan.blowup_loss:.2f} '
    'nats (a finite blow-up); **learned** = study.learned (eval loss below the copy-aware '
    'unigram loss, [MASK] accuracy above the floor); **failed** = diverged or not learned.',
    '',
    compare_budgets.recipe_line(check),
    '',
    f'## P2 verdict: {analysis["p2_verdict"]}',
    '',
    '## Per rate (failed / diverged / learned: runs of those finished)',
    '',
    '| peak rate | layout | finished seeds | failed | diverged (non-finite, blow-up) | learned '
    '| final [MASK] accuracy (%) |',
    '|---|---|---|---|---|---|---|',
  ]
  for row in sorted([analysis['reference']] + analysis['rows'], key=lambda r: r['rate']):
    for layout in LAYOUTS:
      side = row['sides'][layout]
      lines.append(
        f'| {row["rate"]:g}{" (r*)" if row is analysis["reference"] else ""} | '
        f'{LAYOUT_NAMES[layout]} | {side["seeds"]} | {_fraction(side["failed"])} | '
        f'{_fraction(side["diverged"])} ({sum(side["non_finite"])}, {sum(side["blew_up"])}) | '
        f'{_fraction(side["learned"])} | {_accuracy(side)} |'
      )
  lines += [
    '',
    '## Tests, RealFormer vs Post-LN per rate above r*',
    '',
    "S: fraction failed, Boschloo's exact test (two-sided), Holm over the rates. A: final "
    '[MASK] accuracy, RealFormer - Post-LN in points, paired by seed over the seeds both '
    'finished (95% interval: seeds + eval-set bootstrap), Holm over the rates; detectable: '
    'the smallest difference this design finds with 80% power at two-sided 5%.',
    '',
    '| peak rate | failed Post-LN / RealFormer | S p | S Holm p | S verdict | A difference '
    '| A Holm p | A detectable | A verdict |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for row in sorted(analysis['rows'], key=lambda r: r['rate']):
    f, a = row['failure'], row['accuracy']
    c = a['comparison']
    lines.append(
      f'| {row["rate"]:g} | '
      + (
        f'{f["failed_post"]}/{f["n_post"]} / {f["failed_realformer"]}/{f["n_realformer"]} | '
        f'{f["p_value"]:.3g} | {row["holm_p_value"]:.3g}'
        if f
        else 'n/a | n/a | n/a'
      )
      + f' | {row["failure_verdict"]} | '
      + (
        f'{difference_cell(c)} ({c["n"]} seeds) | '
        f'{a["holm_p_value"]:.3g} | {100 * a["detectable"]:.2f}'
        if c
        else 'n/a | n/a | n/a'
      )
      + f' | {a["verdict"]} |'
    )
  if not analysis['extension_decided']:
    lines += [
      '',
      f'The extension to {plan.extension:g} is not decided yet (it needs every Post-LN run at '
      f'{", ".join(f"{r:g}" for r in plan.rates)}).',
    ]
  elif plan.extension not in analysis['rates']:
    lines += ['', f'No extension to {plan.extension:g}: Post-LN failed in some run of the ladder.']
  lines += [
    '',
    '![training loss per rate](curves.png)',
    '',
    '![fraction learned and accuracy per rate](ladder.png)',
    '',
  ]
  write_lines(path, lines)


def write_plots(out: str, results: dict, analysis: dict, plan: Plan) -> list[str]:
  plt = study.pyplot()
  if plt is None:
    return []
  rates = sorted([plan.reference] + list(analysis['rates']))
  paths = []
  # 1. Training loss per rate, one panel each, every finished seed a line.
  fig, axes = plt.subplots(1, len(rates), figsize=(3.6 * len(rates), 3.8), sharey=True)
  for ax, rate in zip(np.atleast_1d(axes), rates):
    for layout in LAYOUTS:
      for seed in plan.seeds:
        run = results.get(run_name(plan, rate, layout, seed))
        if run and run.get('train_loss'):
          steps, losses = zip(*study.resumed_curve(run['train_loss']))
          ax.plot(
            steps,
            losses,
            color=LAYOUT_COLORS[layout],
            lw=0.9,
            alpha=0.7,
            label=LAYOUT_NAMES[layout] if seed == plan.seeds[0] else None,
          )
    if not ax.lines:
      ax.text(0.5, 0.5, 'no run finished yet', ha='center', transform=ax.transAxes, color='gray')
    ax.axhline(plan.blowup_loss, color='black', ls='--', lw=0.7, label='blow-up line')
    study.draw_floors(ax, compare_layouts.floors_of(results), 'loss')
    ax.set_title(f'peak rate {rate:g}', fontsize=9)
    ax.set_xlabel('step')
  np.atleast_1d(axes)[0].set_ylabel('training loss (nats)')
  np.atleast_1d(axes)[0].legend(fontsize=7)
  paths.append(study.save_figure(fig, os.path.join(out, 'curves.png'), dpi=100))
  # 2. The ladder: fraction learned and final [MASK] accuracy (each seed a dot) per rate.
  rows = sorted([analysis['reference']] + analysis['rows'], key=lambda r: r['rate'])
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
  for i, layout in enumerate(LAYOUTS):
    shift = (i - 0.5) * 0.06
    xs = [math.log2(r['rate']) + shift for r in rows if r['sides'][layout]['seeds']]
    learned = [np.mean(r['sides'][layout]['learned']) for r in rows if r['sides'][layout]['seeds']]
    left.plot(xs, learned, 'o-', color=LAYOUT_COLORS[layout], label=LAYOUT_NAMES[layout])
    for r in rows:
      values = [100 * v for v in r['sides'][layout]['mask_accuracy'] if math.isfinite(v)]
      right.scatter(
        [math.log2(r['rate']) + shift] * len(values),
        values,
        s=14,
        color=LAYOUT_COLORS[layout],
        label=None,
      )
  ticks = [math.log2(r) for r in rates]
  for ax in (left, right):
    ax.set_xticks(ticks, [f'{r:g}' for r in rates])
    ax.set_xlabel('peak learning rate')
  left.set_ylabel('fraction of finished runs that learned')
  left.set_ylim(-0.05, 1.05)
  left.legend(fontsize=8)
  study.draw_floors(right, compare_layouts.floors_of(results), 'mask_accuracy')
  right.set_ylabel('final [MASK] accuracy (%), each seed')
  right.legend(fontsize=7)
  paths.append(study.save_figure(fig, os.path.join(out, 'ladder.png'), dpi=100))
  return paths


def main(argv=None) -> dict:
  parser = study.argument_parser(
    __doc__,
    out='docs/results/compare_layouts/stability',
    workdirs='results/compare_budgets',
    scales=PLANS,
  )
  parser.add_argument(
    '--store',
    default='',
    help="where runs/<name>.json live (default: compare_budgets' folder at the cpu scale, "
    'else --out)',
  )
  args = parser.parse_args(argv)
  cpu = study.scale_name(args) == 'cpu'
  store = args.store or ('docs/results/compare_layouts/budgets' if cpu else args.out)
  # compare_budgets' runs (its train_one reads the plan's scale only): reused where they exist.
  plan, results = study.run_plan(args, PLANS, plan_runs, compare_budgets.train_one, store)
  analysis = analyse(results, plan)
  analysis['scale'] = scale_facts(plan)  # traces the model: here, not in every analysis
  record = {
    'scale': dataclasses.asdict(plan.scale),
    'plan': {k: v for k, v in dataclasses.asdict(plan).items() if k != 'scale'},
    'store': store,
    'analysis': analysis,
  }
  return study.write_plan_report(
    args, 'compare_stability', record, results, analysis, plan, write_markdown, write_plots
  )


if __name__ == '__main__':
  main(sys.argv[1:])

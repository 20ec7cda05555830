r"""P2 at 2,400 steps: does Post-LN fail at a peak learning rate where RealFormer still trains?

    python -m experiments.study --plan=stability --runs='*-s[02]' &   # split over 2 cores: one
    python -m experiments.study --plan=stability --runs='*-s[13]'     # process per seed pair
    python -m experiments.study --plan=stability --runs=none          # the report

The paper's stability claim (claim 2): Post-LN diverges at a learning rate where RealFormer
trains (BERT-Large at 2e-4; RealFormer reaches 74.31). The layouts study tested it at 600 steps
only, where both layouts failed to learn at 4e-3 (2 r*) and nothing could be decided. At 2,400
steps Post-LN learns at 4e-3 (the budgets plan's rate check: 28.35 and 29.71 % at [MASK]), so
a ladder of larger rates can reach the rate where Post-LN breaks. A divergence is a large,
qualitative effect: the kind of claim a miniature can decide.

The recipe is the budgets plan's (12 layers x 64, RoPE, 2,000 pieces, sequence 64, batch 32,
dropout 0.1, AdamW, 10% warmup, linear decay to 0, the whole held-out split scored) under the
same run names (`b2400-lr<rate>-<layout>-s<seed>`) in the same store, so one run serves both.
Reused from it: Post-LN and RealFormer at 2e-3 (r*) and Post-LN at 4e-3, seeds 0 and 1.

Plan, declared before any run (2026-11-26; since 2026-11-28 written as this plan, run by
studies/runner.py, which reproduces its committed numbers):
  cells     Post-LN and RealFormer at 2,400 steps, peak rates 2e-3 (r*), 4e-3, 8e-3, 1.6e-2;
            12 layers. Pre-LN (the stable reference) is left out: the compute did not allow it.
  seeds     0, 1, 2, 3 in every cell, paired by seed.
  order     8e-3, 1.6e-2, 4e-3, then 2e-3 (r*: only RealFormer seed 1 was new); per rate the
            seeds in turn, RealFormer then Post-LN, so pairs finish together.
  extension 3.2e-2 (both layouts, seeds 0-3) joins the plan only if Post-LN learns in every run
            at 4e-3, 8e-3 and 1.6e-2 (decided once those 12 runs finished).
Rules per run (Plan.outcome): diverged = a non-finite loss, gradient or state ended it, or its
last logged training loss or final eval loss exceeds ln(vocab) + 1 nat (ln 2000 = 7.60: a
uniform guess, where every run starts); a logged loss above that line earlier is a spike.
Learned = study.learned and not diverged; failed = diverged or not learned.
Tests, per rate above r* (and 3.2e-2 if it is run), RealFormer vs Post-LN:
  S(rate)  the fraction failed: Boschloo's exact test, two-sided (unpaired: conservative for
           paired seeds), family S, Holm. "holds" (Post-LN fails more), "does not hold",
           "inconclusive"; "no difference: every run learned / failed" when the two sides agree
           in every run. With 4 seeds a side only a 4-of-4 vs 0-of-4 split is significant
           (p = 0.0078 < 0.05 / 4): the design is for the paper's qualitative effect.
  A(rate)  final [MASK] accuracy, RealFormer - Post-LN, paired by seed over the seeds where both
           runs finished, family A, Holm.
  P2       the study's verdict, from family S (`p2_verdict`): "holds" if some rate holds and
           none does not hold, "does not hold" in the mirror case, "mixed" if both occur; else
           "not testable: Post-LN learns at every rate" when it never failed, else
           "inconclusive".
A member of a family whose runs are unfinished, or whose condition is undecided, counts p = 1.
Added 2026-11-28, after the runs: A(rate) on all selected positions (the paper's metric), in
its own Holm family (it changes no declared verdict).
"""

from __future__ import annotations

from realformer_jax.studies.plan import AllLearned, Arm, Comparison, Plan, Side, all_positions_twins
from realformer_jax.studies.plans import budgets


def p2_verdict(analysis: dict) -> dict:
  """The study's verdict on claim 2 from the failure tests (module docstring)."""
  rows = [r for r in analysis['comparisons'] if r['family'] == 'S']
  decided = analysis['rules']['extend']['value'] is not None
  complete = sum(r['complete'] for r in rows)
  if not decided or complete < len(rows):
    extension = '' if decided else '; the extension is not decided yet'
    return {'P2': f'pending ({complete} of {len(rows)} rates complete{extension})'}
  verdicts = [r['verdict'] for r in rows]
  holds, opposite = 'holds' in verdicts, 'does not hold' in verdicts
  if holds and opposite:
    return {'P2': 'mixed'}
  if holds or opposite:
    return {'P2': 'holds' if holds else 'does not hold'}
  if not any(r['failures']['failed_b'] for r in rows):
    return {'P2': 'not testable: Post-LN learns at every rate'}
  return {'P2': 'inconclusive'}


def make(scale, steps, reference, rates, extension, seeds, **where) -> Plan:
  pair = lambda rate, when='': tuple(
    Arm(layout, rate, steps, seeds, when=when) for layout in ('realformer', 'post')
  )
  comparisons = []
  for rate in rates + (extension,):
    when = 'extend' if rate == extension else ''
    a, b = Side('realformer', rate, steps), Side('post', rate, steps)
    comparisons += [
      Comparison(
        f'S@{rate:g}',
        f'fraction failed at {rate:g}',
        a,
        b,
        seeds,
        family='S',
        when=when,
        test='failures',
      ),
      Comparison(
        f'A@{rate:g}', f'RealFormer - Post-LN at {rate:g}', a, b, seeds, family='A', when=when
      ),
    ]
  return Plan(
    name='stability',
    title='P2 at 2,400 steps: Post-LN vs RealFormer on a learning-rate ladder',
    scale=scale,
    rules=(AllLearned('extend', tuple(Arm('post', r, steps, seeds) for r in rates)),),
    arms=(*(pair(r) for r in rates), pair(reference), pair(extension, when='extend')),
    comparisons=tuple(comparisons)
    + all_positions_twins(comparisons, tuple(c.key for c in comparisons if c.family == 'A')),
    conclude=p2_verdict,
    **where,
  )


PLANS = {
  'cpu': make(
    budgets.SCALE,
    steps=2400,
    reference=2e-3,
    rates=(8e-3, 1.6e-2, 4e-3),
    extension=3.2e-2,
    seeds=(0, 1, 2, 3),
    store=budgets.STORE,
    out='docs/results/compare_layouts/stability',
    workdirs=budgets.WORKDIRS,
  ),
  # The smoke test: seconds a run (the budgets plan's toy recipe).
  'toy': make(
    budgets.PLANS['toy'].scale, steps=4, reference=3e-3, rates=(3e-2,), extension=3e-1, seeds=(0, 1)
  ),
}

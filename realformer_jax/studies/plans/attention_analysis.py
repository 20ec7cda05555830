r"""Attention entropy and adjacent-layer similarity of trained models (RealFormer paper, sec. 4.4),
from the layouts study's checkpoints: nothing is trained.

    python -m experiments.study --plan=attention_analysis    # after the layouts study, ~5 min

The models are the layouts study's (studies/plans/layouts.py) Post-LN and RealFormer runs at r*
(Post-LN's best peak rate, read from its report's results.json) for its confirmation seeds, from
its store (runs/<name>.json) and workdirs: the same seeds give the same data order and the same
initial weights, so differences are paired by seed. A run of this plan analyses one of them
over its held-out split (the evaluation batches, masked as in evaluation), from the attention
probabilities the model sows, one batch at a time:

  * entropy  H(p) = -sum_k p_k ln p_k of every (layer, head, real query token) distribution;
    per layer: mean, the spread across heads and tokens (standard deviation), and a sample for
    violin plots;
  * Jensen-Shannon divergence (natural log, at most ln 2) between the distributions of the same
    head and token in adjacent layers l and l + 1, averaged per layer pair.
Seeds give the intervals: each statistic is computed per trained model, then mean and 95%
Student-t interval over seeds. The paper's three statements, declared before the analysis and
Holm-corrected as one family (RealFormer - Post-LN, paired by seed, seeds whose two runs both
learned masked-LM; study.learned), are the plan's comparisons:

  5a  the top layer's mean entropy is lower (sparser attention);
  5b  the top layer's entropy spread across heads and tokens (std) is lower;
  5c  adjacent layers are more alike: the JSD averaged over the middle third of layer pairs
      is lower.
Verdict: "not testable at this scale" with fewer than 2 such seeds; else "holds" / "does not
hold" when the Holm-adjusted p-value is below 0.05 with the paper's / the opposite sign, else
"inconclusive".

Trainer and report 'attention' (studies/attention_analysis.py). Report
(docs/results/attention_analysis/): results.md, results.json, entropy.png, jsd.png,
runs/<layout>-s<seed>.json; the toy scale reads the toy layouts plan's runs, so its smoke test
declares where they are (tests/experiments/test_experiment_commands.py).
"""

from __future__ import annotations

from realformer_jax.studies.layouts_runs import PretrainingFinished
from realformer_jax.studies.plan import Arm, Comparison, Plan, Side
from realformer_jax.studies.plans import layouts

LAYOUTS = ('post', 'realformer')  # the report's columns; differences are the second - the first
# key, statement, statistic (per model), the paper's sign of RealFormer - Post-LN
CLAIMS = (
  ('5a', 'top layer: mean entropy lower', 'top_entropy', -1),
  ('5b', 'top layer: entropy std across heads and tokens lower', 'top_entropy_std', -1),
  ('5c', 'adjacent layers more alike: JSD over the middle third of pairs lower', 'middle_jsd', -1),
)


def make(
  pretraining: Plan,
  seeds,
  max_batches: int = -1,
  rate=None,
  tags=('',),
  name='attention_analysis',
  **where,
) -> Plan:
  """Analyses the runs of `pretraining` (the plan whose store and workdirs hold them) at `rate`
  (None: the layouts study's r*) and, for each of `tags`, that tag's runs (the depth study's
  'L6-', ...); `max_batches` held-out batches per model (-1: every eval batch of the run).

  Each tag is its own analysis with its own Holm family of the three statements (its report a
  subfolder named by the tag); a tagged arm waits for its pretraining runs (PretrainingFinished),
  so the plan runs what has finished and no more."""
  tagged = tags != ('',)
  # Nothing is trained: an arm's rate and steps are 0 (its runs are named by tag, layout, seed).
  side = lambda layout, tag: Side(layout, 0.0, 0, tag)
  finished = lambda tag: f'{tag}pretraining finished' if tagged else ''
  return Plan(
    name=name,
    title='Attention entropy and adjacent-layer JSD',
    scale=pretraining.scale,
    name_format='{tag}{variant}-s{seed}',
    arms=tuple(
      tuple(Arm(layout, 0.0, 0, seeds, tag=tag, when=finished(tag)) for layout in LAYOUTS)
      for tag in tags
    ),
    rules=tuple(PretrainingFinished(finished(tag), tag, LAYOUTS, seeds) for tag in tags)
    if tagged
    else (),
    comparisons=tuple(
      Comparison(
        f'{tag}{key}',
        statement,
        side('realformer', tag),
        side('post', tag),
        seeds,
        stat,
        sign,
        family=f'{tag}5',
        when=finished(tag),
      )
      for tag in tags
      for key, statement, stat, sign in CLAIMS
    ),
    trainer='attention',
    report='attention',
    options=dict(pretraining=pretraining, max_batches=max_batches, rate=rate),
    **where,
  )


PLANS = {
  'cpu': make(
    layouts.PLANS['cpu'],
    (0, 1, 2, 3),
    out='docs/results/attention_analysis',
    workdirs='results/attention_analysis',
  ),
  # The toy layouts plan names no folders: a smoke test gives them (module docstring).
  'toy': make(layouts.PLANS['toy'], (0, 1), max_batches=1),
}

r"""RealFormer vs Post-LN after fine-tuning, from pretrainings that learned masked-LM, with a
from-scratch control.

    python -m experiments.study --plan=finetune_compare          # after the layouts study;
    python -m experiments.study --plan=finetune_compare --runs='*-s[02]' &   # ~45 min on 2
    python -m experiments.study --plan=finetune_compare --runs='*-s1'        # cores, split
    python -m experiments.study --plan=finetune_compare --runs=none          # the report only

1. Starting points: the layouts study's (studies/plans/layouts.py) Post-LN and RealFormer runs
   at r* (Post-LN's best peak rate, read from its report's results.json; 12 layers x 64, RoPE)
   for pretraining seeds 0, 1, 2, from its store (runs/<name>.json) and workdirs; the control
   ('scratch') is the same architecture (Post-LN) and tokenizer, randomly initialised.
2. Fine-tune each on bible_sections (which of 7 sections of the canon an ASV verse is from;
   test chapters shared with no other split): `train_examples` evenly spaced training verses,
   `epochs` epochs at the arm's peak rate, validation every epoch, the best checkpoint by
   validation accuracy scored on the test split. The fine-tuning seed is the pretraining seed,
   so RealFormer and Post-LN are paired by seed (same data order, and their pretrainings
   started from the same weights).
3. Report test accuracy and Matthews correlation per starting point (mean, 95% Student-t
   interval over seeds, per-seed values), the best checkpoint's step beside the last step (a
   best step that is the last one means training stopped too early), the paired differences
   (the comparisons) and the majority-class baseline.
Verdict of a difference by the layout study's rule: "not testable at this scale" when a
pretraining did not learn masked-LM (study.learned), else holds / does not hold when the 95%
interval of the paired difference in test accuracy excludes 0 with the paper's / the opposite
sign, else inconclusive.

Trainer and report 'finetune' (studies/finetune_compare.py). Report (docs/results/finetune/):
results.md, results.json, test_accuracy.png, runs/<start>-s<seed>.json; workdirs in
results/finetune_compare/. The toy scale reads the toy layouts plan's runs, so its smoke test
declares where they are (tests/experiments/test_experiment_commands.py).
"""

from __future__ import annotations

from realformer_jax.studies.plan import Arm, Comparison, Plan, Side
from realformer_jax.studies.plans import layouts

# name: (the layouts run it starts from, or '' for random weights, plot colour)
STARTS = {'realformer': ('realformer', 'tab:red'), 'post': ('post', 'tab:blue')}
STARTS['scratch'] = ('', 'tab:gray')
SCRATCH_LIKE = 'post'  # the layout whose architecture and tokenizer the control takes
NAMES = {'realformer': 'RealFormer', 'post': 'Post-LN', 'scratch': 'Post-LN from scratch'}
DIFFERENCES = (('realformer', 'post'), ('realformer', 'scratch'), ('post', 'scratch'))


def make(pretraining: Plan, seeds, *, rate, train_examples, epochs, batch, quick=False, **where):
  """Fine-tunes from `pretraining` (the layouts plan whose store and workdirs hold the runs)."""
  # The schedule's steps (fine-tuning sets them from the epochs): an arm's cost, for the ETA.
  steps = int(epochs * -(-train_examples // batch))
  side = lambda start: Side(start, rate, steps)
  return Plan(
    name='finetune_compare',
    title='Fine-tuning RealFormer vs Post-LN on the embedded task (bible_sections)',
    scale=pretraining.scale,
    name_format='{variant}-s{seed}',
    arms=(tuple(Arm(start, rate, steps, seeds) for start in STARTS),),
    comparisons=tuple(
      Comparison(f'{a} - {b}', f'{NAMES[a]} - {NAMES[b]}', side(a), side(b), seeds, 'accuracy')
      for a, b in DIFFERENCES
    ),
    trainer='finetune',
    report='finetune',
    options=dict(
      pretraining=pretraining,
      starts={k: v[0] for k, v in STARTS.items()},
      scratch_like=SCRATCH_LIKE,
      names=NAMES,
      colors={k: v[1] for k, v in STARTS.items()},
      train_examples=train_examples,
      epochs=epochs,
      batch=batch,
      quick=quick,  # toy sizes: 32-token verses, a log line every 2 steps
    ),
    **where,
  )


# Seconds a run: 64 verses, batch 8, 2 epochs (the schedule ends at step 16).
TOY = dict(rate=5e-4, train_examples=64, epochs=2, batch=8, quick=True)

PLANS = {
  'cpu': make(
    layouts.PLANS['cpu'],
    (0, 1, 2),
    rate=5e-4,
    train_examples=2400,
    epochs=16,
    batch=32,
    out='docs/results/finetune',
    workdirs='results/finetune_compare',
  ),
  # The toy layouts plan names no folders: a smoke test gives them (module docstring).
  'toy': make(layouts.PLANS['toy'], (0, 1), **TOY),
}

r"""Length extrapolation: Su's Attention-O vs Attention-E, with and without residual attention.

    python -m experiments.study --plan=length_extrapolation     # CPU grid, ~1 h on 2 idle cores
    python -m experiments.study --plan=length_extrapolation --scale=roformer_small  # accelerator
    python -m experiments.study --plan=length_extrapolation --quick --out=/tmp/le --workdirs=/tmp/lw

Trains BERT-style (Post-LN) MLMs with rotary positions (RoFormer form,
`position_embedding='rope'`) at sequence length n = 64 on the embedded corpus, through the real
pretraining loop, then evaluates MLM accuracy on the whole held-out split packed at n = 64, 128,
256, 512, 1024 (the same text at every n, the same masking rule, a fixed masking seed: every
variant is scored on the same masked tokens at a given n; trainer 'at_lengths',
studies/lengths.py). Variants cross the attention scale, standard 1/sqrt(d) ("Attention-O") or
entropy-invariant log_512(n)/sqrt(d) ("Attention-E", n = the row's real key count), with
residual attention off (Post-LN) or on (RealFormer). With residual attention the softmax sees
the sum of every earlier layer's scores, each scaled by log_512(n): does the factor still keep
attention from spreading out as n grows? Besides accuracy, each evaluation measures the mean
attention entropy of every layer (nats, over heads and real query tokens) to see exactly that.

Report (docs/results/length_extrapolation/): results.md ([MASK] accuracy at every n beside the
context-free floors; all-prediction accuracy beside the floors and Su's RoFormer-small numbers;
the accuracy kept from n = 64 by the runs that learned; the paired differences below with seed
+ eval-set intervals, Holm-corrected as one family over every n, with verdicts; attention
entropy), accuracy.png, results.json, runs/<variant>-s<seed>.json; workdirs in
results/length_extrapolation/.
"""

from __future__ import annotations

import dataclasses

from realformer_jax.studies.plan import Arm, Comparison, Plan, Side
from realformer_jax.studies.scale import ACCELERATOR, CPU, TOY

VARIANTS = {  # run-name slug: (label, model fields, plot colour)
  'O': ('O (standard)', dict(ln_placement='post', attention_scale='standard'), 'tab:blue'),
  'E': (
    'E (entropy-invariant)',
    dict(ln_placement='post', attention_scale='entropy_invariant'),
    'tab:orange',
  ),
  'O-ra': (
    'O + residual attention',
    dict(ln_placement='realformer', attention_scale='standard'),
    'tab:green',
  ),
  'E-ra': (
    'E + residual attention',
    dict(ln_placement='realformer', attention_scale='entropy_invariant'),
    'tab:red',
  ),
}
LENGTHS = (64, 128, 256, 512, 1024)
SEEDS = (0, 1, 2)
# Su Jianlin's RoFormer-small MLM accuracy (%) trained at n = 64, one run each (his blog post on
# entropy-invariant attention scaling, kexue.fm, December 2021; the attention_scale docstring).
SU = {
  'O (standard)': dict(zip(LENGTHS, (43.27, 36.53, 23.02, 15.12, 11.54))),
  'E (entropy-invariant)': dict(zip(LENGTHS, (43.11, 41.17, 34.04, 20.15, 13.58))),
}
# The paired differences of [MASK] accuracy, a - b at every n, with the sign Su's argument
# expects (0: none), Holm-corrected as one family.
DIFFERENCES = (('E', 'O', +1), ('E-ra', 'O-ra', +1), ('O-ra', 'O', 0), ('E-ra', 'E', 0))

# 2 CPU cores: ~0.6 s/step, ~6 min a run, 12 runs. Head size 64 as in RoFormer / BERT.
SCALE = dataclasses.replace(
  CPU, layers=4, hidden=128, mlp=512, steps=500, vocab=4000, evals=3, eval_batches=4
)


def make(scale, lengths, eval_tokens, max_eval_batches=-1, seeds=SEEDS, **where) -> Plan:
  side = lambda slug: Side(slug, scale.learning_rate, scale.steps)
  return Plan(
    name='length_extrapolation',
    title='Length extrapolation: Attention-O vs Attention-E, with and without residual attention',
    scale=scale,
    name_format='{variant}-s{seed}',
    # One group: seed by seed, so an interrupted grid already holds every variant's first seeds.
    arms=(
      tuple(
        Arm(
          slug,
          scale.learning_rate,
          scale.steps,
          seeds,
          model=dict(model, position_embedding='rope'),
        )
        for slug, (_, model, _) in VARIANTS.items()
      ),
    ),
    comparisons=tuple(
      Comparison(f'{a}-{b}', f'{a} - {b}', side(a), side(b), seeds, expected=sign, family='lengths')
      for a, b, sign in DIFFERENCES
    ),
    trainer='at_lengths',
    report='lengths',
    options=dict(
      lengths=lengths,
      eval_tokens=eval_tokens,  # per evaluation batch (batch = eval_tokens // n)
      max_eval_batches=max_eval_batches,  # per length; -1: the whole held-out split
      labels={slug: label for slug, (label, _, _) in VARIANTS.items()},
      colors={slug: color for slug, (_, _, color) in VARIANTS.items()},
      reference=SU,
    ),
    **where,
  )


PLANS = {
  'cpu': make(
    SCALE,
    LENGTHS,
    8192,
    out='docs/results/length_extrapolation',
    workdirs='results/length_extrapolation',
  ),
  # RoFormer-small-like (6 layers x 512, 8 heads) for an accelerator.
  'roformer_small': make(
    dataclasses.replace(ACCELERATOR, layers=6, seq_len=64, evals=3, eval_batches=4),
    LENGTHS,
    8192,
    out='results/length_extrapolation_roformer_small/report',
    workdirs='results/length_extrapolation_roformer_small',
  ),
  # The smoke test: seconds.
  'toy': make(
    dataclasses.replace(TOY, seq_len=16, steps=6, evals=3), (16, 32), 256, 2, seeds=(0, 1)
  ),
}

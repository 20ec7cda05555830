r"""Per-layer gradient norms of a deep, narrow encoder at init and after a few hundred AdamW
steps, for Post-LN, Pre-LN, RealFormer, Post-LN + DS-Init and ReZero (docs/variants.md).

    python -m experiments.study --plan=grad_norms        # 48 layers, ~10 min on 2 CPU cores
    python -m experiments.study --plan=grad_norms --quick --out=/tmp/gn --workdirs=/tmp/gnw

Every variant uses the same width, data order, measurement batch and optimiser: AdamW (BERT's
schedule: 10% linear warm-up, then linear decay to 0; weight decay 0.01, global-norm clip 1.0),
no dropout. Dense kernels use Xavier init as in the DS-Init paper's baseline: under BERT's 0.02
init a width-64 branch is ~100x smaller than the trunk, every layer is nearly the identity, and
Post-LN's vanishing gradient does not show at this width. DS-Init replaces the init of its
variant. Measured per run on one fixed batch (held out: the eval split of the embedded corpus,
or the synthetic MLM stream with the same batch contract, study.BatchSource): the per-layer
gradient norm of each sublayer's parameters, |dL/dx| at each layer's input, the DS-Init ratios
and the mean token cosine after each layer (rank collapse).

Trainer and report 'grad_norms' (studies/grad_norms.py). Report (docs/results/grad_norms/):
results.md, results.json, grad_norms.png, runs/<variant>-s0.json. No checkpoints: a run is a
few minutes and starts again after a fault.
"""

from __future__ import annotations

import dataclasses

from realformer_jax.studies.plan import Arm, Plan
from realformer_jax.studies.scale import CPU, Scale

VARIANTS = {  # name: ModelConfig fields on top of the shared base
  'post': dict(ln_placement='post'),
  'pre': dict(ln_placement='pre'),
  'realformer': dict(ln_placement='realformer'),
  'post+ds_init': dict(ln_placement='post', init='ds_init'),
  'rezero': dict(ln_placement='none', residual_branch='rezero'),
}

# 48 layers x 64, 4 heads, FFN 256, sequence 64, batch 8, 200 steps at peak rate 5e-4, no
# dropout, BERT's learned position table; the synthetic stream has 8,000 ids (the embedded
# corpus has its own vocabulary).
SCALE = dataclasses.replace(CPU, layers=48, heads=4, batch=8, steps=200, learning_rate=5e-4)
SCALE = dataclasses.replace(SCALE, vocab=8000, dropout=0.0, position_embedding='learned')
# The measurement's own settings beside the scale.
OPTIONS = dict(
  measure_batch=64,  # sequences in the fixed batch the tables are measured on
  weight_decay=0.01,
  clip=1.0,  # global-norm clip (BERT: 1.0)
  init='xavier',  # ModelConfig.init of every variant but DS-Init
  data='auto',  # 'auto' or 'embedded': the embedded corpus; 'synthetic'
  quick=False,  # XLA's optimisations off: compile time dominates a smoke run
)


def make(scale: Scale, options: dict, variants=tuple(VARIANTS), **where) -> Plan:
  return Plan(
    name='grad_norms',
    title='Per-layer gradient norms',
    scale=scale,
    name_format='{variant}-s{seed}',
    arms=(
      tuple(
        Arm(name, scale.learning_rate, scale.steps, (0,), model=VARIANTS[name]) for name in variants
      ),
    ),
    trainer='grad_norms',
    report='grad_norms',
    options=options,
    **where,
  )


# The smoke test: 4 layers, 3 steps, tiny batches, synthetic data.
TOY = dataclasses.replace(SCALE, layers=4, hidden=32, mlp=64, seq_len=32, batch=4, steps=3)
TOY = dataclasses.replace(TOY, vocab=256)

PLANS = {
  'cpu': make(SCALE, OPTIONS, out='docs/results/grad_norms', workdirs='results/grad_norms'),
  'toy': make(TOY, dict(OPTIONS, measure_batch=4, data='synthetic', quick=True)),
}

r"""Does Post-LN's gradient shrink toward the first layers at init? The grad_norms plan's
measurement (per-layer sublayer gradient norms on a fixed held-out batch), at init only, for
Post-LN under one change at a time: sequence length, width, depth, activation, initialisation,
dropout in the backward pass.

    python -m experiments.study --plan=init_grad_sweep        # ~2 min on 2 CPU cores
    python -m experiments.study --plan=init_grad_sweep --quick --out=/tmp/s --workdirs=/tmp/sw

A first/last ratio < 1 means the first layer's gradient is smaller than the last one's (Post-LN's
vanishing pattern; docs/variants.md, Xiong et al. 2020, "On Layer Normalization in the
Transformer Architecture"); > 1 means it grows toward the input.

Trainer and report 'init_sweep' (studies/init_sweep.py). Report
(docs/results/grad_norms/init_sweep/): results.md, results.json, runs/<setting>-s0.json. No
checkpoints: a run is seconds.
"""

from __future__ import annotations

from realformer_jax.studies.plan import Arm, Plan
from realformer_jax.studies.plans import grad_norms

# name: (the report's label, ModelConfig fields on top of the grad_norms plan's Post-LN model;
# max_len is also the batches' sequence length)
SETTINGS = {
  'post': ('post (the grad_norms setting)', {}),
  'seq128': ('sequence 128', {'max_len': 128}),
  'width256': ('width 256', {'hidden_size': 256, 'mlp_dim': 1024}),
  'layers18': ('18 layers', {'num_layers': 18}),
  'width512-layers18-seq128': (
    'width 512, 18 layers, seq 128',
    {'hidden_size': 512, 'num_heads': 8, 'mlp_dim': 2048, 'num_layers': 18, 'max_len': 128},
  ),
  'relu': ('ReLU FFN', {'activation': 'relu'}),
  'dropout0.1': (
    'dropout 0.1 (training-mode gradient)',
    {'dropout_rate': 0.1, 'attention_dropout_rate': 0.1},
  ),
  'bert-init': ('BERT init (std 0.02)', {'init': 'bert'}),
  'pre': ('pre (for contrast)', {'ln_placement': 'pre'}),
}


def make(base: Plan, settings, **where) -> Plan:
  """The settings of `base` (a grad_norms plan: its scale, options and Post-LN variant)."""
  post = grad_norms.VARIANTS['post']
  return Plan(
    name='init_grad_sweep',
    title='Post-LN gradients at initialisation: one change at a time',
    scale=base.scale,
    name_format='{variant}-s{seed}',
    arms=(
      tuple(Arm(name, 0.0, 0, (0,), model={**post, **SETTINGS[name][1]}) for name in settings),
    ),
    trainer='init_sweep',
    report='init_sweep',
    options=dict(base.options, labels={name: SETTINGS[name][0] for name in settings}),
    **where,
  )


PLANS = {
  'cpu': make(
    grad_norms.PLANS['cpu'],
    tuple(SETTINGS),
    out='docs/results/grad_norms/init_sweep',
    workdirs='results/init_grad_sweep',
  ),
  'toy': make(grad_norms.PLANS['toy'], ('post', 'relu')),
}

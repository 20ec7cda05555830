r"""Why do learned positions not learn masked-LM at the CPU scale while RoPE does? A short probe.

    python -m experiments.study --plan=position_probe          # 5 runs, ~1 h on one idle core
    python -m experiments.study --plan=position_probe --quick --out=/tmp/pp --workdirs=/tmp/pw

The earlier layout comparison (4 layers x 128, 4 heads, sequence 64, 600 steps at peak rate
1e-3) never beat the copy-aware floor with BERT's learned position table, while the same
recipe with rotary positions did. Same recipe (Post-LN, dropout 0.1), one change at a time:

  learned     the learned table (BERT), 600 steps                       seed 0
  rope        rotary positions instead of the table                     seed 0
  none        no position information at all (a bag of tokens)          seed 0
  learned-lr4 the learned table at 4x the peak rate (4e-3)              seed 0
  learned-4x  the learned table, a 4x longer schedule (2,400 steps)     seed 0

(one seed each: a probe for differences large enough to read from one run, not a comparison;
`learned` reproduces the earlier layout grid's Post-LN runs, 3 seeds at 12.67 ± 0.22%)

and three diagnostics per trained model: [MASK] accuracy beside the context-free floors; how
local attention is (the mean attention probability a token gives its two neighbours, per
layer; uniform attention over 64 keys gives 2/64 = 0.031); and whether the position table
holds positions (the mean cosine between rows i and i + d, d = 1, 2, 4, 8, 16; a table that
encodes order is smooth, high at small d; a random one is ~0 at every d).

If `learned` equals `none` the table is not used; if `learned-4x` leaves the floor the table is
slow to learn, not broken. The weight decay on the table is not a candidate: AdamW at decay
0.01 shrinks it by exp(-0.01 * sum of learning rates) = 0.997 over 600 steps at 1e-3.

Trainer 'position_probe' and report 'position_probe' (studies/position_probe.py). Report
(docs/results/position_probe/): results.md, results.json, curves.png, runs/<variant>-s0.json;
workdirs in results/position_probe/.
"""

from __future__ import annotations

import dataclasses

from realformer_jax.studies.plan import Arm, Plan
from realformer_jax.studies.scale import CPU, TOY

# name: (position_embedding, steps multiplier, learning-rate multiplier, plot colour)
VARIANTS = {
  'learned': ('learned', 1, 1, 'tab:blue'),
  'rope': ('rope', 1, 1, 'tab:red'),
  'none': ('none', 1, 1, 'tab:gray'),
  'learned-lr4': ('learned', 1, 4, 'tab:purple'),
  'learned-4x': ('learned', 4, 1, 'tab:cyan'),
}
DISTANCES = (1, 2, 4, 8, 16)  # of the position table's rows compared

# The earlier compare_layouts CPU scale (4 layers x 128, 4 heads), where learned positions did
# not learn.
SCALE = dataclasses.replace(
  CPU, layers=4, hidden=128, heads=4, mlp=512, learning_rate=1e-3, position_embedding='learned'
)


def make(scale, **where) -> Plan:
  arm = lambda name, positions, steps, rate: Arm(
    name,
    scale.learning_rate * rate,
    scale.steps * steps,
    (0,),
    model=dict(ln_placement='post', position_embedding=positions),
  )
  return Plan(
    name='position_probe',
    title='Why learned positions do not learn here: a probe',
    scale=scale,
    name_format='{variant}-s{seed}',
    arms=(tuple(arm(name, *v[:3]) for name, v in VARIANTS.items()),),
    trainer='position_probe',
    report='position_probe',
    options=dict(distances=DISTANCES, colors={name: v[3] for name, v in VARIANTS.items()}),
    **where,
  )


PLANS = {
  'cpu': make(SCALE, out='docs/results/position_probe', workdirs='results/position_probe'),
  'toy': make(dataclasses.replace(TOY, steps=8, position_embedding='learned')),
}

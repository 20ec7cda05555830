r"""Attention entropy and adjacent-layer JSD of the depth study's 4,800-step models, at each
depth (issue 66: the earlier analysis read the layouts study's 600-step models, where RealFormer
was still ahead). Nothing is trained.

    python -m experiments.study --plan=attention_depth    # analyses the depths whose runs finished

Declared 2026-12-07, before any of these analyses ran (the depth study had finished its 6-layer
runs of seeds 2-4 and three 24-layer ones). The models: the depth study's (studies/plans/
depth.py) RealFormer and Post-LN runs at its shared rate 2e-3, 4,800 steps, seeds 2-7, at 6
layers, at 12 (its reruns of the budgets study's runs, tag L12-: the committed runs' checkpoints
are gone) and at 24, from its store and workdirs; the same seeds give the same data order, so
differences are paired by seed. Statistics and statements as studies/plans/attention_analysis.py
(5a top-layer mean entropy lower, 5b its spread lower, 5c adjacent layers more alike over the
middle third of pairs, the paper's signs), tested at each depth, each depth its own Holm family
of three (three questions asked again at each size, not one trend: no test across depths).
A depth is analysed once all 12 of its pretraining runs have finished (PretrainingFinished); its
statements are "pending" until then. Every held-out batch of each model (-1), 2 heads x 64
tokens: ~1 min a 6-layer model on one core.

Report: docs/results/compare_layouts/depth/attention/ (results.md, one row per depth and
statement; L6/, L12/, L24/: each depth's results.md, entropy.png, jsd.png).
"""

from __future__ import annotations

from realformer_jax.studies.plans import attention_analysis, depth

TAGS = tuple(depth.tag(layers) for layers in (depth.DEPTHS[0], depth.SCALE.layers, depth.DEPTHS[1]))

PLANS = {
  'cpu': attention_analysis.make(
    depth.PLANS['cpu'],
    (2, 3, 4, 5, 6, 7),
    rate=depth.RATE,
    tags=TAGS,
    out='docs/results/compare_layouts/depth/attention',
    workdirs='results/attention_depth',
    name='attention_depth',
  ),
  # The toy depth plan's runs (1 and 3 layers); it names no folders: a smoke test gives them.
  'toy': attention_analysis.make(
    depth.PLANS['toy'],
    (0, 1),
    max_batches=1,
    rate=depth.RATE,
    tags=tuple(depth.tag(layers) for layers in (1, 3)),
    name='attention_depth',
  ),
}

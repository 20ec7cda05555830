r"""Why do learned positions not learn masked-LM at the CPU scale while RoPE does? A short probe.

    python -m experiments.position_probe                 # 5 runs, ~1 h on one idle core
    python -m experiments.position_probe --quick --out=/tmp/pp --workdirs=/tmp/pp_runs

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

Writes --out (default docs/results/position_probe/): results.md, results.json, curves.png,
runs/*.json; workdirs under --workdirs (default results/position_probe/).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax.numpy as jnp
import numpy as np

from realformer_jax import train
from realformer_jax.studies import runs as runs_lib
from realformer_jax.studies import study
from realformer_jax.studies.report import seed_cell, write_lines, write_results

SCALES = {
  # The earlier compare_layouts CPU scale, where learned positions did not learn.
  'cpu': study.Scale(
    layers=4,
    hidden=128,
    heads=4,
    mlp=512,
    seq_len=64,
    batch=32,
    steps=600,
    learning_rate=1e-3,
    vocab=2000,
    evals=6,
    eval_batches=16,
    position_embedding='learned',
  ),
  'toy': dataclasses.replace(study.TOY, steps=8, position_embedding='learned'),
}
VARIANTS = {  # name: (position_embedding, steps multiplier, learning-rate multiplier, seeds)
  'learned': ('learned', 1, 1, (0,)),
  'rope': ('rope', 1, 1, (0,)),
  'none': ('none', 1, 1, (0,)),
  'learned-lr4': ('learned', 1, 4, (0,)),
  'learned-4x': ('learned', 4, 1, (0,)),
}
DISTANCES = (1, 2, 4, 8, 16)


def grid() -> list[runs_lib.Run]:
  """Seed-major: every variant's first seed comes first."""
  return [
    runs_lib.Run(f'{name}-s{seed}', dict(variant=name, seed=seed), cost=steps)
    for seed in (0, 1)
    for name, (_, steps, _, seeds) in VARIANTS.items()
    if seed in seeds
  ]


def neighbour_attention(intermediates: dict, batch: dict) -> dict:
  """Summed attention probability on the two neighbours (i - 1, i + 1), per layer, over real
  query tokens and heads; and the count to divide by."""
  probs_NxBxHxLxL = intermediates['encoder']['layers']['attention']['attention_probs'][0]
  probs_NxBxHxLxL = probs_NxBxHxLxL.astype(jnp.float32)
  length = probs_NxBxHxLxL.shape[-1]
  offsets_LxL = jnp.abs(jnp.arange(length)[:, None] - jnp.arange(length)[None, :])
  neighbours_NxBxHxL = jnp.sum(probs_NxBxHxLxL * (offsets_LxL == 1), axis=-1)
  real_1xBx1xL = batch['input_mask'][None, :, None, :].astype(jnp.float32)
  return {
    'neighbour_sum': jnp.sum(neighbours_NxBxHxL * real_1xBx1xL, axis=(1, 2, 3)),
    'query_count': jnp.sum(real_1xBx1xL) * probs_NxBxHxLxL.shape[2],
  }


def table_smoothness(workdir: str) -> list[float] | None:
  """Mean cosine between position rows i and i + d for each d in DISTANCES (None: no table)."""
  params = train.load_workdir(workdir).params
  table = (
    params['encoder']['embeddings']['position']['embedding']
    if 'position' in params['encoder']['embeddings']
    else None
  )
  if table is None:
    return None
  rows = np.asarray(table, np.float64)
  rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
  return [float(np.mean(np.sum(rows[:-d] * rows[d:], axis=1))) for d in DISTANCES if d < len(rows)]


def train_one(scale: study.Scale, args, run: runs_lib.Run, report: runs_lib.Report) -> dict:
  positions, steps, rate, _ = VARIANTS[run.params['variant']]
  config = study.mlm_config(
    scale,
    seed=run.params['seed'],
    steps=scale.steps * steps,
    learning_rate=scale.learning_rate * rate,
    data_dir=args.data_dir,
    model=dict(ln_placement='post', position_embedding=positions),
  )
  workdir = os.path.join(args.workdirs, run.name)
  result = study.train_run(config, workdir, report, progress_share=0.9)
  if result['diverged_at_step'] is None:
    report(0.9, 'scoring')
    result['scored'] = study.score_workdir(workdir, extra=neighbour_attention)
    extra = result['scored'].pop('extra')
    result['neighbour_attention'] = (
      np.asarray(extra['neighbour_sum']) / extra['query_count']
    ).tolist()
    result['table_cosine'] = table_smoothness(workdir)
  return result


def summarise(results: dict) -> dict:
  rows = {}
  for name in VARIANTS:
    runs = [r for run_name, r in sorted(results.items()) if r['params']['variant'] == name]
    finished = [r for r in runs if r.get('final')]
    if not finished:
      continue
    values = lambda key: [100 * r['final'][key] for r in finished]
    rows[name] = {
      'seeds': [r['params']['seed'] for r in finished],
      'mask_accuracy': values('mask_accuracy'),
      'mlm_accuracy': values('mlm_accuracy'),
      'loss': [r['final']['loss'] for r in finished],
      'learned': [study.learned(r) for r in finished],
      'neighbour_attention': [r['neighbour_attention'] for r in finished],
      'table_cosine': [r['table_cosine'] for r in finished],
      'steps': finished[0]['steps'],
      'learning_rate': finished[0]['learning_rate'],
    }
  floors = next((r['floors'] for r in results.values() if r.get('floors')), {})
  return {'variants': rows, 'floors': floors}


def write_markdown(path: str, summary: dict, scale: study.Scale, command: str) -> None:
  floors = summary['floors']
  lines = [
    '# Why learned positions do not learn here: a probe',
    '',
    f'Regenerate: `{command}`. Post-LN, {scale.layers} layers x {scale.hidden}, '
    f'{scale.heads} heads, FFN {scale.mlp}, sequence {scale.seq_len}, batch {scale.batch}, '
    f'dropout {scale.dropout}, AdamW with 10% warmup and linear decay, a {scale.vocab}-piece '
    f'tokenizer; scored on the first {scale.eval_batches} held-out batches. Cells: per-seed '
    'values (mean ± 95% Student-t half-width where there are 2 seeds).',
    '',
    f'Floors on this eval set: most frequent token {100 * floors["mlm_accuracy"]:.2f}% of all '
    f'predictions and {100 * floors["mask_accuracy"]:.2f}% at [MASK]; copy-aware '
    f'{100 * floors["copy_accuracy"]:.2f}% of all predictions; copy-aware unigram loss '
    f'{floors["copy_unigram_loss"]:.3f} nats.',
    '',
    '| variant | steps | peak rate | [MASK] accuracy (%) | all predictions (%) | eval loss '
    '| learned? | attention to neighbours, by layer | position table cosine at d = '
    + ', '.join(map(str, DISTANCES))
    + ' |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for name, row in summary['variants'].items():
    neighbours = '; '.join(
      ' / '.join(f'{v:.3f}' for v in seed) for seed in row['neighbour_attention']
    )
    cosine = '; '.join(
      ' / '.join(f'{v:.2f}' for v in seed) if seed else 'no table' for seed in row['table_cosine']
    )
    lines.append(
      f'| {name} | {row["steps"]} | {row["learning_rate"]:g} | {seed_cell(row["mask_accuracy"])} '
      f'| {seed_cell(row["mlm_accuracy"])} | {seed_cell(row["loss"], 3)} | '
      f'{", ".join("yes" if v else "no" for v in row["learned"])} | {neighbours} | {cosine} |'
    )
  lines += [
    '',
    'Learned: eval loss below the copy-aware unigram loss and [MASK] accuracy above '
    "the most frequent token's. Attention to neighbours: mean probability on tokens "
    f'i - 1 and i + 1 (uniform: 2/{scale.seq_len} = {2 / scale.seq_len:.3f}). Table '
    'cosine: mean cosine between rows i and i + d (random rows: ~0).',
    '',
    '![[MASK] accuracy curves](curves.png)',
    '',
  ]
  write_lines(path, lines)


def write_plot(path: str, results: dict, summary: dict) -> bool:
  plt = study.pyplot()
  if plt is None:
    return False
  colors = {
    'learned': 'tab:blue',
    'none': 'tab:gray',
    'rope': 'tab:red',
    'learned-4x': 'tab:cyan',
    'learned-lr4': 'tab:purple',
  }
  fig, ax = plt.subplots(figsize=(8, 4.8))
  for name, run in sorted(results.items()):
    variant = run['params']['variant']
    study.plot_curve(
      ax,
      run.get('eval_mask_accuracy') or [],
      marker='o',
      markersize=3,
      color=colors.get(variant, 'black'),
      label=name,
    )
  study.draw_floors(ax, summary['floors'], 'mask_accuracy')
  ax.set_xlabel('training step')
  ax.set_ylabel('eval accuracy at [MASK] positions (%)')
  ax.set_ylim(bottom=0)
  ax.set_title('[MASK] accuracy during training, one line per run (seed)')
  ax.legend(fontsize=8)
  study.save_figure(fig, path)
  return True


def main(argv=None) -> dict:
  parser = study.argument_parser(
    __doc__, out='docs/results/position_probe', workdirs='results/position_probe', scales=SCALES
  )
  args = parser.parse_args(argv)
  scale = SCALES[study.scale_name(args)]
  runs = study.selected(grid(), args.runs)
  runs = [dataclasses.replace(r, cost=r.cost * scale.steps) for r in runs]
  runs_lib.Grid(args.out, runs).run(lambda run, report: train_one(scale, args, run, report))
  every = runs_lib.Grid(args.out, grid())
  results = {run.name: every.load(run) for run in every.runs if every.load(run) is not None}
  summary = summarise(results)
  plot_path = os.path.join(args.out, 'curves.png')

  def markdown(path: str) -> None:
    if summary['variants']:  # else no run has finished yet: results.json only
      write_markdown(path, summary, scale, study.command('position_probe', args))

  write_results(
    args.out,
    {
      'scale': dataclasses.asdict(scale),
      'summary': summary,
      'runs': {k: {kk: vv for kk, vv in v.items() if kk != 'scored'} for k, v in results.items()},
    },
    markdown,
    lambda: [plot_path] if summary['variants'] and write_plot(plot_path, results, summary) else [],
  )
  return summary


if __name__ == '__main__':
  main(sys.argv[1:])

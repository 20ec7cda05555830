"""The position probe's trainer and report (Plan.trainer and Plan.report 'position_probe';
studies/plans/position_probe.py): a masked-LM run of one variant, then scored with two
diagnostics, how local its attention is (the mean probability on the two neighbours, per
layer) and whether its position table holds positions (the mean cosine between rows i and
i + d, d in Plan.options['distances']); the report is one row per variant beside the floors.
"""

from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp
import numpy as np

from realformer_jax import train as train_lib
from realformer_jax.studies import study
from realformer_jax.studies.plan import Plan
from realformer_jax.studies.report import seed_cell, write_lines, write_results


def train(plan: Plan, run, workdir: str, data_dir: str, report) -> dict:
  p = run.params
  config = study.mlm_config(
    plan.scale,
    seed=p['seed'],
    steps=p['steps'],
    learning_rate=p['learning_rate'],
    data_dir=data_dir,
    model=p['model'],
  )
  result = study.train_run(config, workdir, report, progress_share=0.9)
  if result['diverged_at_step'] is None:
    report(0.9, 'scoring')
    result['scored'] = study.score_workdir(workdir, extra=neighbour_attention)
    extra = result['scored'].pop('extra')
    result['neighbour_attention'] = (
      np.asarray(extra['neighbour_sum']) / extra['query_count']
    ).tolist()
    result['table_cosine'] = table_smoothness(workdir, plan.options['distances'])
  return result


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


def table_smoothness(workdir: str, distances) -> list[float] | None:
  """Mean cosine between position rows i and i + d for each d in `distances` (None: no table)."""
  params = train_lib.load_workdir(workdir).params
  table = (
    params['encoder']['embeddings']['position']['embedding']
    if 'position' in params['encoder']['embeddings']
    else None
  )
  if table is None:
    return None
  rows = np.asarray(table, np.float64)
  rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
  return [float(np.mean(np.sum(rows[:-d] * rows[d:], axis=1))) for d in distances if d < len(rows)]


def analyse(plan: Plan, results: dict) -> dict:
  """Per variant: per-seed accuracy, loss, learned, the diagnostics; the floors."""
  rows = {}
  for name in [a.variant for a in plan.all_arms()]:
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


def write(plan: Plan, results: dict, analysis: dict, command: str) -> None:
  """results.json (recipe, analysis, every run without its per-sequence scores), results.md
  (once a run finished) and curves.png, in plan.out."""
  plot_path = os.path.join(plan.out, 'curves.png')

  def markdown(path: str) -> None:
    if analysis['variants']:  # else no run has finished yet: results.json only
      write_markdown(path, plan, analysis, command)

  os.makedirs(plan.out, exist_ok=True)
  write_results(
    plan.out,
    {
      'scale': dataclasses.asdict(plan.scale),
      'summary': analysis,
      'runs': {k: {kk: vv for kk, vv in v.items() if kk != 'scored'} for k, v in results.items()},
    },
    markdown,
    lambda: (
      [plot_path] if analysis['variants'] and write_plot(plot_path, plan, results, analysis) else []
    ),
  )


def write_markdown(path: str, plan: Plan, summary: dict, command: str) -> None:
  scale, distances = plan.scale, plan.options['distances']
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
    + ', '.join(map(str, distances))
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


def write_plot(path: str, plan: Plan, results: dict, summary: dict) -> bool:
  plt = study.pyplot()
  if plt is None:
    return False
  colors = plan.options['colors']
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

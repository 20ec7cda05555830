r"""Attention entropy and adjacent-layer similarity of trained models (RealFormer paper, sec. 4.4).

    python -m experiments.attention_analysis            # the main runs of compare_layouts
    python -m experiments.attention_analysis --runs_dir=DIR --layouts=post,realformer --seeds=0

For each trained workdir (`<runs_dir>/main-<layout>-s<seed>`, as experiments/compare_layouts.py
writes them), over the held-out split (the evaluation batches, masked as in evaluation), from
the attention probabilities the model sows (`mutable=['intermediates']`, one batch at a time):

  * entropy  H(p) = -sum_k p_k ln p_k of every (layer, head, real query token) distribution;
    per layer: mean, the spread across heads and tokens (standard deviation), and a sample for
    violin plots;
  * Jensen-Shannon divergence (natural log, at most ln 2) between the distributions of the same
    head and token in adjacent layers l and l + 1, averaged per layer pair.
Seeds give the intervals: each statistic is computed per trained model, then mean and 95%
Student-t interval over seeds. Writes attention.md, entropy.png, jsd.png, attention.json to
--out (default docs/results/attention_analysis/).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments import runs as runs_lib
from experiments import stats
from realformer_jax import MaskedLM, data, train

SAMPLE_PER_LAYER = 4000  # entropies kept per (model, layer) for the violin plots


def batch_statistics(model: MaskedLM, params, batch):
  """Entropy [N, B, H, L] and adjacent-layer JSD [N-1, B, H, L] of one batch's maps."""
  _, state = model.apply({'params': params}, batch['input_ids'], batch['input_mask'],
                         batch['segment_ids'], batch['masked_positions'],
                         mutable=['intermediates'])
  p = state['intermediates']['encoder']['layers']['attention']['attention_probs'][0]
  p = p.astype(jnp.float32)  # [N, B, H, L, L]
  plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)
  entropy = -jnp.sum(plogp, axis=-1)
  a, b = p[:-1], p[1:]
  m = 0.5 * (a + b)
  kl = lambda x: jnp.sum(jnp.where(x > 0, x * (jnp.log(jnp.where(x > 0, x, 1.0))
                                               - jnp.log(jnp.where(x > 0, m, 1.0))), 0.0), -1)
  return entropy, 0.5 * kl(a) + 0.5 * kl(b)


def analyse_workdir(workdir: str, max_batches: int = -1, seed: int = 0) -> dict:
  """Per-layer entropy mean / std / sample and per-pair JSD mean of one trained model."""
  run = train.load_workdir(workdir)
  model = MaskedLM(run.model_config)
  stats_fn = jax.jit(lambda params, batch: batch_statistics(model, params, batch))
  config = run.config
  num_layers = run.model_config.num_layers
  sums = np.zeros(num_layers)
  squares = np.zeros(num_layers)
  count = 0
  jsd_sums = np.zeros(max(num_layers - 1, 0))
  head_std_sums = np.zeros(num_layers)  # std across heads, per token, summed over tokens
  samples = [[] for _ in range(num_layers)]
  rng = np.random.default_rng(seed)
  batches = data.make_eval_iterator(config.data, config.train.global_batch_size)
  for index, batch in enumerate(batches):
    if 0 <= max_batches <= index:
      break
    entropy, jsd = jax.device_get(stats_fn(run.params, {k: jnp.asarray(v)
                                                         for k, v in batch.items()}))
    real = batch['input_mask'].astype(bool)  # [B, L] real query tokens
    if not real.any():
      continue
    e = entropy[:, real.nonzero()[0], :, real.nonzero()[1]]  # [tokens, N, H]
    e = np.moveaxis(e, 0, -1)  # [N, H, tokens]
    sums += e.sum(axis=(1, 2))
    squares += np.square(e).sum(axis=(1, 2))
    head_std_sums += e.std(axis=1).sum(axis=-1)
    tokens = e.shape[-1]
    count += tokens
    if num_layers > 1:
      j = jsd[:, real.nonzero()[0], :, real.nonzero()[1]]
      jsd_sums += np.moveaxis(j, 0, -1).sum(axis=(1, 2))
    for layer in range(num_layers):
      samples[layer].append(e[layer].reshape(-1))
  heads = run.model_config.num_heads
  mean = sums / (count * heads)
  std = np.sqrt(np.maximum(squares / (count * heads) - mean ** 2, 0.0))
  sample = [rng.choice(np.concatenate(s), min(SAMPLE_PER_LAYER, sum(map(len, s))),
                        replace=False).tolist() for s in samples]
  return {'workdir': workdir, 'tokens': count, 'heads': heads,
          'entropy_mean': mean.tolist(), 'entropy_std': std.tolist(),
          'entropy_head_std': (head_std_sums / count).tolist(),
          'jsd_mean': (jsd_sums / (count * heads)).tolist(), 'entropy_sample': sample}


def summarise(per_seed: list[dict], key: str) -> list[dict]:
  """Per layer (or pair): mean and interval over seeds of one per-model statistic."""
  values = np.asarray([r[key] for r in per_seed])  # [seeds, layers]
  return [stats.mean_ci(values[:, i]).as_dict() for i in range(values.shape[1])]


def paired_differences(per_layout: dict, layouts: list[str]) -> dict:
  """Second layout minus first, per layer (pair), paired by seed: the same seed gives the same
  data order (and, for Post-LN-based layouts, the same initial weights)."""
  if len(layouts) < 2:
    return {}
  a, b = per_layout[layouts[0]], per_layout[layouts[1]]
  out = {}
  for key in ('entropy_mean', 'entropy_std', 'jsd_mean'):
    va, vb = np.asarray([r[key] for r in a]), np.asarray([r[key] for r in b])
    out[key] = []
    for i in range(va.shape[1]):
      diff = stats.paired_diff_ci(list(vb[:, i]), list(va[:, i]))
      out[key].append({**diff.as_dict(), 'verdict': stats.interval_verdict(diff),
                       layouts[0]: list(va[:, i]), layouts[1]: list(vb[:, i])})
  return out


def write_markdown(path: str, summary: dict, layouts: list[str], command: str,
                   seeds: list[int], diffs: dict | None = None) -> None:
  fmt = lambda d: stats.format_ci(stats.Summary(d['mean'], d['ci95_half_width'], d['n'], ()), 3)
  lines = ['# Attention entropy and adjacent-layer JSD', '',
           f'Regenerate: `{command}`. The held-out batches each run was evaluated on (its '
           '`data.eval_batches`, the same masked text for every model), every real query token '
           'of every head; '
           f'per trained model, then mean ± 95% Student-t interval over seeds {seeds}. Entropy '
           'in nats (uniform attention over n keys: ln n); JSD in nats (at most ln 2 = 0.693).',
           '', '## Entropy per layer: mean (std across heads and tokens)', '',
           '| layer | ' + ' | '.join(f'{l} mean | {l} std' for l in layouts) + ' |',
           '|---' * (1 + 2 * len(layouts)) + '|']
  num_layers = len(summary[layouts[0]]['entropy_mean'])
  for layer in range(num_layers):
    cells = []
    for layout in layouts:
      cells += [fmt(summary[layout]['entropy_mean'][layer]),
                fmt(summary[layout]['entropy_std'][layer])]
    lines.append(f'| {layer + 1} | ' + ' | '.join(cells) + ' |')
  lines += ['', '## Jensen-Shannon divergence, same head, layer l vs l + 1', '',
            '| layers | ' + ' | '.join(layouts) + ' |', '|---' * (1 + len(layouts)) + '|']
  for pair in range(num_layers - 1):
    lines.append(f'| {pair + 1}-{pair + 2} | ' + ' | '.join(
        fmt(summary[l]['jsd_mean'][pair]) for l in layouts) + ' |')
  if diffs:
    first, second = layouts[0], layouts[1]
    lines += ['', f'## {second} - {first}, paired by seed (per-seed values {first} / {second})',
              '', 'Verdict: lower / higher when the 95% interval of the difference excludes 0.',
              '', '| statistic | layer(s) | difference | verdict | per seed |',
              '|---|---|---|---|---|']
    names = {'entropy_mean': 'entropy mean', 'entropy_std': 'entropy std',
             'jsd_mean': 'JSD to the next layer'}
    for key, rows in diffs.items():
      for i, d in enumerate(rows):
        where = f'{i + 1}-{i + 2}' if key == 'jsd_mean' else f'{i + 1}'
        per_seed = ', '.join(f'{x:.3f} / {y:.3f}' for x, y in zip(d[first], d[second]))
        lines.append(f'| {names[key]} | {where} | {fmt(d)} | {d["verdict"]} | {per_seed} |')
  lines += ['', '![entropy per layer](entropy.png)', '', '![JSD per layer pair](jsd.png)', '']
  with open(path, 'w') as f:
    f.write('\n'.join(lines))


def write_plots(out: str, per_layout: dict, summary: dict, layouts: list[str]) -> list[str]:
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return []
  colors = {'post': 'tab:blue', 'pre': 'tab:green', 'realformer': 'tab:red',
            'pre+ra': 'tab:purple'}
  num_layers = len(summary[layouts[0]]['entropy_mean'])
  fig, ax = plt.subplots(figsize=(max(7, 1.6 * num_layers), 4.5))
  width = 0.8 / len(layouts)
  for i, layout in enumerate(layouts):
    # Pool the seeds' samples per layer: the distribution over tokens and heads.
    pooled = [sum((r['entropy_sample'][l] for r in per_layout[layout]), []) for l in
              range(num_layers)]
    positions = np.arange(num_layers) + (i - (len(layouts) - 1) / 2) * width
    parts = ax.violinplot(pooled, positions=positions, widths=width * 0.95, showmedians=True)
    for body in parts['bodies']:
      body.set_facecolor(colors.get(layout, 'gray'))
      body.set_alpha(0.5)
    ax.plot([], [], color=colors.get(layout, 'gray'), label=layout, linewidth=6, alpha=0.5)
  ax.set_xticks(np.arange(num_layers), [str(l + 1) for l in range(num_layers)])
  ax.set_xlabel('layer')
  ax.set_ylabel('attention entropy (nats)')
  ax.set_title('per-token, per-head attention entropy on held-out text (all seeds pooled)')
  ax.legend()
  fig.tight_layout()
  paths = [os.path.join(out, 'entropy.png')]
  fig.savefig(paths[0], dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(7, 4.5))
  pairs = np.arange(1, num_layers)
  for layout in layouts:
    rows = summary[layout]['jsd_mean']
    mean = np.asarray([r['mean'] for r in rows])
    half = np.asarray([0 if math.isnan(r['ci95_half_width']) else r['ci95_half_width']
                       for r in rows])
    ax.plot(pairs, mean, marker='o', color=colors.get(layout, 'gray'), label=layout)
    ax.fill_between(pairs, mean - half, mean + half, color=colors.get(layout, 'gray'),
                    alpha=0.2)
  ax.set_xticks(pairs, [f'{p}-{p + 1}' for p in pairs])
  ax.set_xlabel('adjacent layers')
  ax.set_ylabel('mean JSD, same head (nats)')
  ax.set_title('JSD between adjacent layers, same head (95% interval over seeds)', fontsize=10)
  ax.legend()
  fig.tight_layout()
  paths.append(os.path.join(out, 'jsd.png'))
  fig.savefig(paths[1], dpi=110)
  plt.close(fig)
  return paths


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs_dir', default='results/compare_layouts')
  parser.add_argument('--layouts', default='post,realformer')
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--max_batches', type=int, default=-1,
                      help='held-out batches per model (-1: the whole split)')
  parser.add_argument('--out', default='docs/results/attention_analysis')
  args = parser.parse_args(argv)
  layouts = args.layouts.split(',')
  seeds = [int(s) for s in args.seeds.split(',')]
  os.makedirs(args.out, exist_ok=True)
  per_layout = {}
  for layout in layouts:
    per_layout[layout] = []
    for seed in seeds:
      workdir = os.path.join(args.runs_dir, f'main-{layout}-s{seed}')
      print(f'analysing {workdir}', flush=True)
      per_layout[layout].append(analyse_workdir(workdir, args.max_batches, seed))
  summary = {layout: {key: summarise(per_layout[layout], key)
                      for key in ('entropy_mean', 'entropy_std', 'entropy_head_std',
                                  'jsd_mean')} for layout in layouts}
  command = 'python -m experiments.attention_analysis' + ''.join(
      f' --{k}={v}' for k, v in (('runs_dir', args.runs_dir), ('layouts', args.layouts),
                                 ('seeds', args.seeds)) if v != parser.get_default(k))
  diffs = paired_differences(per_layout, layouts)
  write_markdown(os.path.join(args.out, 'attention.md'), summary, layouts, command, seeds, diffs)
  runs_lib.write_json(os.path.join(args.out, 'attention.json'), {
      'summary': summary, 'paired_differences': diffs,
      'per_model': {layout: [{k: v for k, v in r.items() if k != 'entropy_sample'}
                             for r in rs] for layout, rs in per_layout.items()}})
  plots = write_plots(args.out, per_layout, summary, layouts)
  print(f'wrote {os.path.join(args.out, "attention.md")} and {", ".join(plots)}')
  return summary


if __name__ == '__main__':
  main(sys.argv[1:])

r"""Attention entropy and adjacent-layer similarity of trained models (RealFormer paper, sec. 4.4).

    python -m experiments.attention_analysis            # the layouts study's runs at r*, ~5 min
    python -m experiments.attention_analysis --runs_dir=DIR --rate=0.002 --seeds=0,1

The models are the layouts study's (realformer_jax/studies/plans/layouts.py) Post-LN and RealFormer
runs at r* (Post-LN's best peak rate; read from --layouts_results) with its confirmation seeds: the
same seeds give the same data order and the same initial weights, so differences are paired by seed.

For each trained workdir (`<runs_dir>/main-<layout>-s<seed>`, as the layouts study
writes them), over the held-out split (the evaluation batches, masked as in evaluation), from
the attention probabilities the model sows (`mutable=['intermediates']`, one batch at a time):

  * entropy  H(p) = -sum_k p_k ln p_k of every (layer, head, real query token) distribution;
    per layer: mean, the spread across heads and tokens (standard deviation), and a sample for
    violin plots;
  * Jensen-Shannon divergence (natural log, at most ln 2) between the distributions of the same
    head and token in adjacent layers l and l + 1, averaged per layer pair.
Seeds give the intervals: each statistic is computed per trained model, then mean and 95%
Student-t interval over seeds. The paper's three statements, declared before the analysis and
Holm-corrected as one family (RealFormer - Post-LN, paired by seed, seeds whose two runs both
learned masked-LM; study.learned):

  5a  the top layer's mean entropy is lower (sparser attention);
  5b  the top layer's entropy spread across heads and tokens (std) is lower;
  5c  adjacent layers are more alike: the JSD averaged over the middle third of layer pairs
      is lower.
Verdict: "not testable at this scale" with fewer than 2 such seeds; else "holds" / "does not
hold" when the Holm-adjusted p-value is below 0.05 with the paper's / the opposite sign, else
"inconclusive". Writes attention.md, entropy.png, jsd.png, attention.json to --out (default
docs/results/attention_analysis/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax import MaskedLM, data, train
from realformer_jax.studies import runs as runs_lib
from realformer_jax.studies import stats, study
from realformer_jax.studies.plans import layouts as layouts_plan
from realformer_jax.studies.report import LAYOUT_COLORS, write_lines

SAMPLE_PER_LAYER = 4000  # entropies kept per (model, layer) for the violin plots


def batch_statistics(model: MaskedLM, params, batch):
  """Entropy [N, B, H, L] and adjacent-layer JSD [N-1, B, H, L] of one batch's maps."""
  _, state = model.apply({'params': params}, *study.model_inputs(batch), mutable=['intermediates'])
  p = state['intermediates']['encoder']['layers']['attention']['attention_probs'][0]
  p = p.astype(jnp.float32)  # [N, B, H, L, L]
  plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)
  entropy = -jnp.sum(plogp, axis=-1)
  a, b = p[:-1], p[1:]
  m = 0.5 * (a + b)
  kl = lambda x: jnp.sum(
    jnp.where(
      x > 0, x * (jnp.log(jnp.where(x > 0, x, 1.0)) - jnp.log(jnp.where(x > 0, m, 1.0))), 0.0
    ),
    -1,
  )
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
    entropy, jsd = jax.device_get(
      stats_fn(run.params, {k: jnp.asarray(v) for k, v in batch.items()})
    )
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
  std = np.sqrt(np.maximum(squares / (count * heads) - mean**2, 0.0))
  sample = [
    rng.choice(np.concatenate(s), min(SAMPLE_PER_LAYER, sum(map(len, s))), replace=False).tolist()
    for s in samples
  ]
  return {
    'workdir': workdir,
    'tokens': count,
    'heads': heads,
    'length': int(config.data.max_len),
    'entropy_mean': mean.tolist(),
    'entropy_std': std.tolist(),
    'entropy_head_std': (head_std_sums / count).tolist(),
    'jsd_mean': (jsd_sums / (count * heads)).tolist(),
    'entropy_sample': sample,
  }


def summarise(per_seed: list[dict], key: str) -> list[dict]:
  """Per layer (or pair): mean and interval over seeds of one per-model statistic."""
  values = np.asarray([r[key] for r in per_seed])  # [seeds, layers]
  return [stats.mean_ci(values[:, i]).as_dict() for i in range(values.shape[1])]


def paired_differences(per_layout: dict, layouts: list[str], seeds: list[int]) -> dict:
  """Second layout minus first, per layer (pair), paired by seed."""
  if len(layouts) < 2 or len(seeds) < 2:
    return {}
  a = [per_layout[layouts[0]][s] for s in seeds]
  b = [per_layout[layouts[1]][s] for s in seeds]
  out = {}
  for key in ('entropy_mean', 'entropy_std', 'jsd_mean'):
    va, vb = np.asarray([r[key] for r in a]), np.asarray([r[key] for r in b])
    out[key] = []
    for i in range(va.shape[1]):
      diff = stats.paired_diff_ci(list(vb[:, i]), list(va[:, i]))
      out[key].append(
        {
          **diff.as_dict(),
          'verdict': stats.interval_verdict(diff),
          layouts[0]: list(va[:, i]),
          layouts[1]: list(vb[:, i]),
        }
      )
  return out


def middle_pairs(num_layers: int) -> list[int]:
  """Indices of the adjacent-layer pairs in the middle third of the stack (at least one)."""
  pairs = num_layers - 1
  start, stop = pairs // 3, pairs - pairs // 3
  return list(range(start, max(stop, start + 1)))


CLAIMS = (  # key, statement, statistic (per model), the paper's sign of RealFormer - Post-LN
  ('5a', 'top layer: mean entropy lower', 'top_entropy', -1),
  ('5b', 'top layer: entropy std across heads and tokens lower', 'top_entropy_std', -1),
  ('5c', 'adjacent layers more alike: JSD over the middle third of pairs lower', 'middle_jsd', -1),
)


def claim_statistics(model: dict) -> dict:
  return {
    'top_entropy': model['entropy_mean'][-1],
    'top_entropy_std': model['entropy_std'][-1],
    'middle_jsd': float(
      np.mean([model['jsd_mean'][i] for i in middle_pairs(len(model['entropy_mean']))])
    )
    if len(model['entropy_mean']) > 1
    else math.nan,
  }


def claims(per_layout: dict, seeds: list[int]) -> list[dict]:
  """The paper's statements 5a-5c with verdicts by the module docstring's rule."""
  rows = []
  for key, statement, stat, sign in CLAIMS:
    row = {'key': key, 'statement': statement, 'expected_sign': sign, 'seeds': seeds}
    if len(seeds) >= 2:
      rf = [claim_statistics(per_layout['realformer'][s])[stat] for s in seeds]
      post = [claim_statistics(per_layout['post'][s])[stat] for s in seeds]
      diff = stats.paired_diff_ci(rf, post)
      se = diff.half_width / stats.t_quantile(0.975, len(seeds) - 1)
      row.update(
        difference=diff.as_dict(),
        realformer=rf,
        post=post,
        p_value=stats.t_p_value(diff.mean, se, len(seeds) - 1),
      )
    rows.append(row)
  tested = [r for r in rows if 'p_value' in r]
  for row, p in zip(tested, stats.holm([r['p_value'] for r in tested])):
    row['holm_p_value'] = p
  for row in rows:
    if 'holm_p_value' not in row:
      row['verdict'] = 'not testable at this scale'
    else:
      row['verdict'] = stats.p_verdict(
        row['difference']['mean'], row['holm_p_value'], row['expected_sign']
      )
  return rows


def write_markdown(
  path: str,
  summary: dict,
  layouts: list[str],
  command: str,
  seeds: list[int],
  diffs: dict,
  claim_rows: list[dict],
  notes: list[str],
  length: int,
) -> None:
  fmt = lambda d: stats.format_ci(stats.Summary(d['mean'], d['ci95_half_width'], d['n'], ()), 3)
  lines = [
    '# Attention entropy and adjacent-layer JSD',
    '',
    f'Regenerate: `{command}`. The held-out batches each run was evaluated on (its '
    '`data.eval_batches`, the same masked text for every model), every real query token '
    'of every head; per trained model, then mean ± 95% Student-t interval over seeds '
    f'{seeds}. Entropy in nats (uniform attention over all {length} keys: ln {length} = '
    f'{math.log(length):.3f}); JSD in nats (0 for identical distributions, at most '
    'ln 2 = 0.693).',
    '',
  ]
  lines += [f'- {note}' for note in notes] + ([''] if notes else [])
  lines += [
    "## The paper's statements (RealFormer - Post-LN, paired by seed, Holm-corrected)",
    '',
    '| | statement | RealFormer - Post-LN | p | Holm p | verdict | per seed '
    '(Post-LN / RealFormer) |',
    '|---|---|---|---|---|---|---|',
  ]
  for row in claim_rows:
    if 'difference' in row:
      per_seed = ', '.join(f'{p:.3f} / {r:.3f}' for p, r in zip(row['post'], row['realformer']))
      lines.append(
        f'| {row["key"]} | {row["statement"]} | {fmt(row["difference"])} | '
        f'{row["p_value"]:.3g} | {row["holm_p_value"]:.3g} | {row["verdict"]} | '
        f'{per_seed} |'
      )
    else:
      lines.append(f'| {row["key"]} | {row["statement"]} | n/a | | | {row["verdict"]} | |')
  lines += [
    '',
    '## Entropy per layer: mean (std across heads and tokens)',
    '',
    '| layer | ' + ' | '.join(f'{l} mean | {l} std' for l in layouts) + ' |',
    '|---' * (1 + 2 * len(layouts)) + '|',
  ]
  num_layers = len(summary[layouts[0]]['entropy_mean'])
  for layer in range(num_layers):
    cells = []
    for layout in layouts:
      cells += [
        fmt(summary[layout]['entropy_mean'][layer]),
        fmt(summary[layout]['entropy_std'][layer]),
      ]
    lines.append(f'| {layer + 1} | ' + ' | '.join(cells) + ' |')
  lines += [
    '',
    '## Jensen-Shannon divergence, same head, layer l vs l + 1',
    '',
    '| layers | ' + ' | '.join(layouts) + ' |',
    '|---' * (1 + len(layouts)) + '|',
  ]
  for pair in range(num_layers - 1):
    lines.append(
      f'| {pair + 1}-{pair + 2} | '
      + ' | '.join(fmt(summary[l]['jsd_mean'][pair]) for l in layouts)
      + ' |'
    )
  if diffs:
    first, second = layouts[0], layouts[1]
    lines += [
      '',
      f'## {second} - {first} per layer, paired by seed (per-seed values {first} / {second})',
      '',
      'Descriptive (one interval per layer, not corrected for '
      'their number): lower / higher when the 95% interval excludes 0.',
      '',
      '| statistic | layer(s) | difference | verdict | per seed |',
      '|---|---|---|---|---|',
    ]
    names = {
      'entropy_mean': 'entropy mean',
      'entropy_std': 'entropy std',
      'jsd_mean': 'JSD to the next layer',
    }
    for key, rows in diffs.items():
      for i, d in enumerate(rows):
        where = f'{i + 1}-{i + 2}' if key == 'jsd_mean' else f'{i + 1}'
        per_seed = ', '.join(f'{x:.3f} / {y:.3f}' for x, y in zip(d[first], d[second]))
        lines.append(f'| {names[key]} | {where} | {fmt(d)} | {d["verdict"]} | {per_seed} |')
  lines += ['', '![entropy per layer](entropy.png)', '', '![JSD per layer pair](jsd.png)', '']
  write_lines(path, lines)


def write_plots(
  out: str, per_layout: dict, summary: dict, layouts: list[str], length: int
) -> list[str]:
  plt = study.pyplot()
  if plt is None:
    return []
  num_layers = len(summary[layouts[0]]['entropy_mean'])
  fig, ax = plt.subplots(figsize=(max(7, 1.1 * num_layers), 4.8))
  width = 0.8 / len(layouts)
  for i, layout in enumerate(layouts):
    models = list(per_layout[layout].values())
    # Pool the seeds' samples per layer: the distribution over tokens and heads.
    pooled = [sum((r['entropy_sample'][l] for r in models), []) for l in range(num_layers)]
    positions = np.arange(num_layers) + (i - (len(layouts) - 1) / 2) * width
    parts = ax.violinplot(pooled, positions=positions, widths=width * 0.95, showmedians=True)
    for body in parts['bodies']:
      body.set_facecolor(LAYOUT_COLORS.get(layout, 'gray'))
      body.set_alpha(0.45)
    for r in models:  # each seed's mean entropy per layer
      ax.scatter(
        positions,
        r['entropy_mean'],
        color=LAYOUT_COLORS.get(layout, 'gray'),
        s=10,
        marker='x',
        zorder=3,
      )
    ax.plot(
      [],
      [],
      color=LAYOUT_COLORS.get(layout, 'gray'),
      label=f"{layout}: tokens x heads, {len(models)} seeds pooled (violin); x: each seed's mean",
      linewidth=6,
      alpha=0.5,
    )
  ax.axhline(
    math.log(length),
    color='gray',
    linestyle='--',
    label=f'uniform attention over {length} keys: ln {length}',
  )
  ax.set_ylim(0, math.log(length) * 1.08)
  ax.set_xticks(np.arange(num_layers), [str(l + 1) for l in range(num_layers)])
  ax.set_xlabel('layer')
  ax.set_ylabel('attention entropy (nats)')
  ax.set_title('per-token, per-head attention entropy on held-out text')
  ax.legend(fontsize=8, loc='lower left')
  paths = [study.save_figure(fig, os.path.join(out, 'entropy.png'))]

  fig, ax = plt.subplots(figsize=(max(7, 0.8 * num_layers), 4.8))
  pairs = np.arange(1, num_layers)
  for layout in layouts:
    rows = summary[layout]['jsd_mean']
    mean = np.asarray([r['mean'] for r in rows])
    half = np.asarray(
      [0 if math.isnan(r['ci95_half_width']) else r['ci95_half_width'] for r in rows]
    )
    color = LAYOUT_COLORS.get(layout, 'gray')
    ax.plot(pairs, mean, marker='o', color=color, label=f'{layout}: mean over seeds')
    # JSD >= 0: the band is clipped to the quantity's range.
    ax.fill_between(
      pairs,
      np.maximum(mean - half, 0.0),
      mean + half,
      color=color,
      alpha=0.2,
      label=f'{layout}: 95% interval over seeds (clipped at 0)',
    )
    for r in per_layout[layout].values():
      ax.scatter(pairs, r['jsd_mean'], color=color, s=10, marker='x')
  middle = middle_pairs(num_layers)
  ax.axvspan(
    pairs[middle[0]] - 0.4,
    pairs[middle[-1]] + 0.4,
    color='gray',
    alpha=0.08,
    label='middle third (statement 5c)',
  )
  ax.scatter([], [], color='gray', s=10, marker='x', label='each seed')
  ax.set_ylim(bottom=0)
  ax.set_xticks(pairs, [f'{p}-{p + 1}' for p in pairs])
  ax.set_xlabel('adjacent layers')
  ax.set_ylabel('mean JSD, same head and token (nats)')
  ax.set_title('Jensen-Shannon divergence between adjacent layers', fontsize=10)
  ax.legend(fontsize=7)
  paths.append(study.save_figure(fig, os.path.join(out, 'jsd.png')))
  return paths


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  layouts_plan.add_reader_arguments(parser, '--runs_dir')
  parser.add_argument('--seeds', default='', help='default: the confirmation seeds')
  parser.add_argument(
    '--max_batches',
    type=int,
    default=-1,
    help='held-out batches per model (-1: every eval batch of the run)',
  )
  parser.add_argument('--out', default='docs/results/attention_analysis')
  args = parser.parse_args(argv)
  star, confirm_seeds, _ = layouts_plan.decisions(args.layouts_results)
  rate = args.rate if args.rate is not None else star
  if rate is None:
    parser.error(f'no r* in {args.layouts_results}/results.json: pass --rate')
  seeds = [int(s) for s in args.seeds.split(',')] if args.seeds else confirm_seeds
  layouts = ['post', 'realformer']
  os.makedirs(args.out, exist_ok=True)
  per_layout, learned, notes = {l: {} for l in layouts}, {}, []
  for layout in layouts:
    for seed in seeds:
      name = f'lr{rate:g}-{layout}-s{seed}'
      workdir = os.path.join(args.runs_dir, name)
      record = os.path.join(args.layouts_results, 'runs', f'{name}.json')
      if not os.path.exists(record) or not os.path.isdir(workdir):
        notes.append(f'{name}: no finished run, skipped')
        continue
      with open(record) as f:
        run = json.load(f)
      if run.get('diverged_at_step') is not None:
        notes.append(f'{name}: diverged at step {run["diverged_at_step"]}, skipped')
        continue
      learned[(layout, seed)] = bool(run.get('learned'))
      print(f'analysing {workdir}', flush=True)
      per_layout[layout][seed] = analyse_workdir(workdir, args.max_batches, seed)
  both = [s for s in seeds if all(s in per_layout[l] for l in layouts)]
  paired = [s for s in both if all(learned[(l, s)] for l in layouts)]
  untrained = [s for s in both if s not in paired]
  if untrained:
    notes.append(
      f'seeds {untrained}: a run did not learn masked-LM; left out of the paired statements'
    )
  if not both:
    raise SystemExit(
      f'attention_analysis: no seed has both layouts at rate {rate:g} in {args.runs_dir}'
    )
  summary = {
    l: {
      key: summarise([per_layout[l][s] for s in both], key)
      for key in ('entropy_mean', 'entropy_std', 'entropy_head_std', 'jsd_mean')
    }
    for l in layouts
  }
  length = int(next(iter(per_layout['post'].values()))['length'])
  diffs = paired_differences(per_layout, layouts, paired)
  claim_rows = claims(per_layout, paired)
  defaults = {
    'runs_dir': parser.get_default('runs_dir'),
    'layouts_results': parser.get_default('layouts_results'),
    'rate': None,
    'seeds': '',
  }
  command = 'python -m experiments.attention_analysis' + ''.join(
    f' --{k}={getattr(args, k)}' for k in defaults if getattr(args, k) != defaults[k]
  )
  write_markdown(
    os.path.join(args.out, 'attention.md'),
    summary,
    layouts,
    command,
    both,
    diffs,
    claim_rows,
    notes,
    length,
  )
  runs_lib.write_json(
    os.path.join(args.out, 'attention.json'),
    {
      'rate': rate,
      'seeds': both,
      'paired_seeds': paired,
      'notes': notes,
      'claims': claim_rows,
      'summary': summary,
      'paired_differences': diffs,
      'per_model': {
        l: {str(s): {k: v for k, v in r.items() if k != 'entropy_sample'} for s, r in rs.items()}
        for l, rs in per_layout.items()
      },
    },
  )
  plots = write_plots(args.out, per_layout, summary, layouts, length)
  print(f'wrote {os.path.join(args.out, "attention.md")} and {", ".join(plots)}')
  return {'summary': summary, 'claims': claim_rows, 'notes': notes}


if __name__ == '__main__':
  main(sys.argv[1:])

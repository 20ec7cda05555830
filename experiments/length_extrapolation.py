r"""Length extrapolation: Su's Attention-O vs Attention-E, with and without residual attention.

    python -m experiments.length_extrapolation                  # CPU grid, ~1 h on 2 idle cores
    python -m experiments.length_extrapolation --scale=roformer_small   # accelerator size
    python -m experiments.length_extrapolation --quick --out=/tmp/le --workdirs=/tmp/le_runs

Trains BERT-style (Post-LN) MLMs with rotary positions (RoFormer form,
`position_embedding='rope'`) at sequence length n = 64 on the embedded corpus, through the real
pretraining loop, then evaluates MLM accuracy on the whole held-out split packed at n = 64, 128,
256, 512, 1024 (the same text at every n, the same masking rule, a fixed masking seed: every
variant is scored on the same masked tokens at a given n). Variants cross the attention scale,
standard 1/sqrt(d) ("Attention-O") or entropy-invariant log_512(n)/sqrt(d) ("Attention-E",
n = the row's real key count), with residual attention off (Post-LN) or on (RealFormer). With
residual attention the softmax sees the sum of every earlier layer's scores, each scaled by
log_512(n): does the factor still keep attention from spreading out as n grows? Besides
accuracy, each evaluation measures the mean attention entropy of every layer (nats, over heads
and real query tokens) to see exactly that.

Writes to --out (default docs/results/length_extrapolation/): results.md ([MASK] accuracy at
every n beside the context-free floors; all-prediction accuracy beside the floors and Su's
RoFormer-small numbers; the accuracy kept from n = 64 by the runs that learned, beside their
absolute accuracy; paired differences with seed + eval-set intervals, Holm-corrected, with
verdicts; attention entropy), accuracy.png ([MASK] accuracy per seed and its mean, the floor,
and entropy vs n), results.json (summary and every run's per-length numbers), runs/*.json (one
per finished run, with per-sequence sums: finished runs are not trained again; a run also
resumes from its checkpoints in --workdirs).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np

from realformer_jax.studies import runs as runs_lib
from realformer_jax.studies import stats, study
from realformer_jax.studies.report import difference_cell, seed_cell, write_lines, write_results

VARIANTS = {  # name: model overrides
  'O (standard)': dict(ln_placement='post', attention_scale='standard'),
  'E (entropy-invariant)': dict(ln_placement='post', attention_scale='entropy_invariant'),
  'O + residual attention': dict(ln_placement='realformer', attention_scale='standard'),
  'E + residual attention': dict(ln_placement='realformer', attention_scale='entropy_invariant'),
}
SLUGS = {
  'O (standard)': 'O',
  'E (entropy-invariant)': 'E',
  'O + residual attention': 'O-ra',
  'E + residual attention': 'E-ra',
}
COLORS = {
  'O (standard)': 'tab:blue',
  'E (entropy-invariant)': 'tab:orange',
  'O + residual attention': 'tab:green',
  'E + residual attention': 'tab:red',
}
LENGTHS = (64, 128, 256, 512, 1024)
SEEDS = (0, 1, 2)
# Su Jianlin's RoFormer-small MLM accuracy (%) trained at n = 64, one run each (his blog post on
# entropy-invariant attention scaling, kexue.fm, December 2021; the attention_scale docstring).
SU = {
  'O (standard)': dict(zip(LENGTHS, (43.27, 36.53, 23.02, 15.12, 11.54))),
  'E (entropy-invariant)': dict(zip(LENGTHS, (43.11, 41.17, 34.04, 20.15, 13.58))),
}
# The paired differences, (a, b, the sign Su's argument expects or 0 for no expectation):
# a - b at every n, Holm-corrected as one family.
COMPARISONS = (
  ('E (entropy-invariant)', 'O (standard)', +1),
  ('E + residual attention', 'O + residual attention', +1),
  ('O + residual attention', 'O (standard)', 0),
  ('E + residual attention', 'E (entropy-invariant)', 0),
)


SCALES = {
  # 2 CPU cores: ~0.6 s/step, ~6 min a run, 12 runs. Head size 64 as in RoFormer / BERT.
  'cpu': study.Scale(
    layers=4,
    hidden=128,
    heads=2,
    mlp=512,
    seq_len=64,
    batch=32,
    steps=500,
    learning_rate=2e-3,
    vocab=4000,
    evals=3,
    eval_batches=4,
  ),
  # RoFormer-small-like (6 layers x 512, 8 heads) for an accelerator.
  'roformer_small': study.Scale(
    layers=6,
    hidden=512,
    heads=8,
    mlp=2048,
    seq_len=64,
    batch=256,
    steps=20_000,
    learning_rate=5e-4,
    vocab=8000,
    evals=3,
    eval_batches=4,
  ),
  # The smoke test: seconds.
  'toy': dataclasses.replace(study.TOY, seq_len=16, steps=6, evals=3),
}
EVAL_LENGTHS = {'cpu': LENGTHS, 'roformer_small': LENGTHS, 'toy': (16, 32)}
# Tokens per evaluation batch (batch = EVAL_TOKENS // n).
EVAL_TOKENS = {'cpu': 8192, 'roformer_small': 8192, 'toy': 256}
MAX_EVAL_BATCHES = {'toy': 2}  # per length; default: the whole held-out split


def make_config(
  scale: study.Scale, variant: str, seed: int, data_dir: str = ''
) -> ml_collections.ConfigDict:
  """Rotary positions, trained at n = scale.seq_len (the loop's own evaluations there)."""
  return study.mlm_config(
    scale, seed=seed, data_dir=data_dir, model=dict(VARIANTS[variant], position_embedding='rope')
  )


def eval_data_config(
  train_data: ml_collections.ConfigDict, length: int, max_batches: int
) -> ml_collections.ConfigDict:
  """The training data config at another sequence length (same tokenizer, same masking)."""
  config = ml_collections.ConfigDict(train_data.to_dict())
  config.max_len = length
  config.max_predictions = max(1, math.ceil(0.15 * length))
  config.eval_batches = max_batches
  return config


def attention_entropy(intermediates: dict, batch: dict) -> dict:
  """Per-layer attention entropy summed over real query rows and heads, and the count."""
  probs_NxBxHxLxL = intermediates['encoder']['layers']['attention']['attention_probs'][0]
  probs_NxBxHxLxL = probs_NxBxHxLxL.astype(jnp.float32)
  # Padded keys get probability ~0 (bias -1e9): the entropy is over real keys.
  plogp = probs_NxBxHxLxL * jnp.log(jnp.maximum(probs_NxBxHxLxL, 1e-30))
  entropy_NxBxHxL = -jnp.sum(plogp, axis=-1)
  real_queries_1xBx1xL = batch['input_mask'][None, :, None, :].astype(jnp.float32)
  return {
    'entropy_sum': jnp.sum(entropy_NxBxHxL * real_queries_1xBx1xL, axis=(1, 2, 3)),
    'count': jnp.sum(real_queries_1xBx1xL) * probs_NxBxHxLxL.shape[2],
  }


def evaluate_at_lengths(
  workdir: str, lengths, max_batches: int, eval_tokens: int
) -> dict[int, dict]:
  """A trained workdir on the held-out split packed at each n: metrics by kind, the floors,
  per-sequence sums and the attention entropy per layer."""
  from realformer_jax import train  # pylint: disable=import-outside-toplevel

  train_data = train.load_workdir(workdir).config.data
  results = {}
  for length in lengths:
    config = eval_data_config(train_data, length, max_batches)
    scored = study.score_workdir(
      workdir, config, max(1, eval_tokens // length), extra=attention_entropy
    )
    extra = scored.pop('extra')
    scored['entropy_by_layer'] = (np.asarray(extra['entropy_sum']) / extra['count']).tolist()
    results[length] = scored
  return results


def train_one(
  scale: study.Scale, lengths, args, run: runs_lib.Run, report: runs_lib.Report
) -> dict:
  """Trains one run (resuming its workdir) and evaluates it at every length."""
  workdir = os.path.join(args.workdirs, run.name)
  config = make_config(scale, run.params['variant'], run.params['seed'], args.data_dir)
  result = study.train_run(config, workdir, report, progress_share=0.8)
  if result['diverged_at_step'] is not None:
    return dict(result, by_length=None)
  report(0.8, 'evaluating at n = ' + ', '.join(map(str, lengths)))
  name = study.scale_name(args)
  by_length = evaluate_at_lengths(
    workdir, lengths, MAX_EVAL_BATCHES.get(name, -1), EVAL_TOKENS[name]
  )
  return dict(result, by_length={str(n): r for n, r in by_length.items()})


def grid(seeds=SEEDS, variants=tuple(VARIANTS)) -> list[runs_lib.Run]:
  """Seed-major, so that an interrupted grid already holds every variant at its first seeds."""
  return [
    runs_lib.Run(f'{SLUGS[variant]}-s{seed}', dict(variant=variant, seed=seed))
    for seed in seeds
    for variant in variants
  ]


def _run(results: dict, variant: str, seed: int) -> dict | None:
  run = results.get(f'{SLUGS[variant]}-s{seed}')
  return run if run and run.get('by_length') else None


def _metric(run: dict, n: int, key: str) -> float:
  return run['by_length'][str(n)]['metrics'][key]


def summarise(results: dict, lengths, seeds=SEEDS) -> dict:
  """Per (variant, n): per-seed [MASK] and overall accuracy, the runs that learned, accuracy
  kept relative to the training length (runs that learned only); paired comparisons with
  seed + eval-set intervals, Holm-corrected as one family; the floors at each n."""
  base = lengths[0]
  table, entropy = {}, {}
  for variant in VARIANTS:
    table[variant], entropy[variant] = {}, {}
    runs = {s: _run(results, variant, s) for s in seeds}
    runs = {s: r for s, r in runs.items() if r}
    for n in lengths:
      if not runs:
        table[variant][str(n)] = None
        continue
      learned = {s: bool(r.get('learned')) for s, r in runs.items()}
      kept = [
        _metric(r, n, 'mask_accuracy') / _metric(r, base, 'mask_accuracy')
        for s, r in runs.items()
        if learned[s]
      ]
      table[variant][str(n)] = {
        'seeds': sorted(runs),
        'learned': [learned[s] for s in sorted(runs)],
        'mask_accuracy': [_metric(runs[s], n, 'mask_accuracy') for s in sorted(runs)],
        'mlm_accuracy': [_metric(runs[s], n, 'mlm_accuracy') for s in sorted(runs)],
        'kept_of_train_length': kept,
      }
      entropy[variant][str(n)] = [
        runs[s]['by_length'][str(n)]['entropy_by_layer'] for s in sorted(runs)
      ]
  floors = {}
  for run in results.values():
    if run.get('by_length'):
      floors = {n: run['by_length'][n]['floors'] for n in run['by_length']}
      sizes = {
        n: {
          'sequences': run['by_length'][n]['sequences'],
          'predictions': run['by_length'][n]['metrics']['predictions'],
          'mask_predictions': run['by_length'][n]['metrics']['mask_predictions'],
        }
        for n in run['by_length']
      }
      break
  else:
    sizes = {}
  comparisons = []
  for a, b, sign in COMPARISONS:
    for n in lengths:
      both = [s for s in seeds if _run(results, a, s) and _run(results, b, s)]
      # Only seeds whose two runs learned: a run at the floor says nothing about extrapolation.
      pairs = [s for s in both if all(_run(results, v, s).get('learned') for v in (a, b))]
      row = {
        'a': a,
        'b': b,
        'n': n,
        'expected_sign': sign,
        'seeds': pairs,
        'left_out': [s for s in both if s not in pairs],
      }
      if len(pairs) < 2 and len(both) >= 2:
        row['verdict'] = 'not testable at this scale (fewer than 2 seeds where both learned)'
      if len(pairs) >= 2:
        sums = lambda v: [
          study.sequence_sums({'scored': _run(results, v, s)['by_length'][str(n)]}) for s in pairs
        ]
        sa, sb = sums(a), sums(b)
        result = stats.paired_ratio_comparison(
          np.stack([x['mask_correct_sum'] for x in sa]),
          np.stack([x['mask_correct_sum'] for x in sb]),
          sa[0]['mask_count'],
        )
        row['comparison'] = result.as_dict()
      comparisons.append(row)
  tested = [r for r in comparisons if 'comparison' in r]
  for row, p in zip(tested, stats.holm([r['comparison']['p_value'] for r in tested])):
    row['holm_p_value'] = p
    row['verdict'] = stats.p_verdict(row['comparison']['mean'], p, row['expected_sign'])
  diverged = sorted(
    name for name, run in results.items() if run.get('diverged_at_step') is not None
  )
  return {
    'table': table,
    'entropy': entropy,
    'comparisons': comparisons,
    'floors': floors,
    'sizes': sizes,
    'diverged': diverged,
  }


def write_markdown(
  path: str, summary: dict, scale: study.Scale, lengths, command: str, seeds=SEEDS
) -> None:
  floors, sizes, table = summary['floors'], summary['sizes'], summary['table']
  described = ', '.join(
    f'n = {n}: {s["sequences"]} sequences, {s["predictions"]:.0f} '
    f'predictions ({s["mask_predictions"]:.0f} at [MASK])'
    for n, s in sizes.items()
  )
  untrained = sorted(
    f'{SLUGS[v]}-s{s}'
    for v in VARIANTS
    for row in [table[v].get(str(lengths[0]))]
    if row
    for s, ok in zip(row['seeds'], row['learned'])
    if not ok
  )
  lines = [
    '# Length extrapolation: Attention-O vs Attention-E, with and without residual attention',
    '',
    f'Regenerate: `{command}`. BERT-style MLM with rotary positions (RoFormer form), '
    f'{scale.layers} layers x {scale.hidden} hidden, {scale.heads} heads of '
    f'{scale.hidden // scale.heads}, FFN {scale.mlp}; Post-LN, or RealFormer (Post-LN + '
    f'residual attention). Trained at n = {scale.seq_len} for {scale.steps} steps of '
    f'{scale.batch} sequences (AdamW, peak learning rate {scale.learning_rate:g}, 10% warmup '
    f'then linear decay, dropout {scale.dropout}) with a {scale.vocab}-piece tokenizer on '
    f'the embedded corpus. Evaluated on the held-out split packed at each n (15% of tokens '
    f'predicted, fixed masking seed; the same text and masks for every run): {described}.',
    '',
    f'Seeds {list(seeds)}; cells: mean ± 95% Student-t half-width over seeds (per-seed '
    f'values). A run learned when its eval loss at n = {scale.seq_len} is below the '
    f"copy-aware unigram loss and its [MASK] accuracy above the most frequent token's. "
    f'Runs that did not learn: {", ".join(untrained) or "none"}.',
    '',
    '## Accuracy at [MASK] (%), beside the floors',
    '',
    '| n | ' + ' | '.join(VARIANTS) + ' | floor: most frequent = copy rule |',
    '|---' * (len(VARIANTS) + 2) + '|',
  ]
  for n in lengths:
    cells = [
      seed_cell(table[v][str(n)]['mask_accuracy'], scale=100) if table[v][str(n)] else 'n/a'
      for v in VARIANTS
    ]
    floor = floors.get(str(n), {}).get('mask_accuracy', math.nan)
    lines.append(f'| {n} | ' + ' | '.join(cells) + f' | {100 * floor:.2f} |')
  lines += [
    '',
    "## All predictions (%), beside the floors and Su's RoFormer-small",
    '',
    'Su: one run each of a larger model on a larger corpus, all predictions: compare '
    'the shapes of the curves, not their levels.',
    '',
    '| n | ' + ' | '.join(VARIANTS) + ' | most frequent | copy-aware | Su O | Su E |',
    '|---' * (len(VARIANTS) + 5) + '|',
  ]
  for n in lengths:
    cells = [
      seed_cell(table[v][str(n)]['mlm_accuracy'], scale=100) if table[v][str(n)] else 'n/a'
      for v in VARIANTS
    ]
    f = floors.get(str(n), {})
    su = [f'{SU[v][n]:.2f}' if n in SU[v] else '' for v in SU]
    lines.append(
      f'| {n} | ' + ' | '.join(cells) + f' | {100 * f.get("mlm_accuracy", math.nan):.2f}'
      f' | {100 * f.get("copy_accuracy", math.nan):.2f} | ' + ' | '.join(su) + ' |'
    )
  lines += [
    '',
    f'## [MASK] accuracy kept from n = {lengths[0]}, runs that learned',
    '',
    f"Each run's [MASK] accuracy at n divided by its own at n = {lengths[0]}, mean "
    '(per-seed values), beside the absolute [MASK] accuracy of the same runs; a run '
    'that did not learn is left out (a ratio of floor-level accuracies means '
    'nothing).',
    '',
    '| n | ' + ' | '.join(f'{v}: kept | absolute (%)' for v in VARIANTS) + ' |',
    '|---' * (2 * len(VARIANTS) + 1) + '|',
  ]
  for n in lengths:
    cells = []
    for v in VARIANTS:
      row = table[v][str(n)]
      if not row or not row['kept_of_train_length']:
        cells += ['n/a', 'n/a']
        continue
      learned = [a for a, ok in zip(row['mask_accuracy'], row['learned']) if ok]
      kept = row['kept_of_train_length']
      cells += [
        f'{np.mean(kept):.3f} ({", ".join(f"{k:.2f}" for k in kept)})',
        f'{100 * np.mean(learned):.2f}',
      ]
    lines.append(f'| {n} | ' + ' | '.join(cells) + ' |')
  lines += [
    '',
    '## Paired differences of [MASK] accuracy (percentage points)',
    '',
    'a - b paired by seed (same data order; Post-LN-based variants also start from '
    'the same weights); 95% interval over seeds and the eval set (bootstrap over '
    'held-out sequences), over the seeds whose two runs learned; p Holm-adjusted over '
    'the whole table. Verdict: "holds" / '
    '"does not hold" when the adjusted p is below 0.05 with the sign Su\'s argument '
    'expects (E above O) / the opposite; "higher" / "lower" where no sign is expected; '
    'else "inconclusive"; "not testable at this scale" with fewer than 2 such seeds.',
    '',
    '| a - b | n | seeds (left out: a run did not learn) | difference | Holm p | verdict |',
    '|---|---|---|---|---|---|',
  ]
  for row in summary['comparisons']:
    c = row.get('comparison')
    if 'verdict' not in row:
      continue
    seeds_cell = f'{row["seeds"]}' + (f' ({row["left_out"]})' if row['left_out'] else '')
    diff = difference_cell(c)
    holm = 'n/a' if not c else f'{row["holm_p_value"]:.3g}'
    lines.append(
      f'| {row["a"]} - {row["b"]} | {row["n"]} | {seeds_cell} | {diff} | {holm} | '
      f'{row["verdict"]} |'
    )
  lines += [
    '',
    '## Attention entropy (nats)',
    '',
    'Mean entropy of the attention distributions over heads and real query tokens, '
    'per layer (first / ... / last), mean over seeds; log n is the entropy of uniform '
    'attention over n keys.',
    '',
    '| n | log n | ' + ' | '.join(VARIANTS) + ' |',
    '|---' * (len(VARIANTS) + 2) + '|',
  ]
  for n in lengths:
    cells = [
      ' / '.join(f'{v:.2f}' for v in np.mean(summary['entropy'][v][str(n)], 0))
      if summary['entropy'][v].get(str(n))
      else 'n/a'
      for v in VARIANTS
    ]
    lines.append(f'| {n} | {math.log(n):.2f} | ' + ' | '.join(cells) + ' |')
  if summary['diverged']:
    lines += ['', 'Diverged (no evaluation): ' + ', '.join(summary['diverged']) + '.']
  lines += ['', '![[MASK] accuracy and attention entropy vs evaluation length](accuracy.png)', '']
  write_lines(path, lines)


def write_plot(path: str, summary: dict, scale: study.Scale, lengths) -> bool:
  """[MASK] accuracy (per-seed points, mean line, floor) and layer-mean entropy vs n."""
  plt = study.pyplot()
  if plt is None:
    return False
  fig, (ax_acc, ax_ent) = plt.subplots(1, 2, figsize=(13, 5))
  x = np.asarray(lengths, float)
  offsets = dict(zip(VARIANTS, (0.94, 0.98, 1.02, 1.06)))
  for variant in VARIANTS:
    rows = [summary['table'][variant][str(n)] for n in lengths]
    if not all(rows):
      continue
    color = COLORS[variant]
    per_seed = np.asarray([r['mask_accuracy'] for r in rows]) * 100  # [n, seeds]
    ax_acc.plot(x, per_seed.mean(1), color=color, label=f'{variant}: mean of seeds')
    for i, n in enumerate(lengths):
      ax_acc.scatter(
        [n * offsets[variant]] * per_seed.shape[1], per_seed[i], color=color, s=14, alpha=0.7
      )
    layers = [np.mean(summary['entropy'][variant][str(n)], 0) for n in lengths]
    ax_ent.plot(x, [np.mean(l) for l in layers], marker='o', color=color, label=variant)
  ax_acc.scatter([], [], color='gray', s=14, label='one seed (points)')
  floor = [100 * summary['floors'].get(str(n), {}).get('mask_accuracy', np.nan) for n in lengths]
  ax_acc.plot(
    x,
    floor,
    color='black',
    linestyle=':',
    label='floor: most frequent token (= copy rule at [MASK])',
  )
  for variant, values in SU.items():
    su = [n for n in lengths if n in values]
    if su:
      ax_acc.plot(
        su,
        [values[n] for n in su],
        linestyle='--',
        marker='x',
        linewidth=0.8,
        color=COLORS[variant],
        label=f'{variant}, Su (all predictions)',
      )
  ax_ent.plot(x, np.log(x), linestyle='--', color='gray', label='uniform: log n')
  for ax in (ax_acc, ax_ent):
    ax.set_xscale('log', base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.axvline(scale.seq_len, color='gray', linewidth=0.8)
    ax.set_xlabel(f'evaluation length n (trained at {scale.seq_len})')
    ax.legend(fontsize=7)
  ax_acc.set_ylim(bottom=0)
  ax_acc.set_ylabel('accuracy at [MASK] (%)')
  ax_acc.set_title('[MASK] accuracy vs n (points: seeds; line: their mean)')
  ax_ent.set_ylim(bottom=0)
  ax_ent.set_ylabel('attention entropy (nats), mean over layers and seeds')
  ax_ent.set_title('Attention entropy vs n')
  study.save_figure(fig, path)
  return True


def main(argv=None) -> dict:
  parser = study.argument_parser(
    __doc__,
    out='docs/results/length_extrapolation',
    workdirs='results/length_extrapolation',
    scales=SCALES,
  )
  parser.add_argument('--seeds', default=','.join(map(str, SEEDS)))
  parser.add_argument(
    '--variants',
    default=','.join(SLUGS.values()),
    help='comma-separated subset of ' + ', '.join(SLUGS.values()),
  )
  args = parser.parse_args(argv)
  name = study.scale_name(args)
  scale, lengths = SCALES[name], EVAL_LENGTHS[name]
  seeds = tuple(int(s) for s in args.seeds.split(','))
  by_slug = {slug: variant for variant, slug in SLUGS.items()}
  unknown = sorted(set(args.variants.split(',')) - set(by_slug))
  if unknown:
    parser.error(f'--variants: unknown {unknown}; choose from {sorted(by_slug)}')
  variants = tuple(by_slug[slug] for slug in args.variants.split(','))
  every = [dataclasses.replace(r, cost=scale.steps) for r in grid(seeds, variants)]
  runs_lib.Grid(args.out, study.selected(every, args.runs)).run(
    lambda run, report: train_one(scale, lengths, args, run, report)
  )
  results = runs_lib.load_results(args.out, every)
  summary = summarise(results, lengths, seeds)
  command = study.command('length_extrapolation', args)
  plot_path = os.path.join(args.out, 'accuracy.png')
  write_results(
    args.out,
    {
      'scale': dataclasses.asdict(scale),
      'lengths': list(lengths),
      'seeds': list(seeds),
      'su': {v: {str(n): a for n, a in values.items()} for v, values in SU.items()},
      'summary': summary,
      'runs': {k: _without_sequence_sums(v) for k, v in results.items()},
    },
    lambda path: write_markdown(path, summary, scale, lengths, command, seeds),
    lambda: [plot_path] if write_plot(plot_path, summary, scale, lengths) else [],
  )
  return {'results': results, 'summary': summary}


def _without_sequence_sums(run: dict) -> dict:
  run = dict(run)
  if run.get('by_length'):
    run['by_length'] = {
      n: {k: v for k, v in r.items() if k != 'sequence_sums'} for n, r in run['by_length'].items()
    }
  return run


if __name__ == '__main__':
  main(sys.argv[1:])

r"""The length-extrapolation plans' trainer and report (Plan.trainer 'at_lengths', Plan.report
'lengths'; studies/plans/length_extrapolation.py): a masked-LM run trained at the scale's
sequence length, then scored on the held-out split packed at every Plan.options['lengths'] n
(the same text and masks for every run), with each layer's attention entropy; the report
tables [MASK] and all-prediction accuracy per variant and n beside the floors and the
reference (Su's) numbers, the accuracy kept from the training length, the plan's comparisons
at every n (Holm-corrected as one family) and the entropy, and plots accuracy and entropy vs n.

The plan's options: lengths, eval_tokens (per evaluation batch: batch = eval_tokens // n),
max_eval_batches (per length; -1: the whole held-out split), labels and colors (per variant
slug), reference ({label: {n: accuracy %}}).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax.numpy as jnp
import ml_collections
import numpy as np

from realformer_jax.studies import stats, study
from realformer_jax.studies.plan import Plan
from realformer_jax.studies.report import difference_cell, seed_cell, write_lines, write_results


def train(plan: Plan, run, workdir: str, data_dir: str, report) -> dict:
  """Trains one run (resuming its workdir) and evaluates it at every length."""
  p, options = run.params, plan.options
  config = study.mlm_config(
    plan.scale,
    seed=p['seed'],
    learning_rate=p['learning_rate'],
    steps=p['steps'],
    data_dir=data_dir,
    model=p.get('model', {}),
  )
  result = study.train_run(config, workdir, report, progress_share=0.8)
  if result['diverged_at_step'] is not None:
    return dict(result, by_length=None)
  lengths = options['lengths']
  report(0.8, 'evaluating at n = ' + ', '.join(map(str, lengths)))
  by_length = evaluate_at_lengths(
    workdir, lengths, options['max_eval_batches'], options['eval_tokens']
  )
  return dict(result, by_length={str(n): r for n, r in by_length.items()})


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


class _Runs:
  """The plan's runs by variant label and seed, and its labels in the plan's order."""

  def __init__(self, plan: Plan, results: dict):
    labels = plan.options['labels']
    arms = plan.all_arms()
    self.labels = [labels[a.variant] for a in arms]
    self.seeds = sorted({s for a in arms for s in a.seeds})
    self.names = {
      labels[a.variant]: {s: plan.run_name(a.variant, a.rate, a.steps, s) for s in a.seeds}
      for a in arms
    }
    self.results = results

  def get(self, label: str, seed: int) -> dict | None:
    run = self.results.get(self.names[label].get(seed, ''))
    return run if run and run.get('by_length') else None


def _metric(run: dict, n: int, key: str) -> float:
  return run['by_length'][str(n)]['metrics'][key]


def analyse(plan: Plan, results: dict) -> dict:
  """Per (variant, n): per-seed [MASK] and overall accuracy, the runs that learned, accuracy
  kept relative to the training length (runs that learned only); the plan's comparisons at
  every n with seed + eval-set intervals, Holm-corrected as one family; the floors at each n."""
  runs_of = _Runs(plan, results)
  lengths, seeds, labels = plan.options['lengths'], runs_of.seeds, plan.options['labels']
  _run = runs_of.get
  base = lengths[0]
  table, entropy = {}, {}
  for variant in runs_of.labels:
    table[variant], entropy[variant] = {}, {}
    runs = {s: _run(variant, s) for s in seeds}
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
  for c in plan.comparisons:
    a, b, sign = labels[c.a.variant], labels[c.b.variant], c.expected
    for n in lengths:
      both = [s for s in seeds if _run(a, s) and _run(b, s)]
      # Only seeds whose two runs learned: a run at the floor says nothing about extrapolation.
      pairs = [s for s in both if all(_run(v, s).get('learned') for v in (a, b))]
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
          study.sequence_sums({'scored': _run(v, s)['by_length'][str(n)]}) for s in pairs
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
    name
    for name in (n for by_seed in runs_of.names.values() for n in by_seed.values())
    if name in results and results[name].get('diverged_at_step') is not None
  )
  return {
    'table': table,
    'entropy': entropy,
    'comparisons': comparisons,
    'floors': floors,
    'sizes': sizes,
    'diverged': diverged,
  }


def write(plan: Plan, results: dict, analysis: dict, command: str) -> None:
  """results.json (recipe, lengths, seeds, reference numbers, the analysis, every run without
  its per-sequence sums), results.md and accuracy.png, in plan.out."""
  lengths, plot_path = plan.options['lengths'], os.path.join(plan.out, 'accuracy.png')
  seeds = _Runs(plan, results).seeds
  reference = plan.options['reference']
  os.makedirs(plan.out, exist_ok=True)
  write_results(
    plan.out,
    {
      'scale': dataclasses.asdict(plan.scale),
      'lengths': list(lengths),
      'seeds': seeds,
      'su': {v: {str(n): a for n, a in values.items()} for v, values in reference.items()},
      'summary': analysis,
      'runs': {k: _without_sequence_sums(v) for k, v in results.items()},
    },
    lambda path: write_markdown(path, plan, analysis, command, seeds),
    lambda: [plot_path] if write_plot(plot_path, plan, analysis) else [],
  )


def write_markdown(path: str, plan: Plan, summary: dict, command: str, seeds) -> None:
  scale, lengths, labels = plan.scale, plan.options['lengths'], plan.options['labels']
  variants = [labels[a.variant] for a in plan.all_arms()]
  slugs = {label: slug for slug, label in labels.items()}
  reference = plan.options['reference']
  floors, sizes, table = summary['floors'], summary['sizes'], summary['table']
  described = ', '.join(
    f'n = {n}: {s["sequences"]} sequences, {s["predictions"]:.0f} '
    f'predictions ({s["mask_predictions"]:.0f} at [MASK])'
    for n, s in sizes.items()
  )
  untrained = sorted(
    f'{slugs[v]}-s{s}'
    for v in variants
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
    '| n | ' + ' | '.join(variants) + ' | floor: most frequent = copy rule |',
    '|---' * (len(variants) + 2) + '|',
  ]
  for n in lengths:
    cells = [
      seed_cell(table[v][str(n)]['mask_accuracy'], scale=100) if table[v][str(n)] else 'n/a'
      for v in variants
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
    '| n | ' + ' | '.join(variants) + ' | most frequent | copy-aware | Su O | Su E |',
    '|---' * (len(variants) + 5) + '|',
  ]
  for n in lengths:
    cells = [
      seed_cell(table[v][str(n)]['mlm_accuracy'], scale=100) if table[v][str(n)] else 'n/a'
      for v in variants
    ]
    f = floors.get(str(n), {})
    su = [f'{reference[v][n]:.2f}' if n in reference[v] else '' for v in reference]
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
    '| n | ' + ' | '.join(f'{v}: kept | absolute (%)' for v in variants) + ' |',
    '|---' * (2 * len(variants) + 1) + '|',
  ]
  for n in lengths:
    cells = []
    for v in variants:
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
    '| n | log n | ' + ' | '.join(variants) + ' |',
    '|---' * (len(variants) + 2) + '|',
  ]
  for n in lengths:
    cells = [
      ' / '.join(f'{v:.2f}' for v in np.mean(summary['entropy'][v][str(n)], 0))
      if summary['entropy'][v].get(str(n))
      else 'n/a'
      for v in variants
    ]
    lines.append(f'| {n} | {math.log(n):.2f} | ' + ' | '.join(cells) + ' |')
  if summary['diverged']:
    lines += ['', 'Diverged (no evaluation): ' + ', '.join(summary['diverged']) + '.']
  lines += ['', '![[MASK] accuracy and attention entropy vs evaluation length](accuracy.png)', '']
  write_lines(path, lines)


def write_plot(path: str, plan: Plan, summary: dict) -> bool:
  """[MASK] accuracy (per-seed points, mean line, floor) and layer-mean entropy vs n."""
  scale, lengths, labels = plan.scale, plan.options['lengths'], plan.options['labels']
  variants = [labels[a.variant] for a in plan.all_arms()]
  colors = {labels[slug]: color for slug, color in plan.options['colors'].items()}
  reference = plan.options['reference']
  plt = study.pyplot()
  if plt is None:
    return False
  fig, (ax_acc, ax_ent) = plt.subplots(1, 2, figsize=(13, 5))
  x = np.asarray(lengths, float)
  offsets = dict(zip(variants, (0.94, 0.98, 1.02, 1.06)))
  for variant in variants:
    rows = [summary['table'][variant][str(n)] for n in lengths]
    if not all(rows):
      continue
    color = colors[variant]
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
  for variant, values in reference.items():
    su = [n for n in lengths if n in values]
    if su:
      ax_acc.plot(
        su,
        [values[n] for n in su],
        linestyle='--',
        marker='x',
        linewidth=0.8,
        color=colors[variant],
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


def _without_sequence_sums(run: dict) -> dict:
  run = dict(run)
  if run.get('by_length'):
    run['by_length'] = {
      n: {k: v for k, v in r.items() if k != 'sequence_sums'} for n, r in run['by_length'].items()
    }
  return run

r"""Length extrapolation: Su's Attention-O vs Attention-E table, with and without residual attention.

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

Writes to --out (default docs/results/length_extrapolation/): results.md (mean MLM accuracy with
95% Student-t interval at every n, next to Su's RoFormer-small numbers; paired differences;
attention entropy), accuracy.png (accuracy and entropy vs n, one line per variant, 95% bands),
results.json (summary and every run's per-length numbers), runs/*.json (one per finished run:
finished runs are not trained again; a run also resumes from its checkpoints in --workdirs).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments import runs as runs_lib
from experiments import stats
from realformer_jax import MaskedLM, data, train
from realformer_jax.losses import mlm_loss_and_metrics

VARIANTS = {  # name: model overrides
    'O (standard)': dict(ln_placement='post', attention_scale='standard'),
    'E (entropy-invariant)': dict(ln_placement='post', attention_scale='entropy_invariant'),
    'O + residual attention': dict(ln_placement='realformer', attention_scale='standard'),
    'E + residual attention': dict(ln_placement='realformer',
                                   attention_scale='entropy_invariant'),
}
SLUGS = {'O (standard)': 'O', 'E (entropy-invariant)': 'E', 'O + residual attention': 'O-ra',
         'E + residual attention': 'E-ra'}
COLORS = {'O (standard)': 'tab:blue', 'E (entropy-invariant)': 'tab:orange',
          'O + residual attention': 'tab:green', 'E + residual attention': 'tab:red'}
LENGTHS = (64, 128, 256, 512, 1024)
SEEDS = (0, 1, 2)
# docs/design.md §3: Su's RoFormer-small MLM accuracy (%), trained at n = 64, one run each.
SU = {'O (standard)': dict(zip(LENGTHS, (43.27, 36.53, 23.02, 15.12, 11.54))),
      'E (entropy-invariant)': dict(zip(LENGTHS, (43.11, 41.17, 34.04, 20.15, 13.58)))}
# The paired differences the README's statement rests on: (a, b) reports a - b.
COMPARISONS = (('E (entropy-invariant)', 'O (standard)'),
               ('E + residual attention', 'O + residual attention'),
               ('O + residual attention', 'O (standard)'),
               ('E + residual attention', 'E (entropy-invariant)'))


@dataclasses.dataclass(frozen=True)
class Scale:
  layers: int
  hidden: int
  heads: int
  mlp: int
  batch: int
  steps: int
  learning_rate: float
  vocab: int
  train_len: int = 64
  eval_tokens: int = 8192  # tokens per evaluation batch (batch = eval_tokens // n)
  lengths: tuple = LENGTHS
  max_eval_batches: int = -1  # per length; -1: the whole held-out split


SCALES = {
    # One core of 2 (the layout grid runs on the other): ~0.6 s/step, ~6 min a run, 12 runs.
    # Head size 64 as in RoFormer / BERT.
    'cpu': Scale(layers=4, hidden=128, heads=2, mlp=512, batch=32, steps=500,
                 learning_rate=2e-3, vocab=4000),
    # RoFormer-small-like (6 layers x 512, 8 heads) for an accelerator.
    'roformer_small': Scale(layers=6, hidden=512, heads=8, mlp=2048, batch=256, steps=20_000,
                            learning_rate=5e-4, vocab=8000),
    # The smoke test: seconds.
    'toy': Scale(layers=2, hidden=32, heads=2, mlp=64, batch=8, steps=6, learning_rate=3e-3,
                 vocab=500, train_len=16, eval_tokens=256, lengths=(16, 32),
                 max_eval_batches=2),
}


def make_config(scale: Scale, variant: str, seed: int,
                data_dir: str = '') -> ml_collections.ConfigDict:
  config = train.default_config()
  m = config.model
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim = (scale.layers, scale.hidden,
                                                         scale.heads, scale.mlp)
  m.position_embedding = 'rope'
  m.max_len = scale.train_len  # no table under rope; evaluation goes past it
  m.dropout_rate = m.attention_dropout_rate = 0.1
  for key, value in VARIANTS[variant].items():
    m[key] = value
  d = config.data
  d.vocab_size, d.max_len = scale.vocab, scale.train_len
  d.max_predictions = max(1, math.ceil(0.15 * scale.train_len))
  d.eval_batches = 4  # the loop's own evaluations at n = train_len (progress only)
  if data_dir:
    d.data_dir = data_dir
  t = config.train
  t.global_batch_size, t.num_train_steps = scale.batch, scale.steps
  t.warmup_steps = max(1, scale.steps // 10)
  t.learning_rate = scale.learning_rate
  t.log_every_steps = max(1, scale.steps // 20)
  t.eval_every_steps = t.checkpoint_every_steps = max(1, scale.steps // 3)
  t.keep_checkpoints = 1
  t.seed = seed
  return config


def eval_data_config(train_data: ml_collections.ConfigDict, length: int,
                     max_batches: int) -> ml_collections.ConfigDict:
  """The training data config at another sequence length (same tokenizer, same masking)."""
  config = ml_collections.ConfigDict(train_data.to_dict())
  config.max_len = length
  config.max_predictions = max(1, math.ceil(0.15 * length))
  config.eval_batches = max_batches
  return config


def _batch_sums(model: MaskedLM, params, batch: dict) -> dict:
  """MLM sums and per-layer attention entropy summed over real query rows and heads."""
  logits, state = model.apply({'params': params}, batch['input_ids'], batch['input_mask'],
                              batch['segment_ids'], batch['masked_positions'],
                              mutable=['intermediates'])
  sums = mlm_loss_and_metrics(logits, batch['masked_ids'], batch['masked_weights'])[1]
  probs_NxBxHxLxL = state['intermediates']['encoder']['layers']['attention'][
      'attention_probs'][0].astype(jnp.float32)
  # Padded keys get probability ~0 (bias -1e9): the entropy is over real keys.
  plogp = probs_NxBxHxLxL * jnp.log(jnp.maximum(probs_NxBxHxLxL, 1e-30))
  entropy_NxBxHxL = -jnp.sum(plogp, axis=-1)
  real_queries_1xBx1xL = batch['input_mask'][None, :, None, :].astype(jnp.float32)
  sums['entropy_sum_N'] = jnp.sum(entropy_NxBxHxL * real_queries_1xBx1xL, axis=(1, 2, 3))
  sums['entropy_count'] = jnp.sum(real_queries_1xBx1xL) * probs_NxBxHxLxL.shape[2]
  return sums


def evaluate_at_lengths(workdir: str, scale: Scale) -> dict[int, dict]:
  """MLM accuracy, loss and attention entropy of a trained workdir on the held-out split
  packed at each n."""
  run = train.load_workdir(workdir)
  model = MaskedLM(run.model_config)
  sums_fn = jax.jit(lambda params, batch: _batch_sums(model, params, batch))
  results = {}
  for length in scale.lengths:
    config = eval_data_config(run.config.data, length, scale.max_eval_batches)
    totals, sequences = None, 0
    for batch in data.make_eval_iterator(config, max(1, scale.eval_tokens // length)):
      out = jax.device_get(sums_fn(run.params, {k: jnp.asarray(v) for k, v in batch.items()}))
      totals = out if totals is None else {k: totals[k] + out[k] for k in out}
      sequences += int(np.sum(batch['input_mask'][:, 0]))
    weight = float(totals['mlm_weight'])
    results[length] = {
        'accuracy': float(totals['mlm_correct_sum']) / weight,
        'loss': float(totals['mlm_loss_sum']) / weight,
        'entropy_by_layer': (totals['entropy_sum_N'] / totals['entropy_count']).tolist(),
        'predictions': int(weight), 'sequences': sequences}
  return results


def train_one(scale: Scale, workdirs: str, data_dir: str, run: runs_lib.Run,
              report: runs_lib.Report) -> dict:
  """Trains one run (resuming its workdir) and evaluates it at every length."""
  workdir = os.path.join(workdirs, run.name)
  config = make_config(scale, run.params['variant'], run.params['seed'], data_dir)

  def on_log(step, stop, scalars):
    report(0.9 * step / stop, f'step {step}/{stop} loss {scalars["train/loss"]:.3f}')

  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'train.log'), 'a') as log, contextlib.redirect_stdout(log):
    try:
      final = train.train_and_evaluate(config, workdir, on_log=on_log)
    except train.TrainingError as error:  # divergence is a result, not a crash
      return {'workdir': workdir, 'diverged': str(error), 'by_length': None}
  report(0.9, 'evaluating at n = ' + ', '.join(map(str, scale.lengths)))
  by_length = evaluate_at_lengths(workdir, scale)
  return {'workdir': workdir, 'diverged': None,
          'final_eval_at_train_length': final,
          'by_length': {str(n): r for n, r in by_length.items()}}


def grid(seeds=SEEDS, variants=tuple(VARIANTS)) -> list[runs_lib.Run]:
  """Seed-major, so that an interrupted grid already holds every variant at its first seeds."""
  return [runs_lib.Run(f'{SLUGS[variant]}-s{seed}', dict(variant=variant, seed=seed))
          for seed in seeds for variant in variants]


def _per_seed(results: dict, variant: str, seeds, n: int, key: str) -> list:
  """Per-seed values in seed order; None where a run is missing or diverged."""
  out = []
  for seed in seeds:
    run = results.get(f'{SLUGS[variant]}-s{seed}')
    out.append(run['by_length'][str(n)][key] if run and run['by_length'] else None)
  return out


def summarise(results: dict, scale: Scale, seeds=SEEDS) -> dict:
  """Mean and 95% interval per (variant, n); paired-by-seed differences (same data order and
  masking; Post-LN-based variants also start from the same weights)."""
  accuracy, entropy = {}, {}
  for variant in VARIANTS:
    accuracy[variant], entropy[variant] = {}, {}
    for n in scale.lengths:
      values = [v for v in _per_seed(results, variant, seeds, n, 'accuracy') if v is not None]
      accuracy[variant][str(n)] = stats.mean_ci(values).as_dict() if values else None
      layers = [v for v in _per_seed(results, variant, seeds, n, 'entropy_by_layer')
                if v is not None]
      entropy[variant][str(n)] = ([stats.mean_ci(per_layer).as_dict()
                                   for per_layer in zip(*layers)] if layers else None)
  comparisons = {}
  for a, b in COMPARISONS:
    comparisons[f'{a} - {b}'] = per_n = {}
    for n in scale.lengths:
      pairs = [(x, y) for x, y in zip(_per_seed(results, a, seeds, n, 'accuracy'),
                                      _per_seed(results, b, seeds, n, 'accuracy'))
               if x is not None and y is not None]
      if len(pairs) >= 2:
        diff = stats.paired_diff_ci([x for x, _ in pairs], [y for _, y in pairs])
        per_n[str(n)] = dict(diff.as_dict(), verdict=stats.interval_verdict(diff))
  diverged = sorted(name for name, run in results.items() if run.get('diverged'))
  return {'accuracy': accuracy, 'entropy': entropy, 'comparisons': comparisons,
          'diverged': diverged}


def _summary(d: dict) -> stats.Summary:
  return stats.Summary(d['mean'], d['ci95_half_width'], d['n'], tuple(d['values']))


def write_markdown(path: str, results: dict, summary: dict, scale: Scale, command: str,
                   seeds=SEEDS) -> None:
  fmt = lambda d, digits=2, times=100: stats.format_ci(_summary(d), digits, times) if d else 'n/a'
  evaluated = next((r for r in results.values() if r['by_length']), None)
  sizes = ', '.join(
      f'n = {n}: {evaluated["by_length"][str(n)]["sequences"]} sequences, '
      f'{evaluated["by_length"][str(n)]["predictions"]} predictions'
      for n in scale.lengths) if evaluated else 'no run evaluated'
  lines = [
      '# Length extrapolation: Attention-O vs Attention-E, with and without residual attention',
      '',
      f'Regenerate: `{command}`. BERT-style MLM with rotary positions (RoFormer form), '
      f'{scale.layers} layers x {scale.hidden} hidden, {scale.heads} heads of '
      f'{scale.hidden // scale.heads}, FFN {scale.mlp}; Post-LN, or RealFormer (Post-LN + '
      f'residual attention). Trained at n = {scale.train_len} for {scale.steps} steps of '
      f'{scale.batch} sequences (AdamW, peak learning rate {scale.learning_rate:g}, warmup '
      f'{max(1, scale.steps // 10)} steps then linear decay, dropout 0.1) with a '
      f'{scale.vocab}-piece tokenizer on the embedded corpus. Evaluated on the whole held-out '
      f'split packed at each n (15% of tokens predicted, fixed masking seed): {sizes}.',
      '',
      f'MLM accuracy (%): mean ± 95% Student-t half-width over seeds {list(seeds)}. Su: '
      'RoFormer-small trained at n = 64 (docs/design.md §3), one run each, a larger model '
      'and corpus: compare the shapes of the curves, not their levels.',
      '',
      '| n | ' + ' | '.join(VARIANTS) + ' | Su O | Su E |',
      '|---' * (len(VARIANTS) + 3) + '|']
  for n in scale.lengths:
    su = [f'{SU[v][n]:.2f}' if n in SU[v] else '' for v in SU]
    lines.append(f'| {n} | ' + ' | '.join(fmt(summary['accuracy'][v][str(n)])
                                         for v in VARIANTS) + ' | ' + ' | '.join(su) + ' |')
  lines += ['', f'Accuracy relative to n = {scale.train_len} (mean over seeds of each run\'s '
            f'accuracy at n divided by its accuracy at n = {scale.train_len}):', '',
            '| n | ' + ' | '.join(VARIANTS) + ' | Su O | Su E |',
            '|---' * (len(VARIANTS) + 3) + '|']
  base = scale.lengths[0]
  for n in scale.lengths:
    cells = []
    for v in VARIANTS:
      ratios = [x / y for x, y in zip(_per_seed(results, v, seeds, n, 'accuracy'),
                                      _per_seed(results, v, seeds, base, 'accuracy'))
                if x is not None and y is not None]
      cells.append(f'{np.mean(ratios):.3f}' if ratios else 'n/a')
    su = [f'{SU[v][n] / SU[v][base]:.3f}' if n in SU[v] and base in SU[v] else ''
          for v in SU]
    lines.append(f'| {n} | ' + ' | '.join(cells) + ' | ' + ' | '.join(su) + ' |')
  lines += ['', '## Paired differences (percentage points, same seeds)', '',
            'Verdict: higher / lower when the 95% interval of the difference excludes 0, else '
            'inconclusive.', '',
            '| difference | ' + ' | '.join(f'n = {n}' for n in scale.lengths) + ' |',
            '|---' * (len(scale.lengths) + 1) + '|']
  for name, per_n in summary['comparisons'].items():
    cells = [f'{fmt(per_n[str(n)])} ({per_n[str(n)]["verdict"]})' if str(n) in per_n
             else 'n/a' for n in scale.lengths]
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  lines += ['', '## Attention entropy (nats)', '',
            'Mean entropy of the attention distributions over heads and real query tokens, '
            'per layer (first / ... / last), mean over seeds; log n is the entropy of uniform '
            'attention over n keys.', '',
            '| n | log n | ' + ' | '.join(VARIANTS) + ' |',
            '|---' * (len(VARIANTS) + 2) + '|']
  for n in scale.lengths:
    cells = [' / '.join(f'{layer["mean"]:.2f}' for layer in summary['entropy'][v][str(n)])
             if summary['entropy'][v][str(n)] else 'n/a' for v in VARIANTS]
    lines.append(f'| {n} | {math.log(n):.2f} | ' + ' | '.join(cells) + ' |')
  if summary['diverged']:
    lines += ['', 'Diverged (no evaluation): ' + ', '.join(summary['diverged']) + '.']
  lines += ['', '![accuracy and attention entropy vs evaluation length](accuracy.png)', '']
  with open(path, 'w') as f:
    f.write('\n'.join(lines))


def write_plot(path: str, summary: dict, scale: Scale) -> bool:
  """Accuracy and layer-mean attention entropy vs n; False when matplotlib is missing."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  fig, (ax_acc, ax_ent) = plt.subplots(1, 2, figsize=(13, 5))
  lengths = np.asarray(scale.lengths)
  for variant in VARIANTS:
    rows = [summary['accuracy'][variant][str(n)] for n in scale.lengths]
    if all(rows):
      mean = np.asarray([r['mean'] for r in rows]) * 100
      half = np.nan_to_num(np.asarray([r['ci95_half_width'] for r in rows])) * 100
      ax_acc.plot(lengths, mean, marker='o', color=COLORS[variant], label=f'{variant} (ours)')
      ax_acc.fill_between(lengths, mean - half, mean + half, color=COLORS[variant], alpha=0.2)
    layers = [summary['entropy'][variant][str(n)] for n in scale.lengths]
    if all(layers):
      ax_ent.plot(lengths, [np.mean([l['mean'] for l in per_n]) for per_n in layers],
                  marker='o', color=COLORS[variant], label=variant)
  for variant, values in SU.items():
    su_lengths = [n for n in scale.lengths if n in values]
    if su_lengths:
      ax_acc.plot(su_lengths, [values[n] for n in su_lengths], linestyle=':', marker='x',
                  color=COLORS[variant], label=f'{variant}, Su (RoFormer-small)')
  ax_ent.plot(lengths, np.log(lengths), linestyle='--', color='gray', label='uniform: log n')
  for ax in (ax_acc, ax_ent):
    ax.set_xscale('log', base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.axvline(scale.train_len, color='gray', linewidth=0.8)
    ax.set_xlabel(f'evaluation length n (trained at {scale.train_len})')
    ax.legend(fontsize=8)
  ax_acc.set_ylabel('MLM accuracy (%)')
  ax_acc.set_title('MLM accuracy vs n (bands: 95% interval over seeds)')
  ax_ent.set_ylabel('attention entropy (nats), mean over layers')
  ax_ent.set_title('Attention entropy vs n (mean over seeds)')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', choices=sorted(SCALES), default='cpu')
  parser.add_argument('--quick', action='store_true', help='the toy scale: a smoke run')
  parser.add_argument('--out', default='docs/results/length_extrapolation')
  parser.add_argument('--workdirs', default='results/length_extrapolation')
  parser.add_argument('--data_dir', default='', help='TFDS data dir (default: the data '
                      "config's)")
  parser.add_argument('--seeds', default=','.join(map(str, SEEDS)))
  parser.add_argument('--variants', default=','.join(SLUGS.values()),
                      help='comma-separated subset of ' + ', '.join(SLUGS.values()))
  args = parser.parse_args(argv)
  scale_name = 'toy' if args.quick else args.scale
  scale = SCALES[scale_name]
  seeds = tuple(int(s) for s in args.seeds.split(','))
  by_slug = {slug: variant for variant, slug in SLUGS.items()}
  unknown = sorted(set(args.variants.split(',')) - set(by_slug))
  if unknown:
    parser.error(f'--variants: unknown {unknown}; choose from {sorted(by_slug)}')
  variants = tuple(by_slug[slug] for slug in args.variants.split(','))
  runs = [dataclasses.replace(r, cost=scale.steps) for r in grid(seeds, variants)]
  results = runs_lib.Grid(args.out, runs).run(
      lambda run, report: train_one(scale, args.workdirs, args.data_dir, run, report))
  summary = summarise(results, scale, seeds)
  command = 'python -m experiments.length_extrapolation' + (
      '' if scale_name == 'cpu' else f' --scale={scale_name}')
  runs_lib.write_json(os.path.join(args.out, 'results.json'),
                      {'scale': dataclasses.asdict(scale), 'seeds': list(seeds),
                       'su': {v: {str(n): a for n, a in values.items()}
                              for v, values in SU.items()},
                       'summary': summary, 'runs': results})
  write_markdown(os.path.join(args.out, 'results.md'), results, summary, scale, command, seeds)
  plotted = write_plot(os.path.join(args.out, 'accuracy.png'), summary, scale)
  print(f'wrote {os.path.join(args.out, "results.md")}'
        + (' and accuracy.png' if plotted else ''))
  return {'results': results, 'summary': summary}


if __name__ == '__main__':
  main(sys.argv[1:])

r"""Length extrapolation: Su's Attention-O vs Attention-E table, with and without residual attention.

    python -m experiments.length_extrapolation                  # CPU grid, ~1 h on 2 cores
    python -m experiments.length_extrapolation --scale=roformer_small   # accelerator size
    python -m experiments.length_extrapolation --quick --out=/tmp/le    # toy smoke run

Trains BERT-style MLMs with rotary positions (RoFormer form, `position_embedding='rope'`) at
sequence length n = 64 on the embedded corpus, then evaluates MLM accuracy on the held-out split
packed at n = 64, 128, 256, 512, 1024 (the same masking rule, a fixed masking seed per n). Variants
cross the attention scale, standard 1/sqrt(d) ("Attention-O") or entropy-invariant
log_512(n)/sqrt(d) ("Attention-E", n = the row's real key count), with residual attention off
(Post-LN) or on (RealFormer): RealFormer's carried sums add scores of every earlier layer, each
already scaled by log_512(n), so does the factor still keep the softmax's entropy in place?

Writes to --out (default docs/results/length_extrapolation/): results.md (mean MLM accuracy with
95% Student-t interval and per-seed values at every n, next to Su's RoFormer-small numbers),
accuracy.png (accuracy vs n per variant), results.json, runs/*.json (finished runs are not
trained again; each run also resumes from its checkpoints in --workdirs).
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
LENGTHS = (64, 128, 256, 512, 1024)
SEEDS = (0, 1, 2)
# DESIGN.md section 3: RoFormer-small MLM accuracy (%), trained at n = 64.
SU = {'O (standard)': (43.27, 36.53, 23.02, 15.12, 11.54),
      'E (entropy-invariant)': (43.11, 41.17, 34.04, 20.15, 13.58)}


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
    'cpu': Scale(layers=4, hidden=256, heads=4, mlp=1024, batch=64, steps=900,
                 learning_rate=1e-3, vocab=8000),
    # RoFormer-small-like (6 layers x 512, 8 heads) for an accelerator.
    'roformer_small': Scale(layers=6, hidden=512, heads=8, mlp=2048, batch=256, steps=20_000,
                            learning_rate=5e-4, vocab=8000),
    'toy': Scale(layers=2, hidden=32, heads=2, mlp=64, batch=8, steps=6, learning_rate=3e-3,
                 vocab=500, train_len=16, eval_tokens=256, lengths=(16, 32),
                 max_eval_batches=2),
}


def make_config(scale: Scale, variant: str, seed: int, data_dir: str = ''):
  config = train.default_config()
  m = config.model
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim = (scale.layers, scale.hidden,
                                                         scale.heads, scale.mlp)
  m.position_embedding = 'rope'
  m.max_len = scale.train_len  # unused under rope; kept equal to the training length
  m.dropout_rate = m.attention_dropout_rate = 0.1
  for key, value in VARIANTS[variant].items():
    m[key] = value
  d = config.data
  d.vocab_size, d.max_len = scale.vocab, scale.train_len
  d.max_predictions = max(1, math.ceil(0.15 * scale.train_len))
  d.eval_batches = 4
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


def accuracy_at_lengths(workdir: str, scale: Scale) -> dict[int, dict]:
  """MLM accuracy and loss of a trained workdir on the held-out split packed at each n."""
  run = train.load_workdir(workdir)
  model = MaskedLM(run.model_config)

  @jax.jit
  def sums(params, batch):
    logits = model.apply({'params': params}, batch['input_ids'], batch['input_mask'],
                         batch['segment_ids'], batch['masked_positions'])
    return mlm_loss_and_metrics(logits, batch['masked_ids'], batch['masked_weights'])[1]

  results = {}
  for length in scale.lengths:
    config = eval_data_config(run.config.data, length, scale.max_eval_batches)
    batch_size = max(1, scale.eval_tokens // length)
    totals, sequences = None, 0
    for batch in data.make_eval_iterator(config, batch_size):
      out = jax.device_get(sums(run.params, {k: jnp.asarray(v) for k, v in batch.items()}))
      totals = out if totals is None else {k: totals[k] + out[k] for k in out}
      sequences += int(np.sum(batch['input_mask'][:, 0]))
    weight = float(totals['mlm_weight'])
    results[length] = {'accuracy': float(totals['mlm_correct_sum']) / weight,
                       'loss': float(totals['mlm_loss_sum']) / weight,
                       'predictions': int(weight), 'sequences': sequences}
  return results


def train_one(scale: Scale, workdirs: str, data_dir: str, run: runs_lib.Run,
              report: runs_lib.Report) -> dict:
  workdir = os.path.join(workdirs, run.name)
  config = make_config(scale, run.params['variant'], run.params['seed'], data_dir)

  def on_log(step, stop, scalars):
    report(0.9 * step / stop, f'step {step}/{stop} loss {scalars["train/loss"]:.3f}')

  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'train.log'), 'a') as log, contextlib.redirect_stdout(log):
    final = train.train_and_evaluate(config, workdir, on_log=on_log)
  report(0.9, 'evaluating at ' + ', '.join(map(str, scale.lengths)))
  by_length = accuracy_at_lengths(workdir, scale)
  return {'workdir': workdir, 'final_train_length_eval': final,
          'by_length': {str(n): r for n, r in by_length.items()}}


def grid(seeds=SEEDS) -> list[runs_lib.Run]:
  return [runs_lib.Run(f'{SLUGS[variant]}-s{seed}', dict(variant=variant, seed=seed))
          for variant in VARIANTS for seed in seeds]


def summarise(results: dict, scale: Scale, seeds=SEEDS) -> dict:
  table = {}
  for variant in VARIANTS:
    table[variant] = {}
    for n in scale.lengths:
      values = [results[f'{SLUGS[variant]}-s{s}']['by_length'][str(n)]['accuracy']
                for s in seeds if f'{SLUGS[variant]}-s{s}' in results]
      table[variant][str(n)] = stats.mean_ci(values).as_dict() if values else None
  # Does Attention-E extrapolate better? Paired by seed (same data order and init).
  comparisons = {}
  for base, other in (('O (standard)', 'E (entropy-invariant)'),
                      ('O + residual attention', 'E + residual attention'),
                      ('E (entropy-invariant)', 'E + residual attention'),
                      ('O (standard)', 'O + residual attention')):
    comparisons[f'{other} - {base}'] = {}
    for n in scale.lengths:
      a = [results.get(f'{SLUGS[other]}-s{s}') for s in seeds]
      b = [results.get(f'{SLUGS[base]}-s{s}') for s in seeds]
      if all(a) and all(b) and len(seeds) >= 2:
        diff = stats.paired_diff_ci([r['by_length'][str(n)]['accuracy'] for r in a],
                                    [r['by_length'][str(n)]['accuracy'] for r in b])
        comparisons[f'{other} - {base}'][str(n)] = dict(diff.as_dict(),
                                                        verdict=stats.interval_verdict(diff))
  return {'table': table, 'comparisons': comparisons}


def write_markdown(path: str, results: dict, summary: dict, scale: Scale, command: str,
                   seeds=SEEDS):
  fmt = lambda d: (stats.format_ci(stats.Summary(d['mean'], d['ci95_half_width'], d['n'], ()),
                                   2, 100) if d else 'n/a')
  any_run = next(iter(results.values()))
  sequences = {n: any_run['by_length'][str(n)]['sequences'] for n in scale.lengths}
  predictions = {n: any_run['by_length'][str(n)]['predictions'] for n in scale.lengths}
  lines = [
      '# Length extrapolation: Attention-O vs Attention-E, with and without residual attention',
      '',
      f'Regenerate: `{command}`. Rotary positions (RoFormer form), Post-LN BERT-style MLM, '
      f'{scale.layers} layers x {scale.hidden} hidden, {scale.heads} heads, FFN {scale.mlp}, '
      f'trained at n = {scale.train_len} for {scale.steps} steps of {scale.batch} sequences '
      f'(AdamW, peak learning rate {scale.learning_rate:g}, dropout 0.1), a {scale.vocab}-piece '
      'tokenizer, the embedded corpus. Evaluated on the held-out split packed at each n (15% '
      'of tokens predicted, masking seed fixed): '
      + ', '.join(f'n={n}: {sequences[n]} sequences, {predictions[n]} predictions'
                  for n in scale.lengths)
      + '. Cells: MLM accuracy (%), mean ± 95% Student-t half-width over seeds '
      f'{list(seeds)}; Su: RoFormer-small numbers (DESIGN.md section 3), one run, a larger '
      'model and corpus: compare shapes, not levels.',
      '',
      '| n | ' + ' | '.join(VARIANTS) + ' | Su O | Su E |',
      '|---' * (len(VARIANTS) + 3) + '|']
  for i, n in enumerate(scale.lengths):
    su = [f'{SU[v][i]:.2f}' if n in LENGTHS and i < len(SU[v]) else '' for v in SU]
    lines.append(f'| {n} | ' + ' | '.join(fmt(summary['table'][v][str(n)]) for v in VARIANTS)
                 + ' | ' + ' | '.join(su) + ' |')
  lines += ['', '## Paired differences (percentage points, same seeds)', '',
            '| comparison | ' + ' | '.join(f'n={n}' for n in scale.lengths) + ' |',
            '|---' * (len(scale.lengths) + 1) + '|']
  for name, per_n in summary['comparisons'].items():
    cells = [(stats.format_ci(stats.Summary(d['mean'], d['ci95_half_width'], d['n'], ()), 2,
                              100) + f' ({d["verdict"]})') if d else 'n/a'
             for d in (per_n.get(str(n)) for n in scale.lengths)]
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  lines += ['', '![accuracy vs evaluation length](accuracy.png)', '']
  with open(path, 'w') as f:
    f.write('\n'.join(lines))


def write_plot(path: str, summary: dict, scale: Scale) -> bool:
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  colors = {'O (standard)': 'tab:blue', 'E (entropy-invariant)': 'tab:orange',
            'O + residual attention': 'tab:green', 'E + residual attention': 'tab:red'}
  fig, ax = plt.subplots(figsize=(8, 5))
  lengths = np.asarray(scale.lengths)
  for variant in VARIANTS:
    rows = [summary['table'][variant][str(n)] for n in scale.lengths]
    if not all(rows):
      continue
    mean = np.asarray([r['mean'] for r in rows]) * 100
    half = np.asarray([0 if math.isnan(r['ci95_half_width']) else r['ci95_half_width']
                       for r in rows]) * 100
    ax.plot(lengths, mean, marker='o', color=colors[variant], label=f'{variant} (ours)')
    ax.fill_between(lengths, mean - half, mean + half, color=colors[variant], alpha=0.2)
  for variant, values in SU.items():
    su_lengths = [n for n in LENGTHS if n in scale.lengths]
    if su_lengths:
      ax.plot(su_lengths, [values[LENGTHS.index(n)] for n in su_lengths], linestyle=':',
              color=colors[variant], label=f'{variant}, Su (RoFormer-small)')
  ax.set_xscale('log', base=2)
  ax.set_xticks(lengths, [str(n) for n in lengths])
  ax.axvline(scale.train_len, color='gray', linewidth=0.8)
  ax.set_xlabel('evaluation length n (trained at %d)' % scale.train_len)
  ax.set_ylabel('MLM accuracy (%)')
  ax.set_title('MLM accuracy vs evaluation length (band: 95% interval over seeds)')
  ax.legend(fontsize=8)
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
  parser.add_argument('--data_dir', default='')
  parser.add_argument('--seeds', default=','.join(map(str, SEEDS)))
  args = parser.parse_args(argv)
  scale_name = 'toy' if args.quick else args.scale
  scale = SCALES[scale_name]
  seeds = tuple(int(s) for s in args.seeds.split(','))
  os.makedirs(args.out, exist_ok=True)
  runs = [dataclasses.replace(r, cost=scale.steps) for r in grid(seeds)]
  results = runs_lib.Grid(args.out, runs).run(
      lambda run, report: train_one(scale, args.workdirs, args.data_dir, run, report))
  summary = summarise(results, scale, seeds)
  command = 'python -m experiments.length_extrapolation' + (
      '' if scale_name == 'cpu' else f' --scale={scale_name}')
  runs_lib.write_json(os.path.join(args.out, 'results.json'),
                      {'scale': dataclasses.asdict(scale), 'summary': summary, 'runs': results})
  write_markdown(os.path.join(args.out, 'results.md'), results, summary, scale, command, seeds)
  plotted = write_plot(os.path.join(args.out, 'accuracy.png'), summary, scale)
  print(f'wrote {os.path.join(args.out, "results.md")}'
        + (' and accuracy.png' if plotted else ''))
  return {'results': results, 'summary': summary}


if __name__ == '__main__':
  main(sys.argv[1:])

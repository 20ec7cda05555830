r"""Does RealFormer win? The RealFormer paper's comparisons in miniature, with seeds and intervals.

    python -m experiments.compare_layouts                    # CPU grid, ~2.5 h on one core
    python -m experiments.compare_layouts --runs='main-*,lr2x-post-*' &  # or split it over
    python -m experiments.compare_layouts --runs='lr2x-p*,lr2x-r*,dropout*'  # 2 cores, ~80 min
    python -m experiments.compare_layouts --scale=bert_small # the same grid at BERT-Small (GPU/TPU)
    python -m experiments.compare_layouts --quick --out=/tmp/cl   # toy smoke run, seconds

Trains Post-LN, Pre-LN, RealFormer (Post-LN + residual attention) and Pre-LN + residual
attention on the embedded corpus through the real pretraining loop (`train_and_evaluate`),
with the same recipe, budget and data order (a function of the seed only; for the same seed the
Post-LN-based layouts even start from the same weights, so per-seed differences are paired):

  main     every layout x seeds, the base learning rate, dropout 0.1      (claims 1, 4, Pre-LN + RA)
  lr2x     post / pre / realformer x seeds, twice the learning rate        (claim 2)
  dropout  post / pre / realformer x seeds, dropout 0.0 (and 0.2 above the cpu scale) (claim 3)

Half budget (claim 4) is read from the main runs' evaluation at half the steps (the learning
rate has then decayed only half-way, a handicap for the half-budget side). Divergence is data:
a non-finite loss ends the run, its step is recorded, and so is a run whose final eval loss is
above the unigram model's (it did not train). Finished runs are skipped when the command is run
again (experiments/runs.py); each run also resumes from its own checkpoints.

Writes to --out (default docs/results/compare_layouts/): results.md (tables: mean with 95%
Student-t interval and per-seed values, paired differences), curves.png, lr_dropout.png,
results.json (every number, per seed and per eval step), runs/*.json (one per finished run).
Workdirs (checkpoints, TensorBoard) go to --workdirs (default results/compare_layouts/): the
attention analysis reads them (experiments/attention_analysis.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import math
import os
import sys
from typing import Any

import ml_collections
import numpy as np

from experiments import runs as runs_lib
from experiments import stats
from realformer_jax import train
from realformer_jax.train import read_scalars

LAYOUTS = {  # name: model overrides
    'post': dict(ln_placement='post'),
    'pre': dict(ln_placement='pre'),
    'realformer': dict(ln_placement='realformer'),
    'pre+ra': dict(ln_placement='pre', residual_attention=True),
}
PAPER_LAYOUTS = ('post', 'pre', 'realformer')
SEEDS = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Scale:
  layers: int
  hidden: int
  heads: int
  mlp: int
  seq_len: int
  batch: int
  steps: int
  learning_rate: float
  vocab: int
  warmup_frac: float = 0.1
  evals: int = 8  # evaluations per run (every steps / evals)
  eval_batches: int = -1  # -1: the whole validation split
  dropout_rates: tuple = (0.0, 0.2)


SCALES = {
    # 2 CPU cores, one run per core: ~0.35 s a step, ~4 min a run, 39 runs in ~80 minutes.
    # Learning rate 1e-3: at 2e-3 Post-LN stays on the unigram plateau for 800 steps here (a
    # probe; that is what the lr2x group measures), at 1e-3 it leaves it by step ~300.
    'cpu': Scale(layers=4, hidden=128, heads=4, mlp=512, seq_len=64, batch=32, steps=600,
                 learning_rate=1e-3, vocab=2000, evals=6, eval_batches=16,
                 dropout_rates=(0.0, 0.2)),
    # BERT-Small (4/512/8/2048) at sequence 128: one accelerator, hours.
    'bert_small': Scale(layers=4, hidden=512, heads=8, mlp=2048, seq_len=128, batch=256,
                        steps=20_000, learning_rate=5e-4, vocab=8000),
    # The smoke test: seconds.
    'toy': Scale(layers=2, hidden=32, heads=2, mlp=64, seq_len=32, batch=8, steps=8,
                 learning_rate=3e-3, vocab=500, evals=2, eval_batches=2),
}


def grid(seeds=SEEDS, layouts=tuple(LAYOUTS),
         dropout_rates=(0.0, 0.2)) -> list[runs_lib.Run]:
  runs = []
  for layout in layouts:
    for seed in seeds:
      runs.append(runs_lib.Run(f'main-{layout}-s{seed}', dict(
          group='main', layout=layout, seed=seed, lr_scale=1.0, dropout=0.1)))
  for layout in (l for l in PAPER_LAYOUTS if l in layouts):
    for seed in seeds:
      runs.append(runs_lib.Run(f'lr2x-{layout}-s{seed}', dict(
          group='lr2x', layout=layout, seed=seed, lr_scale=2.0, dropout=0.1)))
  for rate in dropout_rates:
    for layout in (l for l in PAPER_LAYOUTS if l in layouts):
      for seed in seeds:
        runs.append(runs_lib.Run(f'dropout{rate}-{layout}-s{seed}', dict(
            group='dropout', layout=layout, seed=seed, lr_scale=1.0, dropout=rate)))
  return runs


def make_config(scale: Scale, params: dict, data_dir: str = '') -> ml_collections.ConfigDict:
  config = train.default_config()
  m = config.model
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim = (scale.layers, scale.hidden,
                                                         scale.heads, scale.mlp)
  m.max_len = scale.seq_len
  for key, value in LAYOUTS[params['layout']].items():
    m[key] = value
  m.dropout_rate = m.attention_dropout_rate = params['dropout']
  d = config.data
  d.vocab_size, d.max_len = scale.vocab, scale.seq_len
  d.max_predictions = max(1, math.ceil(0.15 * scale.seq_len))
  d.eval_batches = scale.eval_batches
  if data_dir:
    d.data_dir = data_dir
  t = config.train
  t.global_batch_size, t.num_train_steps = scale.batch, scale.steps
  t.warmup_steps = max(1, int(scale.warmup_frac * scale.steps))
  t.learning_rate = scale.learning_rate * params['lr_scale']
  t.log_every_steps = max(1, scale.steps // 20)
  t.eval_every_steps = max(1, scale.steps // scale.evals)
  t.checkpoint_every_steps = max(1, scale.steps // 4)
  t.keep_checkpoints = 1
  t.seed = params['seed']
  return config


def train_one(scale: Scale, workdirs: str, data_dir: str, run: runs_lib.Run,
              report: runs_lib.Report) -> dict:
  """Trains one run (resuming its workdir), returns its curves and final metrics."""
  workdir = os.path.join(workdirs, run.name)
  config = make_config(scale, run.params, data_dir)

  def on_log(step, stop, scalars):
    report(step / stop, f'step {step}/{stop} loss {scalars["train/loss"]:.3f}')

  os.makedirs(workdir, exist_ok=True)
  diverged_at = None
  with open(os.path.join(workdir, 'train.log'), 'a') as log, contextlib.redirect_stdout(log):
    try:
      final = train.train_and_evaluate(config, workdir, on_log=on_log)
    except train.TrainingError as error:  # divergence is a result, not a crash
      diverged_at = int(str(error).split(' at step ')[1].split(';')[0])
      final = None
  scalars = read_scalars(workdir)
  curve = lambda tag: [[int(s), float(v)] for s, v in scalars.get(tag, [])]
  result = {'workdir': workdir, 'diverged_at_step': diverged_at,
            'train_loss': curve('train/loss'), 'eval_loss': curve('eval/loss'),
            'eval_accuracy': curve('eval/mlm_accuracy'),
            'baseline_accuracy': (scalars.get('eval/baseline_mlm_accuracy') or [[0, math.nan]])
            [0][1], 'steps': scale.steps}
  if final is not None:
    result.update(final_eval_loss=final['eval/loss'], final_eval_accuracy=final['eval/mlm_accuracy'])
    half = [v for s, v in result['eval_accuracy'] if s == scale.steps // 2]
    half_loss = [v for s, v in result['eval_loss'] if s == scale.steps // 2]
    result.update(half_eval_accuracy=half[0] if half else math.nan,
                  half_eval_loss=half_loss[0] if half_loss else math.nan)
    # Did not train: worse than predicting the unigram distribution (log V bounds it above).
    result['failed_to_train'] = bool(final['eval/loss'] > math.log(scale.vocab))
  return result


# ------------------------------------------------------------------------------------------
# Analysis: tables, claims, plots.

def _rates(scale: Scale) -> tuple:
  """The dropout rates compared: the grid's, and 0.1 (the main runs)."""
  return tuple(sorted(set(scale.dropout_rates) | {0.1}))


def _values(results: dict, group: str, layout: str, key: str, rate=None) -> list[float]:
  out = []
  for seed in SEEDS:
    name = (f'{group}-{layout}-s{seed}' if group != 'dropout'
            else f'dropout{rate}-{layout}-s{seed}')
    if name in results and results[name].get(key) is not None:
      out.append(float(results[name][key]))
  return out


def _cell(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
  if not values:
    return 'n/a'
  s = stats.mean_ci(values)
  seeds = ', '.join(f'{v * scale:.{digits}f}' for v in values)
  return f'{stats.format_ci(s, digits, scale)} ({seeds})'


def _paired(results, group, a, b, key, rate=None) -> tuple[str, stats.Summary]:
  va, vb = _values(results, group, a, key, rate), _values(results, group, b, key, rate)
  if len(va) != len(vb) or len(va) < 2:
    return 'n/a', stats.Summary(math.nan, math.nan, 0, ())
  diff = stats.paired_diff_ci(va, vb)
  return f'{stats.format_ci(diff, 2, 100)} pt', diff


def analyse(results: dict, scale: Scale) -> dict:
  """Per-claim verdicts with their numbers (accuracies in percentage points)."""
  claims = {}
  # 1. Ranking RealFormer >= Post-LN >= Pre-LN (final eval MLM accuracy, main runs).
  d_rp = _paired(results, 'main', 'realformer', 'post', 'final_eval_accuracy')
  d_pp = _paired(results, 'main', 'post', 'pre', 'final_eval_accuracy')
  claims['1_ranking'] = {'realformer_minus_post': d_rp[1].as_dict(),
                         'post_minus_pre': d_pp[1].as_dict(),
                         'verdict': _ranking_verdict(d_rp[1], d_pp[1])}
  # 2. Doubled learning rate.
  lr = {}
  for layout in PAPER_LAYOUTS:
    diverged = [results.get(f'lr2x-{layout}-s{s}', {}).get('diverged_at_step') for s in SEEDS]
    failed = [did_not_train(results.get(f'lr2x-{layout}-s{s}', {})) for s in SEEDS]
    lr[layout] = {'diverged_at_step': diverged, 'did_not_train': failed,
                  'accuracy': _values(results, 'lr2x', layout, 'final_eval_accuracy')}
  post_broke = all(d is not None or f for d, f in zip(lr['post']['diverged_at_step'],
                                                       lr['post']['did_not_train']))
  others_trained = all(d is None and not f for layout in ('pre', 'realformer')
                       for d, f in zip(lr[layout]['diverged_at_step'],
                                       lr[layout]['did_not_train']))
  rf_gain = stats.paired_diff_ci(
      _values(results, 'lr2x', 'realformer', 'final_eval_accuracy'),
      _values(results, 'main', 'realformer', 'final_eval_accuracy')) if len(
          _values(results, 'lr2x', 'realformer', 'final_eval_accuracy')) == len(SEEDS) else None
  lr['realformer_lr2x_minus_lr1x'] = rf_gain.as_dict() if rf_gain else None
  lr['verdict'] = ('holds' if post_broke and others_trained else
                   'does not hold' if not post_broke else 'partly: Post-LN broke, but so did '
                   'another layout')
  claims['2_learning_rate'] = lr
  # 3. Dropout: RealFormer best at every rate.
  drop = {}
  for rate in _rates(scale):
    group = 'main' if rate == 0.1 else 'dropout'
    diffs = {}
    for other in ('post', 'pre'):
      va = _values(results, group, 'realformer', 'final_eval_accuracy', rate)
      vb = _values(results, group, other, 'final_eval_accuracy', rate)
      if len(va) == len(vb) >= 2:
        diffs[other] = stats.paired_diff_ci(va, vb)
    drop[str(rate)] = {k: v.as_dict() for k, v in diffs.items()}
    drop[str(rate)]['verdict'] = _best_verdict(diffs)
  verdicts = [drop[str(r)]['verdict'] for r in _rates(scale)]
  drop['verdict'] = ('holds' if all(v == 'holds' for v in verdicts) else
                     'does not hold' if any(v == 'does not hold' for v in verdicts) else
                     'inconclusive')
  claims['3_dropout'] = drop
  # 4. RealFormer at half the steps vs Post-LN at the full budget.
  half = _values(results, 'main', 'realformer', 'half_eval_accuracy')
  full = _values(results, 'main', 'post', 'final_eval_accuracy')
  if len(half) == len(full) >= 2:
    diff = stats.paired_diff_ci(half, full)
    claims['4_half_budget'] = {'realformer_half_minus_post_full': diff.as_dict(),
                               'verdict': {'higher': 'holds', 'lower': 'does not hold',
                                           'inconclusive': 'inconclusive (matches within '
                                           'the interval)'}[stats.interval_verdict(diff)]}
  # Su's question: residual attention on top of Pre-LN.
  d = _paired(results, 'main', 'pre+ra', 'pre', 'final_eval_accuracy')
  claims['pre_plus_residual_attention'] = {
      'pre_ra_minus_pre': d[1].as_dict(),
      'verdict': {'higher': 'helps', 'lower': 'hurts',
                  'inconclusive': 'inconclusive'}[stats.interval_verdict(d[1])]}
  return claims


def _baseline(results: dict) -> float:
  """The most-frequent-token accuracy on the eval set (the same for every run), or NaN."""
  return next((r['baseline_accuracy'] for r in results.values()
               if math.isfinite(r.get('baseline_accuracy', math.nan))), math.nan)


def did_not_train(run: dict) -> bool:
  """Loss above the unigram bound, or accuracy within 0.5 point of always predicting the most
  frequent token: the model never left the unigram plateau (a failure as real as a NaN)."""
  if run.get('failed_to_train'):
    return True
  accuracy, baseline = run.get('final_eval_accuracy'), run.get('baseline_accuracy', math.nan)
  return accuracy is not None and accuracy < baseline + 0.005


def _ranking_verdict(rf_minus_post: stats.Summary, post_minus_pre: stats.Summary) -> str:
  a, b = stats.interval_verdict(rf_minus_post), stats.interval_verdict(post_minus_pre)
  if 'lower' in (a, b):
    return 'does not hold'
  if a == b == 'higher':
    return 'holds'
  return 'inconclusive'


def _best_verdict(diffs: dict) -> str:
  verdicts = [stats.interval_verdict(d) for d in diffs.values()]
  if len(verdicts) < 2:
    return 'n/a'
  if all(v == 'higher' for v in verdicts):
    return 'holds'
  if any(v == 'lower' for v in verdicts):
    return 'does not hold'
  return 'inconclusive'


def write_markdown(path: str, results: dict, claims: dict, scale: Scale, command: str) -> None:
  lines = [
      '# Post-LN vs Pre-LN vs RealFormer, in miniature',
      '',
      f'Regenerate: `{command}`. Model: {scale.layers} layers x {scale.hidden} hidden, '
      f'{scale.heads} heads, FFN {scale.mlp}, sequence {scale.seq_len}, batch {scale.batch}, '
      f'{scale.steps} AdamW steps (peak learning rate {scale.learning_rate:g}, '
      f'{int(scale.warmup_frac * 100)}% warmup, linear decay to 0), dropout 0.1 unless stated, '
      f'a {scale.vocab}-piece tokenizer, the embedded corpus (World English Bible), MLM accuracy '
      + ('on the whole held-out split' if scale.eval_batches < 0 else
         f'on the first {scale.eval_batches} held-out batches (the same masked tokens for every '
         f'run: up to {scale.eval_batches * scale.batch * math.ceil(0.15 * scale.seq_len):,} '
         'predictions)') + '. Seeds 0, 1, 2: the same data order per seed for every '
      'layout. Cells: mean ± 95% Student-t half-width (per-seed values); differences are '
      'paired by seed.',
      '',
      '## Final eval MLM accuracy (%) and loss, main runs (claim 1, Pre-LN + RA)',
      '',
      '| layout | MLM accuracy (%) | eval loss | accuracy at half the steps (%) |',
      '|---|---|---|---|',
  ]
  for layout in LAYOUTS:
    lines.append(f'| {layout} | {_cell(_values(results, "main", layout, "final_eval_accuracy"))}'
                 f' | {_cell(_values(results, "main", layout, "final_eval_loss"), 1.0, 3)} | '
                 f'{_cell(_values(results, "main", layout, "half_eval_accuracy"))} |')
  baseline = _baseline(results)
  never_trained = sorted(name for name, run in results.items() if did_not_train(run))
  lines += ['', f'Most-frequent-token baseline: {baseline * 100:.2f}%. Runs that never left it '
            f'(final accuracy within 0.5 point of it): {", ".join(never_trained) or "none"}.',
            '',
            '## Doubled learning rate (claim 2)', '',
            '| layout | diverged at step (per seed) | stayed at the baseline (per seed) | '
            'MLM accuracy (%) |', '|---|---|---|---|']
  for layout in PAPER_LAYOUTS:
    info = claims['2_learning_rate'][layout]
    div = ', '.join('-' if d is None else str(d) for d in info['diverged_at_step'])
    stuck = ', '.join('yes' if f else 'no' for f in info['did_not_train'])
    lines.append(f'| {layout} | {div} | {stuck} | {_cell(info["accuracy"])} |')
  lines += ['', '## Dropout (claim 3): final eval MLM accuracy (%)', '',
            '| layout | ' + ' | '.join(f'dropout {r}' for r in _rates(scale)) + ' |',
            '|---|' + '---|' * len(_rates(scale))]
  for layout in PAPER_LAYOUTS:
    cells = [_cell(_values(results, 'main' if r == 0.1 else 'dropout', layout,
                           'final_eval_accuracy', r)) for r in _rates(scale)]
    lines.append(f'| {layout} | ' + ' | '.join(cells) + ' |')
  lines += ['', '## Claims', '', '| claim | measured | verdict at this scale |', '|---|---|---|']

  def fmt(d):
    return (stats.format_ci(stats.Summary(d['mean'], d['ci95_half_width'], d['n'], ()), 2, 100)
            + ' pt') if d else 'n/a'
  c = claims
  lines.append(f'| 1. RealFormer >= Post-LN >= Pre-LN | RealFormer - Post-LN '
               f'{fmt(c["1_ranking"]["realformer_minus_post"])}; Post-LN - Pre-LN '
               f'{fmt(c["1_ranking"]["post_minus_pre"])} | {c["1_ranking"]["verdict"]} |')
  lr = c['2_learning_rate']
  lines.append(f'| 2. at 2x learning rate Post-LN diverges, RealFormer and Pre-LN train (and '
               f'RealFormer improves) | Post-LN diverged at steps {lr["post"]["diverged_at_step"]}'
               f', stayed at the baseline {lr["post"]["did_not_train"]}; RealFormer 2x - 1x '
               f'{fmt(lr["realformer_lr2x_minus_lr1x"])} | '
               f'{lr["verdict"]} |')
  drop = c['3_dropout']
  parts = '; '.join(f'{r}: vs Post-LN {fmt(drop[r].get("post"))}, vs Pre-LN '
                    f'{fmt(drop[r].get("pre"))} ({drop[r]["verdict"]})' for r in map(str, _rates(scale)))
  lines.append(f'| 3. RealFormer best at every dropout rate | {parts} | {drop["verdict"]} |')
  if '4_half_budget' in c:
    lines.append(f'| 4. RealFormer at half the steps matches Post-LN at the full budget | '
                 f'RealFormer(half) - Post-LN(full) '
                 f'{fmt(c["4_half_budget"]["realformer_half_minus_post_full"])} | '
                 f'{c["4_half_budget"]["verdict"]} |')
  pre = c['pre_plus_residual_attention']
  lines.append(f'| Su: residual attention on Pre-LN | Pre-LN+RA - Pre-LN '
               f'{fmt(pre["pre_ra_minus_pre"])} | {pre["verdict"]} |')
  lines += ['', '![loss and accuracy curves](curves.png)', '',
            '![learning rate and dropout](lr_dropout.png)', '']
  with open(path, 'w') as f:
    f.write('\n'.join(lines))


def write_plots(out: str, results: dict, scale: Scale) -> list[str]:
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return []
  colors = {'post': 'tab:blue', 'pre': 'tab:green', 'realformer': 'tab:red',
            'pre+ra': 'tab:purple'}

  def band(ax, group, layout, key, scale_by=1.0, label=None, linestyle='-'):
    curves = [results[f'{group}-{layout}-s{s}'][key] for s in SEEDS
              if f'{group}-{layout}-s{s}' in results and results[f'{group}-{layout}-s{s}'][key]]
    if not curves:
      return
    n = min(len(c) for c in curves)
    steps = np.asarray([p[0] for p in curves[0][:n]])
    values = np.asarray([[p[1] for p in c[:n]] for c in curves]) * scale_by
    mean = values.mean(0)
    ax.plot(steps, mean, color=colors[layout], linestyle=linestyle, label=label or layout)
    if len(curves) > 1:
      ax.fill_between(steps, values.min(0), values.max(0), color=colors[layout], alpha=0.15)

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  for layout in LAYOUTS:
    band(axes[0], 'main', layout, 'train_loss')
    band(axes[1], 'main', layout, 'eval_loss')
    band(axes[2], 'main', layout, 'eval_accuracy', 100)
  baseline = _baseline(results)
  if math.isfinite(baseline):
    axes[2].axhline(baseline * 100, color='gray', linestyle=':', label='most frequent token')
  for ax, title in zip(axes, ('train MLM loss', 'eval MLM loss', 'eval MLM accuracy (%)')):
    ax.set_xlabel('step')
    ax.set_title(f'{title}: mean of {len(SEEDS)} seeds, band = min-max')
    ax.legend()
  axes[0].set_yscale('log')
  fig.tight_layout()
  paths = [os.path.join(out, 'curves.png')]
  fig.savefig(paths[0], dpi=110)
  plt.close(fig)

  fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
  for layout in PAPER_LAYOUTS:
    band(axes[0], 'main', layout, 'train_loss', label=f'{layout} lr x1')
    band(axes[0], 'lr2x', layout, 'train_loss', label=f'{layout} lr x2', linestyle='--')
  axes[0].set_yscale('log')
  axes[0].set_xlabel('step')
  axes[0].set_title('train MLM loss at the base and the doubled learning rate')
  axes[0].legend(fontsize=8)
  rates = _rates(scale)
  width = 0.25
  for i, layout in enumerate(PAPER_LAYOUTS):
    means, errors = [], []
    for rate in rates:
      values = _values(results, 'main' if rate == 0.1 else 'dropout', layout,
                       'final_eval_accuracy', rate)
      s = stats.mean_ci(values) if values else stats.Summary(math.nan, math.nan, 0, ())
      means.append(s.mean * 100)
      errors.append(0 if math.isnan(s.half_width) else s.half_width * 100)
    axes[1].bar(np.arange(len(rates)) + (i - 1) * width, means, width, yerr=errors, capsize=3,
                color=colors[layout], label=layout)
  axes[1].set_xticks(np.arange(len(rates)), [f'dropout {r}' for r in rates])
  axes[1].set_ylabel('final eval MLM accuracy (%)')
  low = min(v for v in axes[1].get_ylim())
  axes[1].set_title('dropout: mean and 95% interval over seeds')
  axes[1].legend()
  all_means = [p.get_height() for p in axes[1].patches if not math.isnan(p.get_height())]
  if all_means:
    axes[1].set_ylim(max(low, min(all_means) - 3), max(all_means) + 2)
  fig.tight_layout()
  paths.append(os.path.join(out, 'lr_dropout.png'))
  fig.savefig(paths[1], dpi=110)
  plt.close(fig)
  return paths


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', choices=sorted(SCALES), default='cpu')
  parser.add_argument('--quick', action='store_true', help='the toy scale: a smoke run')
  parser.add_argument('--out', default='docs/results/compare_layouts')
  parser.add_argument('--workdirs', default='results/compare_layouts')
  parser.add_argument('--data_dir', default='', help='TFDS data dir (default: the config\'s)')
  parser.add_argument('--runs', default='*', help='comma-separated glob patterns of run names '
                      'to train now (default all; e.g. "main-*"); the report uses every '
                      'finished run')
  args = parser.parse_args(argv)
  scale_name = 'toy' if args.quick else args.scale
  scale = SCALES[scale_name]
  os.makedirs(args.out, exist_ok=True)
  patterns = args.runs.split(',')
  runs = [dataclasses.replace(r, cost=scale.steps) for r in grid(dropout_rates=scale.dropout_rates)
          if any(fnmatch.fnmatch(r.name, p) for p in patterns)]
  command = 'python -m experiments.compare_layouts' + (
      '' if scale_name == 'cpu' else f' --scale={scale_name}')
  runs_lib.Grid(args.out, runs).run(
      lambda run, report: train_one(scale, args.workdirs, args.data_dir, run, report))
  # The report covers every finished run, also those of earlier invocations.
  every = runs_lib.Grid(args.out, grid(dropout_rates=scale.dropout_rates))
  results = {run.name: every.load(run) for run in every.runs if every.load(run) is not None}
  claims = analyse(results, scale)
  runs_lib.write_json(os.path.join(args.out, 'results.json'),
                      {'scale': dataclasses.asdict(scale), 'claims': claims, 'runs': results})
  write_markdown(os.path.join(args.out, 'results.md'), results, claims, scale, command)
  plots = write_plots(args.out, results, scale)
  print(f'wrote {os.path.join(args.out, "results.md")}' + (f' and {", ".join(plots)}'
                                                            if plots else ''))
  return {'results': results, 'claims': claims}


if __name__ == '__main__':
  main(sys.argv[1:])

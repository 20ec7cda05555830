r"""RealFormer vs Post-LN after fine-tuning, from pretrainings that learned masked-LM, with a
from-scratch control.

    python -m experiments.finetune_compare       # after the layouts study; ~45 min on 2 cores
    python -m experiments.finetune_compare --runs='*-s[02]' &   # split over 2 cores,
    python -m experiments.finetune_compare --runs='*-s1'          # one process each
    python -m experiments.finetune_compare --quick --layouts_results=/tmp/cl \
        --pretrained=/tmp/cl_runs

1. Starting points: the layouts study's (realformer_jax/studies/plans/layouts.py) Post-LN and
   RealFormer runs at r* (Post-LN's best peak rate; 12 layers x 64, RoPE) for pretraining seeds
   0, 1, 2, read from --pretrained and --layouts_results; the control is the same architecture
   (Post-LN) and tokenizer, randomly initialised.
2. Fine-tune each on bible_sections (which of 7 sections of the canon an ASV verse is from;
   test chapters shared with no other split): --train_examples evenly spaced training verses,
   --epochs epochs at peak rate --learning_rate, validation every epoch, the best checkpoint
   by validation accuracy scored on the test split. The fine-tuning seed is the pretraining
   seed, so RealFormer and Post-LN are paired by seed (same data order, and their
   pretrainings started from the same weights).
3. Report test accuracy and Matthews correlation per starting point (mean, 95% Student-t
   interval over seeds, per-seed values), the best checkpoint's step beside the last step (a
   best step that is the last one means training stopped too early), the paired differences
   RealFormer - Post-LN and pretrained - scratch, and the majority-class baseline.
Verdict of "RealFormer fine-tunes better" by the layout study's rule: "not testable at this
scale" when a pretraining did not learn masked-LM (study.learned), else holds / does not hold
when the 95% interval of the paired difference excludes 0 with the paper's / the opposite
sign, else inconclusive.

Writes to --out (default docs/results/finetune/): results.md, results.json,
test_accuracy.png, runs/*.json (one per finished run; a re-run skips them). Workdirs go to
--workdirs (default results/finetune_compare/); each run also resumes from its checkpoints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from realformer_jax import finetune, train
from realformer_jax.configs.finetune import bible_sections
from realformer_jax.studies import runs as runs_lib
from realformer_jax.studies import stats, study
from realformer_jax.studies.plans import layouts as layouts_plan
from realformer_jax.studies.report import LAYOUT_COLORS, LAYOUT_NAMES, seed_cell

STARTS = ('realformer', 'post', 'scratch')
NAMES = {**LAYOUT_NAMES, 'scratch': 'Post-LN from scratch'}
COLORS = {**LAYOUT_COLORS, 'scratch': 'tab:gray'}


def pretrained_run(args, layout: str, seed: int, rate: float) -> tuple[str, dict]:
  """(workdir, compare_layouts' run record) of one pretraining."""
  name = f'lr{rate:g}-{layout}-s{seed}'
  record = os.path.join(args.layouts_results, 'runs', f'{name}.json')
  workdir = os.path.join(args.pretrained, name)
  if not os.path.exists(record) or not os.path.isdir(workdir):
    raise SystemExit(
      f'finetune_compare: {name} is not a finished run of the layouts study in '
      f'{args.layouts_results} / {args.pretrained}'
    )
  with open(record) as f:
    return os.path.abspath(workdir), json.load(f)


def finetune_config(args, start: str, seed: int, rate: float):
  """bible_sections from a pretraining workdir, or (scratch) the same architecture and
  tokenizer randomly initialised."""
  if start == 'scratch':
    workdir, _ = pretrained_run(args, 'post', seed, rate)
    model = train.load_workdir(workdir).model_config
    config = bible_sections.get_config()
    for key, value in dataclasses.asdict(model).items():
      config.model[key] = value
    config.data.vocab_file = os.path.join(workdir, 'tokenizer.model')
    config.data.vocab_size = model.vocab_size
  else:
    workdir, _ = pretrained_run(args, start, seed, rate)
    config = bible_sections.get_config(f'init={workdir}')
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.1
  config.train.seed = seed
  config.train.learning_rate = args.learning_rate
  config.finetune.num_epochs = args.epochs
  config.data.max_examples = args.train_examples
  if args.quick:
    config.data.max_len = 32
    config.train.global_batch_size = 8
    config.train.log_every_steps = 2
  return config


def grid(seeds) -> list[runs_lib.Run]:
  return [
    runs_lib.Run(f'{start}-s{seed}', {'start': start, 'seed': seed})
    for seed in seeds
    for start in STARTS
  ]


def train_one(args, rate: float, run: runs_lib.Run, report: runs_lib.Report) -> dict:
  def on_log(step, stop, scalars):
    report(step / stop, f'step {step}/{stop} loss {scalars["train/loss"]:.3f}')

  start, seed = run.params['start'], run.params['seed']
  config = finetune_config(args, start, seed, rate)
  workdir = os.path.join(args.workdirs, run.name)
  result = finetune.run(config, workdir, on_log=on_log)
  if result.get('preempted'):
    raise SystemExit(f'{workdir}: stopped by SIGTERM; run the same command again to resume')
  scalars = train.read_scalars(workdir)
  pretraining = {}
  if start != 'scratch':
    _, record = pretrained_run(args, start, seed, rate)
    pretraining = {
      'run': record['run'],
      'learned': bool(record.get('learned')),
      'final': record.get('final'),
      'floors': record.get('floors'),
    }
  return {
    'workdir': workdir,
    'pretraining': pretraining,
    # The schedule's last step (fine-tuning sets it from the epochs; evaluated at its end).
    'last_step': max((int(s) for s, _ in scalars.get('eval/accuracy', [])), default=0),
    'validation_accuracy': [[int(s), float(v)] for s, v in scalars.get('eval/accuracy', [])],
    **{
      k: float(v)
      for k, v in result.items()
      if k.startswith(('test/', 'best/', 'eval/', 'baseline')) or k == 'best_step'
    },
  }


def summarize(results: dict, seeds, args, rate: float) -> dict:
  summary = {
    'settings': {
      'seeds': list(seeds),
      'train_examples': args.train_examples,
      'epochs': args.epochs,
      'learning_rate': args.learning_rate,
      'pretraining_rate': rate,
      'quick': args.quick,
    },
    'starts': {},
    'differences': {},
  }
  for start in STARTS:
    runs = [results[f'{start}-s{s}'] for s in seeds if f'{start}-s{s}' in results]
    if not runs:
      continue
    summary['starts'][start] = {
      'seeds': [r['params']['seed'] for r in runs],
      'accuracy': stats.mean_ci([r['test/accuracy'] for r in runs]).as_dict(),
      'matthews_corrcoef': stats.mean_ci([r['test/matthews_corrcoef'] for r in runs]).as_dict(),
      'validation_accuracy': stats.mean_ci([r['best/eval/accuracy'] for r in runs]).as_dict(),
      'best_step': [int(r['best_step']) for r in runs],
      'last_step': [int(r['last_step']) for r in runs],
      'pretraining_learned': [r['pretraining'].get('learned') for r in runs],
      'pretraining_mask_accuracy': [
        (r['pretraining'].get('final') or {}).get('mask_accuracy') for r in runs
      ],
    }
  any_run = next(iter(results.values()))
  summary['majority'] = {  # the training split's most frequent section, scored on each split
    'accuracy': any_run['test/baseline_accuracy'],
    'matthews_corrcoef': any_run['test/baseline_matthews_corrcoef'],
    'validation_accuracy': any_run.get('baseline/accuracy'),
  }
  floors = next(
    (r['pretraining']['floors'] for r in results.values() if r['pretraining'].get('floors')), None
  )
  summary['pretraining_floors'] = floors
  for a, b, sign in (
    ('realformer', 'post', +1),
    ('realformer', 'scratch', +1),
    ('post', 'scratch', +1),
  ):
    paired = [s for s in seeds if f'{a}-s{s}' in results and f'{b}-s{s}' in results]
    if len(paired) < 2:
      continue
    row = {'seeds': paired, 'expected_sign': sign}
    for metric in ('accuracy', 'matthews_corrcoef'):
      diff = stats.paired_diff_ci(
        [results[f'{a}-s{s}'][f'test/{metric}'] for s in paired],
        [results[f'{b}-s{s}'][f'test/{metric}'] for s in paired],
      )
      row[metric] = diff.as_dict()
    learned = [
      results[f'{x}-s{s}']['pretraining'].get('learned', True)
      for x in (a, b)
      for s in paired
      if x != 'scratch'
    ]
    accuracy = stats.Summary(
      row['accuracy']['mean'], row['accuracy']['ci95_half_width'], len(paired), ()
    )
    row['verdict'] = (
      stats.interval_verdict(accuracy, sign) if all(learned) else 'not testable at this scale'
    )
    summary['differences'][f'{a} - {b}'] = row
  return summary


def write_report(summary: dict, results: dict, out: str, command: str) -> None:
  os.makedirs(out, exist_ok=True)
  runs_lib.write_json(os.path.join(out, 'results.json'), dict(summary, runs=results))
  s = summary['settings']

  def ci(d, scale=100.0):
    return stats.format_ci(
      stats.Summary(d['mean'], d['ci95_half_width'], d['n'], tuple(d['values'])), 2, scale
    )

  floors = summary['pretraining_floors'] or {}
  mask_floor = f' (floor {100 * floors["mask_accuracy"]:.2f})' if floors else ''
  lines = [
    '# Fine-tuning RealFormer vs Post-LN on the embedded task (bible_sections)',
    '',
    f"Regenerate: `{command}`. Starting points: the layouts study's Post-LN and RealFormer "
    f'runs at r* = {s["pretraining_rate"]:g} ({_describe(s["pretraining_scale"])}), '
    f'pretraining seeds {s["seeds"]}; the control: the same Post-LN architecture and '
    f'tokenizer, randomly initialised. Fine-tuning: {s["train_examples"]} training verses, '
    f'{s["epochs"]} epochs '
    f'at peak rate {s["learning_rate"]:g} (10% warmup, linear decay), validation every '
    'epoch, the best checkpoint by validation accuracy scored on the test chapters; '
    'fine-tuning seed = pretraining seed (paired). Mean ± 95% Student-t half-width over '
    'seeds (per-seed values).',
    '',
    f'| starting point | pretraining [MASK] accuracy (%){mask_floor} | test accuracy (%) | '
    'test Matthews '
    'corr. (%) | best validation accuracy (%) | best step / last step |',
    '|---|---|---|---|---|---|',
  ]
  for start, row in summary['starts'].items():
    mask = ', '.join(
      '-' if v is None else f'{100 * v:.2f}' for v in row['pretraining_mask_accuracy']
    )
    steps = ', '.join(f'{b}/{l}' for b, l in zip(row['best_step'], row['last_step']))
    lines.append(
      f'| {NAMES[start]} | {mask} | {seed_cell(row["accuracy"]["values"], scale=100)} | '
      f'{ci(row["matthews_corrcoef"])} | {ci(row["validation_accuracy"])} | '
      f'{steps} |'
    )
  validation_majority = summary['majority'].get('validation_accuracy')
  lines.append(
    f'| majority class (of the training split) | | {100 * summary["majority"]["accuracy"]:.2f} | '
    f'{100 * summary["majority"]["matthews_corrcoef"]:.2f} | '
    f'{"" if validation_majority is None else f"{100 * validation_majority:.2f}"} | |'
  )
  if floors:
    learned = all(
      all(row['pretraining_learned']) for k, row in summary['starts'].items() if k != 'scratch'
    )
    lines += [
      '',
      f"Pretraining's floor at [MASK] is the most frequent token, "
      f'{100 * floors["mask_accuracy"]:.2f}% (the token is hidden there, so copying it is no '
      'rule); '
      + (
        "every pretraining above learned masked-LM by the layout study's definition."
        if learned
        else 'a pretraining above did NOT learn masked-LM (verdicts: not testable).'
      ),
    ]
  lines += [
    '',
    '| difference (paired by seed) | test accuracy (points) | Matthews corr. '
    '(points) | verdict (accuracy) |',
    '|---|---|---|---|',
  ]
  for name, row in summary['differences'].items():
    a, b = name.split(' - ')
    lines.append(
      f'| {NAMES[a]} - {NAMES[b]} | {ci(row["accuracy"])} | '
      f'{ci(row["matthews_corrcoef"])} | {row["verdict"]} |'
    )
  lines += ['', '![test accuracy per seed; validation accuracy per epoch](test_accuracy.png)', '']
  with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write('\n'.join(lines))
  _plot(summary, results, os.path.join(out, 'test_accuracy.png'))


def _describe(scale: dict) -> str:
  if not scale:
    return 'scale unknown'
  return (
    f'{scale["layers"]} layers x {scale["hidden"]}, {scale["position_embedding"]} '
    f'positions, {scale["steps"]} steps'
  )


def _plot(summary: dict, results: dict, path: str) -> None:
  plt = study.pyplot()
  if plt is None:
    print('matplotlib is not installed: no plot', file=sys.stderr)
    return
  fig, (ax, ax_val) = plt.subplots(1, 2, figsize=(12, 4.6))
  starts = list(summary['starts'])
  for x, start in enumerate(starts):
    row = summary['starts'][start]['accuracy']
    values = [100 * v for v in row['values']]
    ax.scatter(
      [x - 0.08] * len(values),
      values,
      color=COLORS[start],
      alpha=0.7,
      label='one seed' if x == 0 else None,
    )
    half = row['ci95_half_width']
    ax.errorbar(
      [x + 0.08],
      [100 * row['mean']],
      yerr=[[100 * half if half == half else 0]],
      fmt='o',
      color='black',
      capsize=5,
      label='mean, 95% interval' if x == 0 else None,
    )
  ax.axhline(
    100 * summary['majority']['accuracy'],
    color='black',
    linestyle=':',
    label='majority class (test split)',
  )
  ax.set_xticks(range(len(starts)), [NAMES[s] for s in starts])
  ax.set_xlim(-0.5, len(starts) - 0.5)
  ax.set_ylim(0, 100)
  ax.set_ylabel('test accuracy (%)')
  ax.set_title('bible_sections test accuracy, best checkpoint')
  ax.legend(loc='upper right', fontsize=8)
  for name, run in sorted(results.items()):
    study.plot_curve(
      ax_val,
      run.get('validation_accuracy') or [],
      marker='o',
      markersize=3,
      color=COLORS[run['params']['start']],
      alpha=0.7,
    )
  for start in starts:
    ax_val.plot([], [], color=COLORS[start], label=f'{NAMES[start]} (one line per seed)')
  validation_majority = summary['majority'].get('validation_accuracy')
  if validation_majority is not None:
    ax_val.axhline(
      100 * validation_majority,
      color='black',
      linestyle=':',
      label='majority class (validation split)',
    )
  ax_val.set_ylim(bottom=0)
  ax_val.set_xlabel('fine-tuning step (one evaluation per epoch)')
  ax_val.set_ylabel('validation accuracy (%)')
  ax_val.set_title('validation accuracy during fine-tuning')
  ax_val.legend(fontsize=8)
  study.save_figure(fig, path)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default='docs/results/finetune')
  parser.add_argument('--workdirs', default='results/finetune_compare')
  layouts_plan.add_reader_arguments(parser, '--pretrained')
  parser.add_argument('--seeds', default='0,1,2', help='pretraining = fine-tuning seeds')
  parser.add_argument(
    '--train_examples',
    type=int,
    default=2400,
    help='training verses (evenly spaced; -1: all 24,692)',
  )
  parser.add_argument('--epochs', type=float, default=16)
  parser.add_argument('--learning_rate', type=float, default=5e-4)
  parser.add_argument('--runs', default='*', help='glob patterns of the runs to train now')
  parser.add_argument('--quick', action='store_true', help='toy sizes: a smoke run')
  args = parser.parse_args(argv)
  if args.quick:
    args.train_examples, args.epochs = 64, 2
  star, _, scale = layouts_plan.decisions(args.layouts_results)
  rate = args.rate if args.rate is not None else star
  if rate is None:
    parser.error(
      f'no r* in {args.layouts_results}/results.json: run the layouts study first '
      '(python -m experiments.study --plan=layouts), or pass --rate'
    )
  seeds = [int(s) for s in args.seeds.split(',')]
  runs = grid(seeds)
  runs_lib.Grid(args.out, study.selected(runs, args.runs)).run(
    lambda run, report: train_one(args, rate, run, report)
  )
  results = runs_lib.load_results(args.out, runs)
  if not results:
    raise SystemExit('finetune_compare: no finished run yet')
  summary = summarize(results, seeds, args, rate)
  summary['settings']['pretraining_scale'] = scale
  command = 'python -m experiments.finetune_compare' + (' --quick' if args.quick else '')
  write_report(summary, results, args.out, command)
  print(open(os.path.join(args.out, 'results.md')).read())
  return summary


if __name__ == '__main__':
  main(sys.argv[1:])

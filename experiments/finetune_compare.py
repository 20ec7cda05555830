r"""RealFormer vs Post-LN after fine-tuning: the README's tiny pretraining run and its Post-LN
twin, each fine-tuned on the embedded task (bible_sections) with several fine-tuning seeds.

    python -m experiments.finetune_compare                     # ~30-40 min on 2 CPU cores
    python -m experiments.finetune_compare --quick --out=/tmp/fc --workdirs=/tmp/fc_runs

1. Pretrain configs/tiny.py (RealFormer) and the same with model.ln_placement=post, exactly as
   `python -m experiments.train --config=configs/tiny.py` (600 steps, pretraining seed 0 for
   both: one pretraining per layout; the pretraining seed does not vary).
2. Fine-tune each on bible_sections (configs/finetune/bible_sections.py:init=<workdir>) with
   fine-tuning seeds 0, 1, 2 (classifier init, dropout and data order), --train_examples
   evenly spaced training verses, --epochs epochs; the best checkpoint by validation accuracy
   is evaluated on the test split (chapters shared with neither).
3. Report test accuracy (and Matthews correlation): mean with a 95% Student-t interval per
   layout, per-seed values, the paired difference RealFormer - Post-LN by fine-tuning seed, and
   the majority-class baseline.

Writes to --out (default docs/results/finetune/): results.md, results.json, test_accuracy.png,
runs/*.json (one per finished run; a re-run skips them). Workdirs go to --workdirs (default
results/finetune_compare/); each pretraining and fine-tuning run also resumes from its own
checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from configs import tiny
from configs.finetune import bible_sections
from experiments import runs as runs_lib
from experiments import stats
from realformer_jax import finetune, train

LAYOUTS = ('realformer', 'post')
PRETRAIN_STEPS = 600  # configs/tiny.py


def _pretrain_config(layout: str, data_dir: str, quick: bool):
  config = tiny.get_config()
  config.model.ln_placement = layout
  if data_dir:
    config.data.data_dir = data_dir
  if quick:
    for section, field, value in (('model', 'hidden_size', 32), ('model', 'mlp_dim', 64),
                                  ('model', 'num_heads', 2), ('data', 'vocab_size', 500),
                                  ('data', 'max_len', 32), ('model', 'max_len', 32),
                                  ('data', 'max_predictions', 5), ('data', 'eval_batches', 1),
                                  ('train', 'global_batch_size', 8),
                                  ('train', 'num_train_steps', 4), ('train', 'warmup_steps', 1),
                                  ('train', 'log_every_steps', 2),
                                  ('train', 'eval_every_steps', 4),
                                  ('train', 'checkpoint_every_steps', 4)):
      config[section][field] = value
  return config


def _finetune_config(pretrain_workdir: str, seed: int, args):
  config = bible_sections.get_config(f'init={pretrain_workdir}')
  config.train.seed = seed
  config.finetune.num_epochs = args.epochs
  config.data.max_examples = args.train_examples
  if args.quick:
    config.data.max_len = 32
    config.train.global_batch_size = 8
    config.train.log_every_steps = 2
  return config


def grid(seeds, train_examples: int, epochs: float) -> list[runs_lib.Run]:
  runs = [runs_lib.Run(f'pretrain-{layout}', {'stage': 'pretrain', 'layout': layout},
                       cost=PRETRAIN_STEPS * 4) for layout in LAYOUTS]
  steps = epochs * train_examples / 32
  runs += [runs_lib.Run(f'finetune-{layout}-s{seed}',
                        {'stage': 'finetune', 'layout': layout, 'seed': seed}, cost=steps)
           for layout in LAYOUTS for seed in seeds]
  return runs


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default='docs/results/finetune')
  parser.add_argument('--workdirs', default='results/finetune_compare')
  parser.add_argument('--data_dir', default='', help='TFDS data dir of the pretraining corpus')
  parser.add_argument('--seeds', default='0,1,2', help='fine-tuning seeds')
  parser.add_argument('--train_examples', type=int, default=12000,
                      help='training verses (evenly spaced; -1: all 24,692)')
  parser.add_argument('--epochs', type=float, default=2)
  parser.add_argument('--quick', action='store_true', help='toy sizes: a smoke run')
  args = parser.parse_args(argv)
  if args.quick:
    args.train_examples, args.epochs = 64, 1
  seeds = [int(s) for s in args.seeds.split(',')]

  def workdir(name: str) -> str:
    return os.path.join(args.workdirs, name)

  def train_one(run: runs_lib.Run, report) -> dict:
    def on_log(step, stop, scalars):
      report(step / stop, f'step {step}/{stop} loss {scalars["train/loss"]:.3f}')
    params = run.params
    if params['stage'] == 'pretrain':
      result = train.train_and_evaluate(
          _pretrain_config(params['layout'], args.data_dir, args.quick), workdir(run.name),
          on_log=on_log)
      return {'eval_mlm_accuracy': result['eval/mlm_accuracy'],
              'mlm_baseline': result['baseline'], 'step': result['step']}
    config = _finetune_config(os.path.abspath(workdir(f'pretrain-{params["layout"]}')),
                              params['seed'], args)
    result = finetune.run(config, workdir(run.name), on_log=on_log)
    return {k: float(v) for k, v in result.items()
            if k.startswith(('test/', 'best/', 'eval/', 'baseline')) or k == 'best_step'}

  results = runs_lib.Grid(args.out, grid(seeds, args.train_examples, args.epochs)).run(train_one)
  summary = summarize(results, seeds, args)
  write_report(summary, args.out)
  print(open(os.path.join(args.out, 'results.md')).read())
  return summary


def summarize(results: dict, seeds, args) -> dict:
  summary = {'settings': {'seeds': list(seeds), 'train_examples': args.train_examples,
                          'epochs': args.epochs, 'quick': args.quick,
                          'pretrain_steps': PRETRAIN_STEPS},
             'pretrain': {layout: results[f'pretrain-{layout}'] for layout in LAYOUTS},
             'metrics': {}}
  for metric in ('accuracy', 'matthews_corrcoef'):
    per_layout = {layout: [results[f'finetune-{layout}-s{s}'][f'test/{metric}'] for s in seeds]
                  for layout in LAYOUTS}
    diff = stats.paired_diff_ci(per_layout['realformer'], per_layout['post'])
    summary['metrics'][metric] = {
        **{layout: stats.mean_ci(values).as_dict() for layout, values in per_layout.items()},
        'realformer_minus_post': diff.as_dict(), 'verdict': stats.interval_verdict(diff),
        'baseline': results[f'finetune-post-s{seeds[0]}'][f'test/baseline_{metric}'],
        'validation': {layout: stats.mean_ci(
            [results[f'finetune-{layout}-s{s}'][f'best/eval/{metric}'] for s in seeds]).as_dict()
                       for layout in LAYOUTS},
    }
  return summary


def write_report(summary: dict, out: str) -> None:
  os.makedirs(out, exist_ok=True)
  runs_lib.write_json(os.path.join(out, 'results.json'), summary)
  acc = summary['metrics']['accuracy']
  mcc = summary['metrics']['matthews_corrcoef']
  s = summary['settings']

  def ci(d, scale=100.0):
    return stats.format_ci(stats.Summary(d['mean'], d['ci95_half_width'], d['n'],
                                         tuple(d['values'])), 2, scale)

  lines = [
      '# Fine-tuning RealFormer vs Post-LN on the embedded task (bible_sections)',
      '',
      f'Pretraining: configs/tiny.py ({s["pretrain_steps"]} steps) per layout, pretraining '
      f'seed 0 for both. Fine-tuning: bible_sections (7-way section of an ASV verse), '
      f'{s["train_examples"]} training verses, {s["epochs"]} epochs, seeds {s["seeds"]}; the '
      'best checkpoint by validation accuracy, scored on the test chapters. Mean with 95% '
      'Student-t interval over fine-tuning seeds.',
      '',
      '| layout | pretraining eval MLM accuracy | test accuracy (%) | test Matthews corr. (%) '
      '| validation accuracy (%) | per-seed test accuracy (%) |',
      '|---|---:|---:|---:|---:|---|',
  ]
  for layout in LAYOUTS:
    per_seed = ', '.join(f'{100 * v:.2f}' for v in acc[layout]['values'])
    lines.append(f'| {layout} | {summary["pretrain"][layout]["eval_mlm_accuracy"]:.4f} | '
                 f'{ci(acc[layout])} | {ci(mcc[layout])} | {ci(acc["validation"][layout])} | '
                 f'{per_seed} |')
  lines += [
      f'| majority class | | {100 * acc["baseline"]:.2f} | {100 * mcc["baseline"]:.2f} | | |',
      '',
      f'RealFormer - Post-LN, paired by fine-tuning seed: test accuracy '
      f'{ci(acc["realformer_minus_post"])} points ({acc["verdict"]}), Matthews correlation '
      f'{ci(mcc["realformer_minus_post"])} points ({mcc["verdict"]}).',
      '',
      '![test accuracy per seed](test_accuracy.png)',
      '',
  ]
  with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write('\n'.join(lines))
  _plot(summary, os.path.join(out, 'test_accuracy.png'))


def _plot(summary: dict, path: str) -> None:
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    print('matplotlib is not installed: no plot', file=sys.stderr)
    return
  acc = summary['metrics']['accuracy']
  fig, ax = plt.subplots(figsize=(5, 4))
  for x, layout in enumerate(LAYOUTS):
    values = [100 * v for v in acc[layout]['values']]
    ax.scatter([x] * len(values), values, color='tab:blue', alpha=0.6, label='seed' if x == 0
               else None)
    half = acc[layout]['ci95_half_width']
    ax.errorbar([x + 0.15], [100 * acc[layout]['mean']],
                yerr=[[100 * half if half == half else 0]], fmt='o', color='black', capsize=5,
                label='mean, 95% CI' if x == 0 else None)
  ax.axhline(100 * acc['baseline'], color='tab:red', linestyle='--', label='majority class')
  ax.set_xticks(range(len(LAYOUTS)), LAYOUTS)
  ax.set_xlim(-0.5, len(LAYOUTS) - 0.5)
  ax.set_ylabel('test accuracy (%)')
  ax.set_title('bible_sections after fine-tuning (tiny models)')
  ax.legend(loc='best', fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


if __name__ == '__main__':
  main()

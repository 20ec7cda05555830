"""The fine-tuning comparison's trainer and report (Plan.trainer and Plan.report 'finetune';
studies/plans/finetune_compare.py): a run fine-tunes bible_sections from one starting point
(a run of the pretraining plan at its r*, or that architecture randomly initialised), and the
report tables test accuracy and Matthews correlation per starting point beside the majority
class, with the plan's paired differences and their verdicts.

The plan's options: pretraining (the layouts Plan whose store and workdirs hold the runs),
starts ({variant: the layout it starts from, '' = random weights}), scratch_like (that
control's layout), names and colors (per variant), train_examples, epochs, batch, quick.
"""

from __future__ import annotations

import dataclasses
import json
import os

from realformer_jax import finetune
from realformer_jax import train as train_lib
from realformer_jax.configs.finetune import bible_sections
from realformer_jax.studies import stats, study
from realformer_jax.studies.plan import Plan
from realformer_jax.studies.plans import layouts as layouts_plan
from realformer_jax.studies.report import seed_cell, write_lines, write_results


def pretraining_rate(plan: Plan) -> float:
  """r* of the pretraining plan, from its report (one error line before it reported)."""
  pretraining = plan.options['pretraining']
  star, _, _ = layouts_plan.decisions(pretraining.out)
  if star is None:
    raise SystemExit(
      f'error: no r* in {pretraining.out}/results.json: run the layouts study first '
      '(python -m experiments.study --plan=layouts)'
    )
  return star


def pretrained_run(plan: Plan, layout: str, seed: int) -> tuple[str, dict]:
  """(workdir, run record) of the pretraining of `layout` and `seed` at r* (one error line, before
  anything compiles, where it has not finished)."""
  pretraining = plan.options['pretraining']
  rate = pretraining_rate(plan)
  name = pretraining.run_name(layout, rate, pretraining.scale.steps, seed)
  store = pretraining.store or pretraining.out
  record = os.path.join(store, 'runs', f'{name}.json')
  workdir = os.path.join(pretraining.workdirs, name)
  if not os.path.exists(record) or not os.path.isdir(workdir):
    raise SystemExit(
      f'error: {name} is not a finished run of the layouts study in {store} / {workdir}'
    )
  with open(record) as f:
    return os.path.abspath(workdir), json.load(f)


def finetune_config(plan: Plan, start: str, seed: int, learning_rate: float):
  """bible_sections from a pretraining workdir, or (a start from no layout) the same
  architecture and tokenizer randomly initialised."""
  options = plan.options
  layout = options['starts'][start]
  if not layout:
    workdir, _ = pretrained_run(plan, options['scratch_like'], seed)
    model = train_lib.load_workdir(workdir).model_config
    config = bible_sections.get_config()
    for key, value in dataclasses.asdict(model).items():
      config.model[key] = value
    config.data.vocab_file = os.path.join(workdir, 'tokenizer.model')
    config.data.vocab_size = model.vocab_size
  else:
    workdir, _ = pretrained_run(plan, layout, seed)
    config = bible_sections.get_config(f'init={workdir}')
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.1
  config.train.seed = seed
  config.train.learning_rate = learning_rate
  config.train.global_batch_size = options['batch']
  config.finetune.num_epochs = options['epochs']
  config.data.max_examples = options['train_examples']
  if options['quick']:
    config.data.max_len = 32
    config.train.log_every_steps = 2
  return config


def train(plan: Plan, run, workdir: str, data_dir: str, report) -> dict:
  """Fine-tunes one start and seed (resuming its workdir); the task is embedded: no data_dir."""

  def on_log(step, stop, scalars):
    report(step / stop, f'step {step}/{stop} loss {scalars["train/loss"]:.3f}')

  start, seed = run.params['variant'], run.params['seed']
  config = finetune_config(plan, start, seed, run.params['learning_rate'])
  result = finetune.run(config, workdir, on_log=on_log)
  if result.get('preempted'):
    raise SystemExit(f'{workdir}: stopped by SIGTERM; run the same command again to resume')
  scalars = train_lib.read_scalars(workdir)
  pretraining = {}
  layout = plan.options['starts'][start]
  if layout:
    _, record = pretrained_run(plan, layout, seed)
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


def _runs(plan: Plan, start: str, results: dict) -> dict[int, dict]:
  """The finished runs of one start, by seed (runs stored before plans named the start
  'start' in their params: the name, not the params, finds them)."""
  arm = next(a for a in plan.all_arms() if a.variant == start)
  names = {s: plan.run_name(start, arm.rate, arm.steps, s) for s in arm.seeds}
  return {s: results[n] for s, n in names.items() if n in results}


def analyse(plan: Plan, results: dict) -> dict:
  """Per start: test accuracy and Matthews correlation over seeds, best and last steps, the
  pretraining's [MASK] accuracy; the majority class; the comparisons with their verdicts."""
  options, arms = plan.options, plan.all_arms()
  pretraining = options['pretraining']
  rate, _, scale = layouts_plan.decisions(pretraining.out)
  summary = {
    'settings': {
      'seeds': list(arms[0].seeds),
      'train_examples': options['train_examples'],
      'epochs': options['epochs'],
      'learning_rate': arms[0].rate,
      'pretraining_rate': rate,
      'pretraining_scale': scale,
    },
    'starts': {},
    'differences': {},
  }
  for arm in arms:
    runs = list(_runs(plan, arm.variant, results).values())
    if not runs:
      continue
    ci = lambda key: stats.mean_ci([r[key] for r in runs]).as_dict()
    summary['starts'][arm.variant] = {
      'seeds': [r['params']['seed'] for r in runs],
      'accuracy': ci('test/accuracy'),
      'matthews_corrcoef': ci('test/matthews_corrcoef'),
      'validation_accuracy': ci('best/eval/accuracy'),
      'best_step': [int(r['best_step']) for r in runs],
      'last_step': [int(r['last_step']) for r in runs],
      'pretraining_learned': [r['pretraining'].get('learned') for r in runs],
      'pretraining_mask_accuracy': [
        (r['pretraining'].get('final') or {}).get('mask_accuracy') for r in runs
      ],
    }
  if not results:
    return summary
  any_run = next(iter(results.values()))
  summary['majority'] = {  # the training split's most frequent section, scored on each split
    'accuracy': any_run['test/baseline_accuracy'],
    'matthews_corrcoef': any_run['test/baseline_matthews_corrcoef'],
    'validation_accuracy': any_run.get('baseline/accuracy'),
  }
  summary['pretraining_floors'] = next(
    (r['pretraining']['floors'] for r in results.values() if r['pretraining'].get('floors')), None
  )
  for comparison in plan.comparisons:
    a = _runs(plan, comparison.a.variant, results)
    b = _runs(plan, comparison.b.variant, results)
    paired = [s for s in comparison.seeds if s in a and s in b]
    if len(paired) < 2:
      continue
    row = {'seeds': paired, 'expected_sign': comparison.expected}
    for metric in plan.metrics:
      diff = stats.paired_diff_ci(
        [a[s][f'test/{metric}'] for s in paired], [b[s][f'test/{metric}'] for s in paired]
      )
      row[metric] = diff.as_dict()
      if metric == comparison.metric:
        verdict = stats.interval_verdict(diff, comparison.expected)
    learned = [r[s]['pretraining'].get('learned', True) for r in (a, b) for s in paired]
    row['verdict'] = verdict if all(learned) else 'not testable at this scale'
    summary['differences'][comparison.key] = row
  return summary


def write(plan: Plan, results: dict, analysis: dict, command: str) -> None:
  """results.json (the analysis and every run), results.md and test_accuracy.png in plan.out,
  once a run finished."""
  if not results:
    return
  os.makedirs(plan.out, exist_ok=True)
  plot = os.path.join(plan.out, 'test_accuracy.png')
  write_results(
    plan.out,
    dict(analysis, runs=results),
    lambda path: write_markdown(path, plan, analysis, command),
    lambda: [plot] if write_plot(plot, plan, results, analysis) else [],
  )


def _describe(scale: dict) -> str:
  if not scale:
    return 'scale unknown'
  return (
    f'{scale["layers"]} layers x {scale["hidden"]}, {scale["position_embedding"]} '
    f'positions, {scale["steps"]} steps'
  )


def write_markdown(path: str, plan: Plan, summary: dict, command: str) -> None:
  names, s = plan.options['names'], summary['settings']

  def ci(d, scale=100.0):
    return stats.format_ci(
      stats.Summary(d['mean'], d['ci95_half_width'], d['n'], tuple(d['values'])), 2, scale
    )

  floors = summary['pretraining_floors'] or {}
  mask_floor = f' (floor {100 * floors["mask_accuracy"]:.2f})' if floors else ''
  lines = [
    f'# {plan.title}',
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
      f'| {names[start]} | {mask} | {seed_cell(row["accuracy"]["values"], scale=100)} | '
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
    pretrained = [k for k, layout in plan.options['starts'].items() if layout]
    learned = all(all(summary['starts'][k]['pretraining_learned']) for k in pretrained)
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
  labels = {c.key: c.label for c in plan.comparisons}
  for key, row in summary['differences'].items():
    lines.append(
      f'| {labels[key]} | {ci(row["accuracy"])} | '
      f'{ci(row["matthews_corrcoef"])} | {row["verdict"]} |'
    )
  lines += ['', '![test accuracy per seed; validation accuracy per epoch](test_accuracy.png)', '']
  write_lines(path, lines)


def write_plot(path: str, plan: Plan, results: dict, summary: dict) -> bool:
  plt = study.pyplot()
  if plt is None:
    return False
  names, colors = plan.options['names'], plan.options['colors']
  fig, (ax, ax_val) = plt.subplots(1, 2, figsize=(12, 4.6))
  starts = list(summary['starts'])
  for x, start in enumerate(starts):
    row = summary['starts'][start]['accuracy']
    values = [100 * v for v in row['values']]
    ax.scatter(
      [x - 0.08] * len(values),
      values,
      color=colors[start],
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
  ax.set_xticks(range(len(starts)), [names[s] for s in starts])
  ax.set_xlim(-0.5, len(starts) - 0.5)
  ax.set_ylim(0, 100)
  ax.set_ylabel('test accuracy (%)')
  ax.set_title('bible_sections test accuracy, best checkpoint')
  ax.legend(loc='upper right', fontsize=8)
  for start in starts:
    for run in _runs(plan, start, results).values():
      study.plot_curve(
        ax_val,
        run.get('validation_accuracy') or [],
        marker='o',
        markersize=3,
        color=colors[start],
        alpha=0.7,
      )
    ax_val.plot([], [], color=colors[start], label=f'{names[start]} (one line per seed)')
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
  return True

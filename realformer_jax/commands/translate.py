r"""Does merged attention keep BLEU while decoding faster? WEB -> BBE, standard vs merged decoder.

    python -m experiments.translate --config=configs/translate.py        # 2 CPU cores, ~1 h
    python -m experiments.translate --config=configs/translate.py:gpu    # one GPU

For every seed and decoder ('standard': masked self-attention, cross-attention, FFN;
'merged': MAtt = AAN + cross-attention, FFN; both Post-LN with DS-Init) it trains one
encoder-decoder on the training books (the training loop, train/loop.py, with the translation
task: realformer_jax/seq2seq/trainer.py) and scores greedy and beam search on the held-out test
books with sacrebleu. Runs are a resumable grid (studies/runs.py): a finished run is never
trained again (a run is finished when its result file records this config's identity: the
same --out with a changed config, e.g. another learning rate or model, is refused in one line
rather than counting the old numbers), a finished workdir is only evaluated, and an
interrupted run (SIGTERM or Ctrl-C saves a checkpoint and stops the grid, exit status 143 or
130; 0 only when every run finished) resumes mid-run from its checkpoints. A run that diverges, or
another fault of the loop, ends the command with one `error:` line.

Decoding speed is measured after training, in this one process, for each seed's pair of
models: the same batch of test sources, each search compiled first, then the two decoders
timed alternately (`speed_repeats` calls each, the median kept). Two measures: 'to EOS' (the
real outputs: tokens produced / second) and 'fixed' (no EOS, every sequence runs to the
length limit: the per-step cost alone). The machine may be shared: compare the ratios, which
are measured interleaved, rather than the absolute numbers.

Writes to --out (default docs/results/translation/<config arg>): results.md (the table),
results.json (every number, per seed), bleu_speed.png, runs/*.json (one per finished run).
Workdirs (parameters, TensorBoard, test outputs) go to --workdirs (default
results/translation/<config arg>).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from realformer_jax.commands.cli import (
  CONFIG_HELP,
  define_print_config,
  fail,
  fail_after_training,
  parse_flags,
  print_config,
  quiet_logs,
)
from realformer_jax.config import ConfigError
from realformer_jax.data import DataError
from realformer_jax.seq2seq import config as seq2seq_config
from realformer_jax.seq2seq import data as data_lib
from realformer_jax.seq2seq import task as seq2seq_task
from realformer_jax.seq2seq import trainer as translation
from realformer_jax.seq2seq.model_config import Seq2SeqModelConfig
from realformer_jax.studies import runs as runs_lib
from realformer_jax.studies import stats
from realformer_jax.studies import study as study_lib
from realformer_jax.studies.report import seed_cell
from realformer_jax.train import preemption, run_identity
from realformer_jax.train.config import RunSpec
from realformer_jax.train.errors import TrainingError
from realformer_jax.workdir_layout import CONFIG_FILE

_CONFIG = config_flags.DEFINE_config_file(
  'config', 'configs/translate.py', f'configs/translate.py[:cpu|gpu]. {CONFIG_HELP}'
)
_PRINT_CONFIG = define_print_config()
_OUT = flags.DEFINE_string(
  'out', None, 'Results directory (default docs/results/translation/<config arg>).'
)
_WORKDIRS = flags.DEFINE_string(
  'workdirs', None, 'Run workdirs (default results/translation/<config arg>).'
)


@dataclasses.dataclass(frozen=True)
class Experiment:
  """The config's `experiment` section (configs/translate.py)."""

  decoders: tuple[str, ...]  # the two decoder kinds compared
  seeds: tuple[int, ...]
  speed_batch_size: int  # the first N test sources, one timed decoding call
  speed_repeats: int  # timed calls per decoder and search, interleaved

  def __post_init__(self):
    if len(self.decoders) != 2 or len(set(self.decoders)) != 2:
      raise ConfigError(f'experiment.decoders={tuple(self.decoders)!r}: name two decoder kinds')
    if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
      raise ConfigError(
        f'experiment.seeds={tuple(self.seeds)!r}: need two or more distinct seeds for an interval'
      )
    for field in ('speed_batch_size', 'speed_repeats'):
      if getattr(self, field) <= 0:
        raise ConfigError(f'experiment.{field}={getattr(self, field)!r}: must be positive')


@dataclasses.dataclass(frozen=True)
class Study:
  """The validated translation spec and the experiment around it."""

  spec: RunSpec
  experiment: Experiment
  config_dict: dict = dataclasses.field(default_factory=dict)  # the config as results.json has it

  model = property(lambda self: self.spec.model)
  data = property(lambda self: self.spec.data)
  train = property(lambda self: self.spec.train)
  decode = property(lambda self: self.spec.sections['decode'])


def validate_study(config) -> Study:
  """The one check of the experiment's config (ConfigError / DataError naming the field)."""
  spec = seq2seq_task.validate(config)
  x = config.experiment
  study = Study(
    spec,
    Experiment(tuple(x.decoders), tuple(x.seeds), x.speed_batch_size, x.speed_repeats),
    json.loads(json.dumps(config.to_dict())),
  )
  for kind in study.experiment.decoders:
    run_spec(study, {'decoder': kind, 'seed': 0})  # each decoder kind is a valid model
  return study


def grid(study: Study) -> list[runs_lib.Run]:
  """Seeds outermost, so an interrupted grid already holds whole pairs of decoders."""
  return [
    runs_lib.Run(
      f'{kind}-s{seed}', {'decoder': kind, 'seed': seed}, cost=study.train.num_train_steps
    )
    for seed in study.experiment.seeds
    for kind in study.experiment.decoders
  ]


def run_spec(study: Study, params: dict) -> RunSpec:
  spec = study.spec
  return spec.replace(
    model=spec.model.replace(decoder_attention=params['decoder']),
    train=spec.train.replace(seed=params['seed']),
  )


def run_record(study: Study, run: runs_lib.Run) -> dict:
  """What a run's result is a result of: its spec as config.json records it (the model, data,
  train and decode sections: a changed learning rate or model changes it) and its digest."""
  spec = json.loads(json.dumps(run_spec(study, run.params).to_dict()))
  return {'identity': run_identity.config_digest(spec), 'spec': spec}


def check_finished_runs(study: Study, out: str, workdirs: str, runs) -> None:
  """Before anything is trained: a result in `out` (runs/<name>.json) or a workdir in
  `workdirs` of the same run name but another config is one ConfigError line, so a changed
  config never counts the old numbers as its own (nor resumes or evaluates the old model).
  Result files written before identities were recorded count as this config's only if
  `out`'s results.json was written with this very config."""
  legacy_ok = _results_config(out) == study.config_dict
  for run in runs:
    record = run_record(study, run)
    path = os.path.join(out, 'runs', f'{run.name}.json')
    result = _read_json(path)
    if result is not None and result.get('identity') != record['identity']:
      if 'identity' not in result and legacy_ok:
        continue
      changed = (
        '; '.join(run_identity.config_differences(result['spec'], record['spec']))
        if isinstance(result.get('spec'), dict)
        else 'it records no config identity, and results.json was written with another config'
      )
      raise ConfigError(
        f'--out {out}: {path} is the result of another config ({changed}); use another --out '
        '(and --workdirs), or delete that result to train the run again'
      )
    saved = _read_json(os.path.join(workdirs, run.name, CONFIG_FILE))
    if isinstance(saved, dict) and saved != record['spec']:
      changed = '; '.join(run_identity.config_differences(saved, record['spec']))
      raise ConfigError(
        f'--workdirs {workdirs}: {os.path.join(workdirs, run.name)} holds run {run.name} of '
        f'another config ({changed}); use another --workdirs (and --out)'
      )


def _results_config(out: str):
  results = _read_json(os.path.join(out, 'results.json'))
  return results.get('config') if isinstance(results, dict) else None


def _read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise ConfigError(f'{path}: unreadable ({type(e).__name__}); delete it to redo that run')


def train_one(study, workdirs: str, run: runs_lib.Run, report: runs_lib.Report) -> dict:
  workdir = os.path.join(workdirs, run.name)
  os.makedirs(workdir, exist_ok=True)

  def on_log(step, stop, scalars):
    report(step / stop, f'step {step}/{stop} loss {scalars["train/loss"]:.3f}')

  with open(os.path.join(workdir, 'train.log'), 'a') as log, contextlib.redirect_stdout(log):
    trained = translation.train(run_spec(study, run.params), workdir, on_log=on_log)
  if trained.stopped_at is not None:
    # SIGTERM, Ctrl-C (or train.stop_at_step) ended it with a checkpoint: stop the grid (this
    # run must not get a result file); the same command resumes it.
    print(
      f'{workdir}: stopped at step {trained.stopped_at} of {study.train.num_train_steps} '
      '(checkpoint saved); run the same command again to resume',
      file=sys.stderr,
    )
    sys.exit(preemption.exit_status(trained.stopped_by) if trained.stopped_by else 1)
  report(1.0, 'trained; decoding the test books')
  result = {
    **run_record(study, run),
    'workdir': workdir,
    'history': trained.history,
    'num_params': int(sum(x.size for x in _leaves(trained.params))),
  }
  for search in ('greedy', 'beam'):
    scores = translation.evaluate_bleu(trained, 'test', search)
    with open(os.path.join(workdir, f'test_{search}.txt'), 'w') as f:
      f.write('\n'.join(scores.pop('hypotheses')) + '\n')
    result[f'test_bleu_{search}'] = scores['bleu']
    result[f'test_{search}_signature'] = scores['signature']
  result['final_dev_nll'] = trained.history['dev'][-1]['dev/nll']
  return result


def _leaves(tree):
  return jax.tree.leaves(tree)


def copy_baseline(study) -> float:
  """Test BLEU of copying the WEB source unchanged: what a model must beat."""
  from sacrebleu.metrics import BLEU  # pylint: disable=import-outside-toplevel

  test = data_lib.prepare(study.data).splits['test']
  return BLEU().corpus_score(test.source_texts, [test.references]).score


# ------------------------------------------------------------------------------------------
# Decoding speed.


def speed_batch(data: data_lib.TranslationData, study) -> dict:
  """The first speed_batch_size test sources (in order), padded like every decoding batch."""
  x = study.experiment
  length = study.data.bucket_lengths[-1]
  chosen = list(range(min(x.speed_batch_size, len(data.splits['test']))))
  source = np.zeros((x.speed_batch_size, length), np.int32)
  for row, i in enumerate(chosen):
    ids = np.append(data.splits['test'].sources[i][: length - 1], data.eos_id)
    source[row, : len(ids)] = ids
  return {'source': source, 'source_mask': (source > 0).astype(np.int32)}


def measure_speed(models: dict, batch: dict, repeats: int) -> dict:
  """{search: {measure: {decoder: tokens/s}}}: each decoder's median over `repeats` calls,
  the decoders timed alternately on the same batch after one compiling call each."""
  length = batch['source'].shape[1]
  out = {}
  for search in ('greedy', 'beam'):
    for measure in ('to_eos', 'fixed'):
      calls = {}
      for name, trained in models.items():
        # 'fixed': an EOS id no token has, so every sequence runs to the length limit.
        fn = translation.search_fn(
          trained, search, length, eos_id=-1 if measure == 'fixed' else None
        )
        tokens = np.asarray(
          jax.block_until_ready(fn(trained.params, batch['source'], batch['source_mask']))
        )
        calls[name] = (fn, trained.params, int((tokens != 0).sum()))
      times = {name: [] for name in models}
      for _ in range(repeats):
        for name, (fn, params, _) in calls.items():
          start = time.perf_counter()
          jax.block_until_ready(fn(params, batch['source'], batch['source_mask']))
          times[name].append(time.perf_counter() - start)
      out.setdefault(search, {})[measure] = {
        name: calls[name][2] / statistics.median(times[name]) for name in models
      }
  return out


def speed_all_seeds(study, workdirs: str) -> dict:
  """Per seed: the tokens/s of each decoder and the merged / standard ratios."""
  per_seed = {}
  for seed in study.experiment.seeds:
    models = {}
    for kind in study.experiment.decoders:
      run_cfg = run_spec(study, {'decoder': kind, 'seed': seed})
      with open(os.devnull, 'w') as sink, contextlib.redirect_stdout(sink):
        models[kind] = translation.train(run_cfg, os.path.join(workdirs, f'{kind}-s{seed}'))
    batch = speed_batch(models[study.experiment.decoders[0]].data, study)
    per_seed[seed] = measure_speed(models, batch, study.experiment.speed_repeats)
    print(
      f'speed seed {seed}: '
      + '; '.join(
        f'{search} {measure} ' + ' '.join(f'{k} {v:,.0f}' for k, v in values.items())
        for search, by_measure in per_seed[seed].items()
        for measure, values in by_measure.items()
      ),
      flush=True,
    )
  return per_seed


# ------------------------------------------------------------------------------------------
# Tables and plot.


# The verdict of a BLEU difference where a decoder does not beat copying the source.
NOT_TESTABLE = 'not testable at this scale (below copying the source)'


def analyse(study, results: dict, speed: dict, copy_source_bleu: float) -> dict:
  """BLEU and speed differences with their verdicts. The floor rule of every study here: a
  BLEU difference is 'not testable' unless every seed of both decoders beats copying the
  source."""
  seeds, (base, other) = study.experiment.seeds, study.experiment.decoders[:2]
  value = lambda kind, key: [results[f'{kind}-s{s}'][key] for s in seeds]
  summary = {'bleu': {}, 'speed': {}, 'per_seed': {}}
  for search in ('greedy', 'beam'):
    key = f'test_bleu_{search}'
    diff = stats.paired_diff_ci(value(other, key), value(base, key))
    learned = min(value(base, key) + value(other, key)) > copy_source_bleu
    summary['bleu'][search] = {
      base: stats.mean_ci(value(base, key)).as_dict(),
      other: stats.mean_ci(value(other, key)).as_dict(),
      f'{other}_minus_{base}': diff.as_dict(),
      'verdict': stats.interval_verdict(diff) if learned else NOT_TESTABLE,
    }
    for measure in ('to_eos', 'fixed'):
      per = {kind: [speed[s][search][measure][kind] for s in seeds] for kind in (base, other)}
      ratios = [o / b for o, b in zip(per[other], per[base])]
      ratio = stats.mean_ci(ratios)
      summary['speed'].setdefault(search, {})[measure] = {
        f'{base}_tokens_per_s': stats.mean_ci(per[base]).as_dict(),
        f'{other}_tokens_per_s': stats.mean_ci(per[other]).as_dict(),
        f'{other}_over_{base}': ratio.as_dict(),
        'verdict': ('faster' if ratio.low > 1 else 'slower' if ratio.high < 1 else 'inconclusive'),
      }
  summary['dev_nll'] = {
    kind: stats.mean_ci(value(kind, 'final_dev_nll')).as_dict() for kind in (base, other)
  }
  summary['num_params'] = {
    kind: results[f'{kind}-s{seeds[0]}']['num_params'] for kind in (base, other)
  }
  summary['train_seconds'] = {
    kind: stats.mean_ci(
      [results[f'{kind}-s{s}']['history']['train_seconds'] for s in seeds]
    ).as_dict()
    for kind in (base, other)
  }
  summary['copy_source_bleu'] = copy_source_bleu
  return summary


def results_markdown(study, config_arg: str, results: dict, summary: dict) -> str:
  seeds, (base, other) = study.experiment.seeds, study.experiment.decoders[:2]
  m, t, d = study.model, study.train, study.decode
  x = study.experiment
  value = lambda kind, key: [results[f'{kind}-s{s}'][key] for s in seeds]
  lines = [
    f'# WEB -> BBE: {base} vs {other} decoder (config `{config_arg}`)',
    '',
    f'Regenerate: `python -m experiments.translate --config=configs/translate.py'
    f'{"" if config_arg == "cpu" else ":" + config_arg}`. Mean ± 95% Student-t interval '
    f'over seeds {tuple(seeds)}, per-seed values in brackets.',
    '',
    f'Model: Post-LN, init={m.init}, {m.num_layers} encoder + {m.num_decoder_layers} '
    f'decoder layers, d={m.hidden_size}, {m.num_heads} heads, FFN {m.mlp_dim}, shared '
    f'vocabulary of {study.data.vocab_size}; {t.num_train_steps} steps of '
    f'~{study.data.tokens_per_batch} padded tokens, lr {t.learning_rate}, label smoothing '
    f'{t.label_smoothing}. Parameters: {base} {summary["num_params"][base]:,}, {other} '
    f'{summary["num_params"][other]:,}. Beam {d.beam_size}, length penalty alpha {d.alpha} '
    f'(GNMT); outputs limited to {d.length_ratio} x the padded source length.',
    '',
    '## Test BLEU (sacrebleu, held-out books)',
    '',
    f'| search | {base} | {other} | {other} - {base} (paired) | verdict |',
    '|---|---|---|---|---|',
  ]
  for search in ('greedy', 'beam'):
    key = f'test_bleu_{search}'
    s = summary['bleu'][search]
    diff = stats.Summary(
      **{
        k: v
        for k, v in zip(
          ('mean', 'half_width', 'n', 'values'),
          (
            s[f'{other}_minus_{base}']['mean'],
            s[f'{other}_minus_{base}']['ci95_half_width'],
            s[f'{other}_minus_{base}']['n'],
            (),
          ),
        )
      }
    )
    lines.append(
      f'| {search} | {seed_cell(value(base, key))} | {seed_cell(value(other, key))} | '
      f'{stats.format_ci(diff, 2)} | {s["verdict"]} |'
    )
  lines += [
    '',
    f'Copying the WEB source unchanged scores {summary["copy_source_bleu"]:.2f} '
    f'BLEU. Signature: `{results[f"{base}-s{seeds[0]}"]["test_beam_signature"]}`.',
    '',
    '## Decoding speed (tokens/s, this machine, medians of interleaved calls)',
    '',
    f'Batch: the first {x.speed_batch_size} test sources, padded to '
    f'{study.data.bucket_lengths[-1]} tokens; {x.speed_repeats} timed calls per decoder after '
    'compilation. `to EOS`: output tokens of the real translations per second; '
    '`fixed`: no EOS, every row decodes to the length limit (the per-step cost). The '
    'machine was shared with other jobs: absolute numbers vary, the ratios were '
    'measured interleaved.',
    '',
    f'| search | measure | {base} | {other} | {other} / {base} | verdict |',
    '|---|---|---|---|---|---|',
  ]
  for search in ('greedy', 'beam'):
    for measure in ('to_eos', 'fixed'):
      s = summary['speed'][search][measure]
      fmt = lambda d, digits=0: _fmt_summary(d, digits)
      lines.append(
        f'| {search} | {measure.replace("_", " ")} | '
        f'{fmt(s[f"{base}_tokens_per_s"])} | {fmt(s[f"{other}_tokens_per_s"])} | '
        f'{fmt(s[f"{other}_over_{base}"], 3)} | {s["verdict"]} |'
      )
  lines += ['', '## Training', '', '| decoder | final dev NLL | train seconds |', '|---|---|---|']
  for kind in (base, other):
    lines.append(
      f'| {kind} | {_fmt_summary(summary["dev_nll"][kind], 3)} | '
      f'{_fmt_summary(summary["train_seconds"][kind], 0)} |'
    )
  return '\n'.join(lines) + '\n'


def _fmt_summary(d: dict, digits: int) -> str:
  seeds = ', '.join(f'{v:,.{digits}f}' for v in d['values'])
  if math.isnan(d['ci95_half_width']):
    return f'{d["mean"]:,.{digits}f} ({seeds})'
  return f'{d["mean"]:,.{digits}f} ± {d["ci95_half_width"]:,.{digits}f} ({seeds})'


def plot(study, results: dict, summary: dict, path: str) -> None:
  plt = study_lib.pyplot()
  if plt is None:
    return
  seeds, kinds = study.experiment.seeds, study.experiment.decoders[:2]
  fig, (ax_bleu, ax_speed) = plt.subplots(1, 2, figsize=(10, 4))
  for offset, search in ((-0.2, 'greedy'), (0.2, 'beam')):
    for i, kind in enumerate(kinds):
      values = [results[f'{kind}-s{s}'][f'test_bleu_{search}'] for s in seeds]
      x = i + offset
      ax_bleu.scatter(
        [x] * len(values),
        values,
        color='C0' if search == 'greedy' else 'C1',
        label=search if i == 0 else None,
        zorder=3,
      )
      ax_bleu.errorbar(
        [x],
        [np.mean(values)],
        color='k',
        capsize=4,
        yerr=[summary['bleu'][search][kind]['ci95_half_width']],
      )
  if 'copy_source_bleu' in summary:  # what copying the WEB source scores
    ax_bleu.axhline(summary['copy_source_bleu'], color='gray', ls='--', label='copy the source')
  ax_bleu.set_xticks(range(len(kinds)), kinds)
  ax_bleu.set_ylabel('test BLEU')
  ax_bleu.set_title('BLEU per seed (mean ± 95% CI)')
  ax_bleu.legend()
  labels, means, errors = [], [], []
  for search in ('greedy', 'beam'):
    for measure in ('to_eos', 'fixed'):
      s = summary['speed'][search][measure][f'{kinds[1]}_over_{kinds[0]}']
      labels.append(f'{search}\n{measure.replace("_", " ")}')
      means.append(s['mean'])
      errors.append(0.0 if math.isnan(s['ci95_half_width']) else s['ci95_half_width'])
  ax_speed.bar(range(len(labels)), means, yerr=errors, capsize=4, color='C2')
  ax_speed.axhline(1.0, color='k', lw=0.8)
  ax_speed.set_xticks(range(len(labels)), labels)
  ax_speed.set_ylabel(f'tokens/s, {kinds[1]} / {kinds[0]}')
  ax_speed.set_title('Decoding speed ratio (mean ± 95% CI over seeds)')
  study_lib.save_figure(fig, path, dpi=120)


def _config_arg(argv) -> str:
  for arg in argv:
    if arg.startswith('--config=') and ':' in arg:
      return arg.split(':', 1)[1]
  return 'cpu'


def main(argv):
  if len(argv) > 1:  # e.g. configs/translate.py:gpu without --config=: never the default grid
    fail(f'unexpected arguments {argv[1:]}: every argument is a flag (--config=FILE[:arg], ...)')
  quiet_logs(libraries=True)
  config = _CONFIG.value
  if _PRINT_CONFIG.value:
    schemas = {
      'model': Seq2SeqModelConfig,
      'data': data_lib.TranslationDataConfig,
      'train': seq2seq_config.TranslationTrainConfig,
      'decode': seq2seq_config.DecodeConfig,
      'experiment': Experiment,
    }
    print_config(config, schemas)
    return
  arg = _config_arg(sys.argv)
  out = _OUT.value or os.path.join('docs', 'results', 'translation', arg)
  workdirs = _WORKDIRS.value or os.path.join('results', 'translation', arg)
  try:
    study = validate_study(config)
    check_finished_runs(study, out, workdirs, grid(study))
    data_lib.prepare(study.data)  # data errors before any training
  except (ConfigError, DataError) as e:
    fail(str(e))
  # Seeds of one decoder compile the same programs: the persistent cache compiles them once.
  jax.config.update(
    'jax_compilation_cache_dir', os.path.abspath(os.path.join(workdirs, 'jax_cache'))
  )
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  try:
    with preemption.return_on_preemption():  # SIGTERM: save, then stop the grid
      results = runs_lib.Grid(out, grid(study)).run(
        lambda run, report: train_one(study, workdirs, run, report)
      )
      speed = speed_all_seeds(study, workdirs)
  except (ConfigError, DataError) as e:  # e.g. a workdir that holds another model
    fail(str(e))
  except TrainingError as e:  # a non-finite loss, a failed save, a busy workdir...
    fail_after_training(str(e))
  summary = analyse(study, results, speed, copy_baseline(study))
  runs_lib.write_json(
    os.path.join(out, 'results.json'),
    {'config': config.to_dict(), 'summary': summary, 'speed_per_seed': speed, 'runs': results},
  )
  with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write(results_markdown(study, arg, results, summary))
  plot(study, results, summary, os.path.join(out, 'bleu_speed.png'))
  print(open(os.path.join(out, 'results.md')).read())


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

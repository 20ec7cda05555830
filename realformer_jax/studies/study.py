"""What every masked-LM study here shares: a scale (scale.py), its config, training one run
(resuming), scoring it against the context-free floors per sequence, command-line options and plot
helpers.

    scale = study.Scale(layers=12, hidden=64, heads=2, mlp=256, seq_len=64, batch=32,
                        steps=600, learning_rate=2e-3, vocab=2000)
    config = study.mlm_config(scale, seed=0, model=dict(ln_placement='realformer'))
    result = study.train_run(config, workdir, report)    # resumes; divergence is a result
    scored = study.score_workdir(workdir)                  # per-sequence sums + floors

The declared plans (studies/plans/, run by studies/runner.py) and the script finetune_compare
build their runs from these; runs.py runs a grid
resumably with a progress line, stats.py has the intervals. "Learned" has one definition
everywhere: eval loss below the copy-aware unigram loss
(`realformer_jax.mlm.metrics.failed_to_train`) and [MASK] accuracy above the most frequent
token's (`learned`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import math
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from realformer_jax import MaskedLM, data, train, workdir_layout
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data.tokenizers import CLS, MASK, SEP
from realformer_jax.mlm import metrics as mlm_metrics
from realformer_jax.model.losses import mlm_nll_and_correct
from realformer_jax.studies import machine
from realformer_jax.studies import runs as runs_lib
from realformer_jax.studies.scale import TOY, Scale  # noqa: F401  (study.TOY: the scripts')
from realformer_jax.train import checkpointing, pretrained, run_identity

# Per-sequence sums kept in a run's JSON for bootstrap intervals over eval sequences.
SEQUENCE_SUMS = (
  'count',
  'correct_sum',
  'loss_sum',
  'mask_count',
  'mask_correct_sum',
  'mask_loss_sum',
)


def mlm_config(
  scale: Scale,
  *,
  seed: int,
  model: Optional[Mapping[str, Any]] = None,
  learning_rate: Optional[float] = None,
  steps: Optional[int] = None,
  dropout: Optional[float] = None,
  data_dir: str = '',
) -> ml_collections.ConfigDict:
  """The pretraining config of one run: `scale`, then the run's own model fields and rate."""
  config = train.default_config()
  m = config.model
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim = (
    scale.layers,
    scale.hidden,
    scale.heads,
    scale.mlp,
  )
  m.max_len = scale.seq_len
  m.position_embedding = scale.position_embedding
  m.dropout_rate = m.attention_dropout_rate = scale.dropout if dropout is None else dropout
  for key, value in (model or {}).items():
    m[key] = value
  d = config.data
  d.vocab_size, d.max_len = scale.vocab, scale.seq_len
  d.max_predictions = max(1, math.ceil(0.15 * scale.seq_len))
  d.eval_batches = scale.eval_batches
  if data_dir:
    d.data_dir = data_dir
  if scale.tokenizer:
    d.vocab_file = scale.tokenizer
  t = config.train
  t.global_batch_size = scale.batch
  t.num_train_steps = steps or scale.steps
  t.warmup_steps = max(1, int(scale.warmup_frac * t.num_train_steps))
  t.learning_rate = learning_rate or scale.learning_rate
  t.log_every_steps = max(1, t.num_train_steps // 20)
  t.eval_every_steps = max(1, t.num_train_steps // scale.evals)
  t.checkpoint_every_steps = max(1, t.num_train_steps // 4)
  t.keep_checkpoints = 1
  t.seed = seed
  return config


def train_run(
  config: ml_collections.ConfigDict,
  workdir: str,
  report: runs_lib.Report,
  progress_share: float = 1.0,
) -> dict:
  """Trains (or resumes) one run in `workdir`, its console output in `workdir/train.log`.

  Returns the curves (train loss, eval loss, accuracy and [MASK] accuracy per eval step), the
  final eval metrics ('final', unprefixed), the floors of its eval set, whether it diverged
  (a non-finite loss ends the run: a result, not a crash) and whether it learned."""

  def on_log(step, stop, scalars):
    report(progress_share * step / stop, f'step {step}/{stop} loss {scalars["train/loss"]:.3f}')

  os.makedirs(workdir, exist_ok=True)
  diverged_at, final = None, None
  with open(os.path.join(workdir, 'train.log'), 'a') as log, contextlib.redirect_stdout(log):
    try:
      final = train.train_and_evaluate(config, workdir, on_log=on_log)
    except train.DivergenceError as error:
      diverged_at = error.step
  if final is not None and final.get('preempted'):
    # The loop saved a checkpoint on SIGTERM: stop the whole grid (this run is not finished,
    # so it must not get a result file); the same command resumes it.
    raise SystemExit(
      f'{workdir}: stopped by SIGTERM at step {final["step"]} (checkpoint '
      'saved); run the same command again to resume'
    )
  scalars = train.read_scalars(workdir)
  curve = lambda tag: resumed_curve(scalars.get(tag, []))
  floors = {
    name[len('eval/baseline_') :]: values[-1][1]
    for name, values in scalars.items()
    if name.startswith('eval/baseline_')
  }
  result = {
    'workdir': workdir,
    'steps': config.train.num_train_steps,
    'learning_rate': config.train.learning_rate,
    'diverged_at_step': diverged_at,
    'train_loss': curve('train/loss'),
    'eval_loss': curve('eval/loss'),
    'eval_accuracy': curve('eval/mlm_accuracy'),
    'eval_mask_accuracy': curve('eval/mask_accuracy'),
    'floors': floors,
  }
  if final is not None:
    result['final'] = {k.split('/', 1)[1]: v for k, v in final.items() if k.startswith('eval/')}
    result['floors'] = {
      k.split('/', 1)[1]: v for k, v in final.items() if k.startswith('baseline/')
    }
  result['learned'] = learned(result)
  result['origin'] = origin(workdir)
  return result


def origin(workdir: str) -> dict:
  """What a run's result came from: the identity of its latest checkpoint (run_identity: the
  checksum verdict, config, corpus and tokenizer digests) and the machine and software that
  trained it (studies.machine). A study pools runs trained on different days and machines:
  when two runs of one recipe disagree (the recipe checks), this says what differed."""
  steps = checkpointing.committed_steps(workdir_layout.checkpoints_dir(workdir))
  identity = None
  if steps:
    config = pretrained.read_config_json(workdir)
    identity = run_identity.of_checkpoint(workdir, steps[-1], config).to_dict()
    identity.pop('workdir')  # a path of the machine; the result names its workdir already
  return {'checkpoint': identity, 'machine': machine.machine_info()}


def learned(run: Mapping[str, Any]) -> bool:
  """The one definition: finished, and not at the context-free floors
  (mlm_metrics.below_floors: eval loss below the copy-aware unigram loss, [MASK] accuracy above
  the most frequent token's, the copy rule's accuracy at [MASK])."""
  final, floors = run.get('final'), run.get('floors') or {}
  if not final or 'copy_unigram_loss' not in floors:
    return False
  return not mlm_metrics.below_floors(final['loss'], final['mask_accuracy'], floors)


# ------------------------------------------------------------------------------------------
# Scoring a trained workdir per sequence.


def per_sequence_sums(
  model: MaskedLM,
  params: Any,
  batches: Iterable[dict],
  mask_id: int,
  extra: Optional[Callable[[dict, dict], dict]] = None,
) -> dict:
  """Per-sequence sums (mlm_metrics.per_row_sums) over `batches`, rows with no prediction
  (padding rows) dropped; `extra(intermediates, batch)` adds device sums (e.g. attention
  entropy) that are summed over all batches under 'extra'."""

  def forward(params, batch):
    logits, state = model.apply({'params': params}, *model_inputs(batch), mutable=['intermediates'])
    nll, correct = mlm_nll_and_correct(logits, batch['masked_ids'])
    return nll, correct, (extra(state['intermediates'], batch) if extra else {})

  forward = jax.jit(forward)
  rows, extras = [], None
  for batch in batches:
    nll, correct, more = jax.device_get(
      forward(params, {k: jnp.asarray(v) for k, v in batch.items()})
    )
    visible = mlm_metrics.visible_ids(batch['input_ids'], batch['masked_positions'])
    sums = mlm_metrics.per_row_sums(
      nll, correct, visible, batch['masked_ids'], batch['masked_weights'], mask_id
    )
    keep = sums['count'] > 0
    rows.append({k: v[keep] for k, v in sums.items()})
    extras = more if extras is None else jax.tree.map(np.add, extras, more)
  sums = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
  return {'sums': sums, 'extra': extras}


def score_workdir(
  workdir: str,
  data_config: Optional[ml_collections.ConfigDict] = None,
  batch_size: Optional[int] = None,
  extra: Optional[Callable[[dict, dict], dict]] = None,
  mask_draws: int = 1,
) -> dict:
  """A trained workdir on its own eval set (or `data_config`'s): metrics by kind, the floors
  of that set, and the per-sequence sums (SEQUENCE_SUMS) for bootstrap intervals.

  With `mask_draws` > 1 the held-out sequences are masked that many times (eval_mask_seed 0,
  1, ...; draw 0 is the one the training evaluations score) and each sequence's sums are added
  over the draws, so the sequence stays the unit the intervals resample while the masked
  positions multiply. Draw 0's sums are kept too ('first_draw_sequence_sums'), so a report
  can set the one-draw figure beside the many-draw one; the floors and `extra` are draw 0's."""
  if mask_draws < 1:
    raise ValueError(f'mask_draws={mask_draws}: must be at least 1')
  run = train.load_workdir(workdir)
  data_config = data.data_config(data_config or run.config.data)
  batch_size = batch_size or run.config.train.global_batch_size
  model = MaskedLM(run.model_config)
  draws = []
  for draw in range(mask_draws):
    masked = dataclasses.replace(data_config, eval_mask_seed=data_config.eval_mask_seed + draw)
    batches = data.make_eval_iterator(masked, batch_size)
    draws.append(
      per_sequence_sums(
        model, run.params, batches, run.tokenizer.mask_id, extra if draw == 0 else None
      )
    )
  if any(len(d['sums']['count']) != len(draws[0]['sums']['count']) for d in draws):
    raise ValueError(f'{workdir}: the mask draws kept different numbers of eval sequences')
  sums = {k: sum(d['sums'][k] for d in draws) for k in draws[0]['sums']}
  as_lists = lambda s: {k: np.round(s[k], 4).tolist() for k in SEQUENCE_SUMS}
  result = {
    'metrics': mlm_metrics.metrics_from_sums(sums),
    'floors': data.context_free_floors(data_config, batch_size),
    'sequences': int(len(sums['count'])),
    'sequence_sums': as_lists(sums),
  }
  if mask_draws > 1:
    result['mask_draws'] = mask_draws
    result['draw_metrics'] = [mlm_metrics.metrics_from_sums(d['sums']) for d in draws]
    result['first_draw_sequence_sums'] = as_lists(draws[0]['sums'])
  if draws[0]['extra'] is not None:
    result['extra'] = jax.tree.map(lambda x: np.asarray(x).tolist(), draws[0]['extra'])
  return result


def sequence_sums(run: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """A run's stored per-sequence sums as arrays."""
  return {k: np.asarray(v, np.float64) for k, v in run['scored']['sequence_sums'].items()}


# ------------------------------------------------------------------------------------------
# Command line.


def argument_parser(
  doc: str, *, out: str, workdirs: str, scales: Sequence[str]
) -> argparse.ArgumentParser:
  """A study's parser: `doc`'s first line as its description, and the common options."""
  parser = argparse.ArgumentParser(description=doc.split('\n')[0])
  add_common_arguments(parser, out=out, workdirs=workdirs, scales=scales)
  return parser


def add_common_arguments(
  parser: argparse.ArgumentParser, *, out: str, workdirs: str, scales: Sequence[str]
) -> None:
  """--scale, --quick, --out, --workdirs, --data_dir, --runs: the same in every study."""
  parser.add_argument('--scale', choices=sorted(scales), default='cpu')
  parser.add_argument('--quick', action='store_true', help='the toy scale: a smoke run')
  parser.add_argument('--out', default=out, help='tables, plots, results.json, runs/*.json')
  parser.add_argument('--workdirs', default=workdirs, help='checkpoints and TensorBoard files')
  parser.add_argument('--data_dir', default='', help="TFDS data dir (default: the config's)")
  parser.add_argument(
    '--runs',
    default='*',
    help='comma-separated glob patterns of the run '
    'names to train now (default all): split a grid over processes; the '
    'report uses every finished run',
  )


def scale_name(args: argparse.Namespace) -> str:
  return 'toy' if args.quick else args.scale


def selected(runs: Sequence[runs_lib.Run], patterns: str) -> list[runs_lib.Run]:
  globs = patterns.split(',')
  return [r for r in runs if any(fnmatch.fnmatch(r.name, g) for g in globs)]


def command(module: str, args: argparse.Namespace) -> str:
  """The command that regenerates a study's report at this scale."""
  name = scale_name(args)
  return f'python -m experiments.{module}' + ('' if name == 'cpu' else f' --scale={name}')


# ------------------------------------------------------------------------------------------
# Plots.


def pyplot():
  """matplotlib.pyplot with the file backend, or None when matplotlib is missing."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return plt


def save_figure(fig, path: str, dpi: int = 110) -> str:
  """Lays `fig` out, writes it to `path` and frees it; returns `path`."""
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  pyplot().close(fig)
  return path


def resumed_curve(points: Sequence[Sequence[float]]) -> list[list]:
  """[[step, value], ...] in step order, one point a step: a run stopped after a checkpoint
  and resumed logs the steps since that checkpoint twice (both runs' event files), and the
  resumed run's values are the ones its result comes from, so the later write wins."""
  return [[int(step), float(value)] for step, value in sorted(dict(points).items())]


def plot_curve(ax, curve: Sequence[tuple[int, float]], **style) -> None:
  """A [(step, fraction), ...] curve, in %, when it has a point."""
  if curve:
    steps, values = zip(*curve)
    ax.plot(steps, 100 * np.asarray(values), **style)


def plot_seed_curves(
  ax,
  results: Mapping[str, Mapping[str, Any]],
  names: Iterable[str],
  color: str,
  mean_label: Callable[[int], str],
  alpha: float = 0.3,
) -> None:
  """The eval [MASK] accuracy curves (%) of one arm's runs `names`: each finished run's thin,
  and thick the mean of those that reached the last evaluation (`mean_label(how many)`)."""
  curves = [
    results[n]['eval_mask_accuracy']
    for n in names
    if n in results and results[n].get('eval_mask_accuracy')
  ]
  for curve in curves:
    plot_curve(ax, curve, color=color, alpha=alpha, linewidth=0.8)
  full = [c for c in curves if len(c) == max(map(len, curves))] if curves else []
  if full:
    ax.plot(
      [s for s, _ in full[0]],
      100 * np.mean([[v for _, v in c] for c in full], 0),
      color=color,
      linewidth=2.2,
      label=mean_label(len(full)),
    )


def plot_comparisons(
  path: str,
  comparisons: Sequence[Mapping[str, Any]],
  labels: Sequence[str],
  colors: Sequence[str],
  *,
  xlabel: str,
  title: str,
) -> str:
  """One row per paired difference of [MASK] accuracy (stats.paired_comparison's dict): its
  mean and 95% interval, each seed's difference as an x, a line at 0; in percentage points."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(9, 0.5 * len(comparisons) + 1.6))
  for i, (c, color) in enumerate(zip(comparisons, colors)):
    ax.errorbar(
      [100 * c['mean']], [i], xerr=[[100 * c['ci95_half_width']]], fmt='o', color=color, capsize=4
    )
    ax.scatter(
      [100 * v for v in c['values']],
      [i + 0.18] * len(c['values']),
      s=10,
      color=color,
      alpha=0.6,
      marker='x',
    )
  ax.axvline(0, color='gray', linewidth=0.8)
  ax.set_yticks(range(len(comparisons)), labels, fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel(xlabel)
  fig.suptitle(title, fontsize=9)  # the figure's width: long row labels narrow the axes
  return save_figure(fig, path)


# Per floor kind: (the floors' key, scaled like an accuracy, colour, label) of each line drawn.
FLOOR_LINES = {
  'mask_accuracy': (
    ('mask_accuracy', True, 'gray', 'floor: most frequent token (= copy rule at [MASK])'),
  ),
  'mlm_accuracy': (
    ('mlm_accuracy', True, 'gray', 'floor: most frequent token'),
    ('copy_accuracy', True, 'black', 'floor: copy-aware (copy visible, else most frequent)'),
  ),
  'loss': (('copy_unigram_loss', False, 'black', 'floor: copy-aware unigram loss'),),
  'mask_loss': (('mask_unigram_loss', False, 'black', 'floor: token-frequency loss at [MASK]'),),
}


def draw_floors(
  ax, floors: Mapping[str, float], kind: str = 'mask_accuracy', scale: float = 100.0
) -> None:
  """Horizontal lines at the context-free floors of one metric: 'mask_accuracy' (the copy
  rule's = the most frequent token's at [MASK]), 'mlm_accuracy' (most frequent and copy-aware,
  all predictions), 'loss' (the copy-aware unigram loss) or 'mask_loss' (at [MASK])."""
  if not floors:
    return
  for key, is_accuracy, color, label in FLOOR_LINES[kind]:
    value = scale * floors[key] if is_accuracy else floors[key]
    ax.axhline(value, color=color, linestyle=':', label=label)


# ------------------------------------------------------------------------------------------
# Batches for diagnostics that drive the model directly (grad_norms, init_grad_sweep).

# The special ids of the tokenizers the data pipeline trains (data/tokenizers); ids from
# NUM_SPECIAL up are ordinary tokens.
CLS_ID, SEP_ID, MASK_ID = (tokenizer_lib.TRAINED_SPECIALS.index(p) for p in (CLS, SEP, MASK))
NUM_SPECIAL = len(tokenizer_lib.TRAINED_SPECIALS)


def model_inputs(batch: Mapping[str, Any]) -> tuple:
  """MaskedLM's positional inputs from a batch of the data contract."""
  return (batch['input_ids'], batch['input_mask'], batch['segment_ids'], batch['masked_positions'])


def synthetic_batches(
  vocab: int, seq_len: int, batch: int, predictions: int, seed: int
) -> Iterator[dict]:
  """[CLS] t_1 .. t_n [SEP] where t_{i+1} = succ[t_i] with prob 0.7 (so context predicts a
  token) else a Zipf draw; BERT masking (80% [MASK], 10% random, 10% kept)."""
  rng = np.random.default_rng(seed)
  structure = np.random.default_rng(1234)
  succ = structure.integers(NUM_SPECIAL, vocab, size=vocab)
  zipf = 1.0 / np.arange(1, vocab - NUM_SPECIAL + 1)
  zipf /= zipf.sum()
  while True:
    ids = np.zeros((batch, seq_len), np.int32)
    ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
    tokens = NUM_SPECIAL + rng.choice(vocab - NUM_SPECIAL, size=(batch, seq_len), p=zipf)
    for i in range(2, seq_len - 1):
      follow = rng.random(batch) < 0.7
      tokens[follow, i] = succ[tokens[follow, i - 1]]
    ids[:, 1:-1] = tokens[:, 1:-1]
    positions = np.zeros((batch, predictions), np.int32)
    targets = np.zeros((batch, predictions), np.int32)
    weights = np.zeros((batch, predictions), np.float32)
    inputs = ids.copy()
    count = min(predictions, max(1, round(0.15 * (seq_len - 2))))
    for b in range(batch):
      chosen = np.sort(rng.choice(np.arange(1, seq_len - 1), size=count, replace=False))
      positions[b, :count], targets[b, :count], weights[b, :count] = chosen, ids[b, chosen], 1
      u = rng.random(count)
      inputs[b, chosen[u < 0.8]] = MASK_ID
      rand = chosen[(u >= 0.8) & (u < 0.9)]
      inputs[b, rand] = rng.integers(NUM_SPECIAL, vocab, size=rand.size)
    yield dict(
      input_ids=inputs,
      segment_ids=np.zeros_like(ids),
      input_mask=np.ones_like(ids),
      masked_positions=positions,
      masked_ids=targets,
      masked_weights=weights,
    )


class BatchSource:
  """MLM batches of `seq_len` tokens from the embedded corpus (data='auto' or 'embedded') or
  the synthetic stream (data='synthetic', `vocab` ids): `batches(batch_size, seed)` is an
  endless iterator, `measure_batch` a fixed held-out batch, `vocab_size` the vocabulary."""

  def __init__(self, seq_len: int, data_kind: str = 'auto', data_dir: str = '', vocab: int = 8000):
    self.seq_len = seq_len
    self.predictions = max(1, round(0.15 * seq_len))
    self.kind = 'synthetic' if data_kind == 'synthetic' else 'embedded'
    self.vocab_size = vocab
    if self.kind == 'embedded':
      self.data_config = data.default_data_config()
      self.data_config.max_len = seq_len
      self.data_config.max_predictions = self.predictions
      if data_dir:
        self.data_config.data_dir = data_dir
      data.prepare(self.data_config)
      self.vocab_size = self.data_config.vocab_size

  def measure_batch(self, batch_size: int, seed: int) -> dict:
    """The fixed batch every table is measured on: held-out (eval split) when embedded."""
    if self.kind == 'embedded':
      return next(iter(data.make_eval_iterator(self.data_config, batch_size)))
    return next(self.batches(batch_size, seed))

  def batches(self, batch_size: int, seed: int) -> Iterator[dict]:
    if self.kind == 'embedded':
      return iter(data.make_train_iterator(self.data_config, batch_size, seed))
    return synthetic_batches(self.vocab_size, self.seq_len, batch_size, self.predictions, seed)

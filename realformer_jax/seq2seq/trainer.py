"""A trainer for the encoder-decoder (model.py) on WEB -> BBE (data.py): label-smoothed
cross-entropy, AdamW with warmup and linear decay, dev loss during training, then BLEU
(sacrebleu) of greedy and beam search on held-out books.

    spec = seq2seq_config.validate(seq2seq_config.default_translation_config())
    trained = trainer.train(spec, workdir, on_log=...)   # or restores workdir's params
    scores = trainer.evaluate_bleu(trained, 'test', search='beam')

The step is the project's shared train step (train/step.py) with a translation task: only the
model call and the loss differ from pretraining and fine-tuning. The loop is its own: batches
here are length-bucketed (a few shapes, each compiled once), single-device, and a run resumes
at run granularity: the trained parameters are saved with orbax in `<workdir>/params` (with
`history.json`), and a workdir that has them is restored instead of trained again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from realformer_jax.config import ConfigError
from realformer_jax.model.params import unbox
from realformer_jax.seq2seq import data as data_lib
from realformer_jax.seq2seq import decoding
from realformer_jax.seq2seq.config import TranslationSpec
from realformer_jax.seq2seq.model import Seq2Seq
from realformer_jax.train import metrics as metrics_lib
from realformer_jax.train import step as step_lib
from realformer_jax.train.state import TrainState, learning_rate_schedule, make_optimizer
from realformer_jax.train.task import Task

OnLog = Callable[[int, int, dict], None]  # (step, num_train_steps, scalars)


def label_smoothed_sums(
  logits_BxTxV: jax.Array, targets_BxT: jax.Array, weights_BxT: jax.Array, smoothing: float
) -> dict[str, jax.Array]:
  """Sums over real target tokens that add across batches: of (1 - e) * NLL + e *
  mean_v(-log p_v) (the optimised loss), of the unsmoothed NLL, of correct argmax tokens, and
  the token count."""
  log_p = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32))
  nll = -jnp.take_along_axis(log_p, targets_BxT[..., None], axis=-1)[..., 0]
  smoothed = (1.0 - smoothing) * nll - smoothing * jnp.mean(log_p, axis=-1)
  weights = weights_BxT.astype(jnp.float32)
  correct = (jnp.argmax(log_p, axis=-1) == targets_BxT).astype(jnp.float32)
  return {
    'smoothed_sum': jnp.sum(smoothed * weights),
    'nll_sum': jnp.sum(nll * weights),
    'correct_sum': jnp.sum(correct * weights),
    'tokens': jnp.sum(weights),
  }


def label_smoothed_loss(
  logits_BxTxV: jax.Array, targets_BxT: jax.Array, weights_BxT: jax.Array, smoothing: float
) -> tuple[jax.Array, dict]:
  """(mean smoothed loss over real target tokens, the sums of label_smoothed_sums)."""
  sums = label_smoothed_sums(logits_BxTxV, targets_BxT, weights_BxT, smoothing)
  return sums['smoothed_sum'] / jnp.maximum(sums['tokens'], 1.0), sums


class TranslationTask(Task):
  """Teacher-forced Seq2Seq with label smoothing, as a task of the shared train step."""

  name = 'translation'
  sum_metrics = ('smoothed_sum', 'nll_sum', 'correct_sum', 'tokens')
  loss_sum = 'smoothed_sum'
  weight = 'tokens'

  def __init__(self, label_smoothing: float):
    self.label_smoothing = label_smoothing

  def forward(self, model, params, batch, *, step, rng):
    del step  # no part of a Seq2Seq depends on the training step
    deterministic = rng is None
    return model.apply(
      {'params': params},
      batch['source'],
      batch['source_mask'],
      batch['target_in'],
      deterministic=deterministic,
      rngs=None if deterministic else {'dropout': rng},
    )

  def batch_weight(self, batch) -> jax.Array:
    return jnp.sum(batch['target_mask'].astype(jnp.float32))

  def loss_sums(self, outputs, batch) -> dict[str, jax.Array]:
    return label_smoothed_sums(
      outputs, batch['target_out'], batch['target_mask'], self.label_smoothing
    )


def make_train_step(model: Seq2Seq, spec: TranslationSpec):
  """The shared train step for a translation task, jitted (one compilation per bucket)."""
  task = TranslationTask(spec.train.label_smoothing)
  step = step_lib.make_train_step(
    model, make_optimizer(spec.train), task, learning_rate_schedule(spec.train)
  )
  return jax.jit(step, donate_argnums=0)


def make_eval_step(model: Seq2Seq):
  """jit((params, batch) -> sums) of the unsmoothed loss (the shared eval step)."""
  eval_step = step_lib.make_eval_step(model, TranslationTask(label_smoothing=0.0))

  @jax.jit
  def sums(params, batch):
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=())
    return eval_step(state, batch)[0]

  return sums


@dataclasses.dataclass
class Trained:
  """A trained (or restored) run: what evaluation and the speed benchmark need."""

  spec: TranslationSpec
  model: Seq2Seq
  params: Any
  data: data_lib.TranslationData
  history: dict  # train/dev curves and timings (also <workdir>/history.json)


def dev_loss(eval_step, params, data, data_config) -> dict:
  totals = {'nll_sum': 0.0, 'correct_sum': 0.0, 'tokens': 0.0}
  for batch in data_lib.train_batches(data, data_config, seed=0, epoch=0, split='validation'):
    sums = eval_step(params, batch)
    for key in totals:
      totals[key] += float(sums[key])
  tokens = max(totals['tokens'], 1.0)
  return {'dev/nll': totals['nll_sum'] / tokens, 'dev/accuracy': totals['correct_sum'] / tokens}


def _params_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'params')


def _abstract_params(model: Seq2Seq, data_config) -> Any:
  longest = data_config.bucket_lengths[-1]
  ids = jnp.zeros((1, longest), jnp.int32)
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids)['params'])
  return unbox(boxed)


def train(spec: TranslationSpec, workdir: str, *, on_log: Optional[OnLog] = None) -> Trained:
  """Trains one run, or restores it when `<workdir>/params` exists. Prints a progress line
  with tokens/s and ETA every train.log_every_steps; dev loss every train.eval_every_steps."""
  data = data_lib.prepare(spec.data)
  if data.tokenizer.vocab_size > spec.model.vocab_size:
    raise ConfigError(
      f'model.vocab_size={spec.model.vocab_size}: smaller than the '
      f'tokenizer ({data.tokenizer.vocab_size} pieces)'
    )
  model = Seq2Seq(spec.model)
  os.makedirs(workdir, exist_ok=True)
  history_path = os.path.join(workdir, 'history.json')
  checkpointer = ocp.StandardCheckpointer()
  if os.path.isdir(_params_dir(workdir)) and os.path.isfile(history_path):
    params = checkpointer.restore(_params_dir(workdir), _abstract_params(model, spec.data))
    with open(history_path) as f:
      history = json.load(f)
    return Trained(spec, model, params, data, history)

  t = spec.train
  tx = make_optimizer(t)
  schedule = learning_rate_schedule(t)
  rng = jax.random.key(t.seed)
  init_rng, dropout_rng = jax.random.split(rng)
  first = next(data_lib.train_batches(data, spec.data, seed=t.seed, epoch=0))
  params = unbox(
    jax.jit(model.init)(init_rng, first['source'], first['source_mask'], first['target_in'])[
      'params'
    ]
  )
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  train_step = make_train_step(model, spec)
  eval_step = make_eval_step(model)
  writer = metrics_lib.MetricWriter(workdir, enabled=True)
  throughput = metrics_lib.Throughput(spec.data.tokens_per_batch, 0, t.num_train_steps)
  history = {
    'train': [],
    'dev': [],
    'batches_per_epoch': data_lib.batches_per_epoch(data, spec.data),
    'dropped_train_pairs': data.dropped,
  }
  sums, step, epoch, start = None, 0, 0, time.perf_counter()
  keys = ('nll_sum', 'correct_sum', 'tokens')
  while step < t.num_train_steps:
    for batch in data_lib.train_batches(data, spec.data, seed=t.seed, epoch=epoch):
      state, metrics = train_step(state, batch, dropout_rng)
      step += 1
      sums = metrics_lib.add_sums(sums, metrics, keys)
      if step % t.log_every_steps == 0 or step == 1 or step == t.num_train_steps:
        loss = float(metrics['smoothed_sum']) / max(float(metrics['tokens']), 1.0)
        if not math.isfinite(loss):
          raise FloatingPointError(f'non-finite training loss {loss} at step {step}')
        tokens_per_s, seconds_left = throughput.update(step)
        scalars = {
          'train/loss': loss,
          'train/nll': sums['nll_sum'] / max(sums['tokens'], 1),
          'train/learning_rate': float(schedule(step)),
          'train/grad_norm': float(metrics['grad_norm']),
        }
        sums = None
        writer.scalars(step, scalars)
        history['train'].append(dict(scalars, step=step))
        writer.print(
          f'step {step}/{t.num_train_steps} epoch {epoch} loss {loss:.3f} | '
          f'{tokens_per_s:,.0f} tokens/s | ETA '
          f'{metrics_lib.format_duration(seconds_left)}'
        )
        if on_log:
          on_log(step, t.num_train_steps, scalars)
      if step % t.eval_every_steps == 0 or step == t.num_train_steps:
        scores = dev_loss(eval_step, state.params, data, spec.data)
        writer.scalars(step, scores)
        history['dev'].append(dict(scores, step=step))
        writer.print(
          f'step {step}: dev nll {scores["dev/nll"]:.3f} accuracy {scores["dev/accuracy"]:.3f}'
        )
        throughput.restart(step)  # the ETA measures training steps only
      if step == t.num_train_steps:
        break
    epoch += 1
  history['train_seconds'] = time.perf_counter() - start
  history['epochs'] = step / history['batches_per_epoch']
  writer.close()
  checkpointer.save(_params_dir(workdir), state.params)
  checkpointer.wait_until_finished()
  with open(history_path, 'w') as f:
    json.dump(history, f, indent=2)
  return Trained(spec, model, state.params, data, history)


@functools.lru_cache(maxsize=None)
def _search_fn(
  model: Seq2Seq, search: str, max_len: int, bos_id: int, beam_size: int, alpha: float
):
  """jit((params, source, mask, eos_id) -> tokens); the EOS id is traced (one compilation
  serves real decoding and the no-EOS timing)."""
  if search == 'greedy':
    return jax.jit(
      lambda params, source, mask, eos_id: decoding.greedy_search(
        model, params, source, mask, max_len=max_len, bos_id=bos_id, eos_id=eos_id
      )[0]
    )
  if search == 'beam':
    return jax.jit(
      lambda params, source, mask, eos_id: decoding.beam_search(
        model,
        params,
        source,
        mask,
        beam_size=beam_size,
        max_len=max_len,
        bos_id=bos_id,
        eos_id=eos_id,
        alpha=alpha,
      )[0]
    )
  raise ValueError(f'search={search!r}: must be greedy or beam')


def search_fn(trained: Trained, search: str, source_length: int, eos_id: Optional[int] = None):
  """A jitted (params, source, source_mask) -> tokens [B, max_len] for one source length
  (`eos_id` -1: no token ends a sequence, so every row decodes to the length limit)."""
  d = trained.spec.decode
  max_len = min(trained.spec.model.max_len, math.ceil(d.length_ratio * source_length))
  fn = _search_fn(trained.model, search, max_len, trained.data.bos_id, d.beam_size, float(d.alpha))
  eos = jnp.asarray(trained.data.eos_id if eos_id is None else eos_id, jnp.int32)
  return lambda params, source, mask: fn(params, source, mask, eos)


def translate(trained: Trained, split: str, search: str) -> list[str]:
  """Detokenised outputs for every pair of `split`, in the split's order."""
  data = trained.data
  outputs = [''] * len(data.splits[split])
  for batch, rows in data_lib.eval_batches(
    data, split, trained.spec.data, batch_size=trained.spec.decode.batch_size
  ):
    fn = search_fn(trained, search, batch['source'].shape[1])
    tokens = np.asarray(fn(trained.params, batch['source'], batch['source_mask']))
    for row, index in enumerate(rows):
      outputs[index] = data.tokenizer.decode(ids for ids in tokens[row] if ids != 0)
  return outputs


def evaluate_bleu(trained: Trained, split: str, search: str) -> dict:
  """Corpus BLEU (sacrebleu, default 13a tokenisation) of `search` outputs against the BBE."""
  from sacrebleu.metrics import BLEU  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  hypotheses = translate(trained, split, search)
  seconds = time.perf_counter() - start
  metric = BLEU()
  bleu = metric.corpus_score(hypotheses, [trained.data.splits[split].references])
  return {
    'bleu': bleu.score,
    'signature': str(metric.get_signature()),
    'seconds': seconds,
    'hypotheses': hypotheses,
  }

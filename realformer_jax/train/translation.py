"""A compact trainer for the encoder-decoder (seq2seq.py) on WEB -> BBE (data/translation.py):
label-smoothed cross-entropy, AdamW with warmup and linear decay (state.make_optimizer), dev
loss during training, then BLEU (sacrebleu) of greedy and beam search on held-out books.

    config = translation.default_translation_config()
    trained = translation.train(config, workdir, on_log=...)   # or restores workdir's params
    scores = translation.evaluate_bleu(trained, 'test', search='beam')

It reuses the pretraining loop's pieces (TrainState, make_optimizer, learning_rate_schedule,
MetricWriter, Throughput) but not the loop: batches here are length-bucketed (a few shapes,
each compiled once), single-device, and a run resumes at run granularity: the trained
parameters are saved with orbax in `<workdir>/params` (with `history.json`), and a workdir
that has them is restored instead of trained again.
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
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

from realformer_jax import decoding
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.data import translation as data_lib
from realformer_jax.params import unbox
from realformer_jax.seq2seq import Seq2Seq
from realformer_jax.train import metrics as metrics_lib
from realformer_jax.train.defaults import default_model_config
from realformer_jax.train.state import TrainState, learning_rate_schedule, make_optimizer

OnLog = Callable[[int, int, dict], None]  # (step, num_train_steps, scalars)


def default_translation_config() -> ml_collections.ConfigDict:
  """Every field a translation run can set; configs/translate.py sizes it."""
  config = ml_collections.ConfigDict()
  config.data = data_lib.default_translation_data_config()
  config.model = default_model_config(ModelConfig(
      hidden_size=256, num_layers=3, num_decoder_layers=3, num_heads=4, mlp_dim=1024,
      max_len=128, ln_placement='post', init='ds_init', decoder_attention='standard'))
  config.model.vocab_size = config.data.get_ref('vocab_size')
  t = config.train = ml_collections.ConfigDict()
  t.num_train_steps = 2000
  t.warmup_steps = 200  # linear warmup to learning_rate, then linear decay to 0
  t.learning_rate = 1e-3
  t.weight_decay = 0.01
  t.adam_b1 = 0.9
  t.adam_b2 = 0.98  # Transformer NMT's value
  t.adam_eps = 1e-9
  t.clip_grad_norm = 1.0  # 0 = off
  t.label_smoothing = 0.1
  t.log_every_steps = 50
  t.eval_every_steps = 500  # dev loss (also at the last step)
  t.seed = 0  # params init, dropout and batch order
  d = config.decode = ml_collections.ConfigDict()
  d.batch_size = 64  # sources per decoding call
  d.beam_size = 4
  d.alpha = 0.6  # GNMT length penalty ((5 + |y|) / 6) ** alpha in beam search
  # Output length limit: length_ratio * the padded source length (the last bucket), at most
  # model.max_len. One shape for every decoding call: each search compiles once.
  d.length_ratio = 1.5
  return config


def validate(config: ml_collections.ConfigDict) -> ModelConfig:
  """ModelConfig of `config`; one-line ConfigError / DataError naming a bad field."""
  model_config = ModelConfig.from_mapping(config.model)
  data_lib.validate_translation_data_config(config.data)
  t, d = config.train, config.decode

  def need(ok: bool, field: str, rule: str):
    if not ok:
      section, name = field.split('.')
      raise ConfigError(f'{field}={config[section][name]!r}: {rule}')

  need(t.num_train_steps > 0, 'train.num_train_steps', 'must be positive')
  need(0 <= t.warmup_steps < t.num_train_steps, 'train.warmup_steps',
       'must be in [0, num_train_steps)')
  need(t.learning_rate > 0, 'train.learning_rate', 'must be positive')
  need(0.0 <= t.label_smoothing < 1.0, 'train.label_smoothing', 'must be in [0, 1)')
  need(t.log_every_steps > 0, 'train.log_every_steps', 'must be positive')
  need(t.eval_every_steps > 0, 'train.eval_every_steps', 'must be positive')
  need(d.batch_size > 0, 'decode.batch_size', 'must be positive')
  need(d.beam_size > 0, 'decode.beam_size', 'must be positive')
  need(d.length_ratio > 0, 'decode.length_ratio', 'must be positive')
  if (model_config.position_embedding == 'learned'
      and model_config.max_len < config.data.bucket_lengths[-1]):
    raise ConfigError(f'model.max_len={model_config.max_len}: the learned position table must '
                      f'cover the longest bucket, data.bucket_lengths[-1]='
                      f'{config.data.bucket_lengths[-1]}')
  return model_config


def label_smoothed_loss(logits_BxTxV: jax.Array, targets_BxT: jax.Array,
                        weights_BxT: jax.Array, smoothing: float) -> tuple[jax.Array, dict]:
  """Mean over real target tokens of (1 - e) * NLL + e * mean_v(-log p_v); metrics are sums
  (the unsmoothed NLL, correct argmax tokens, token count) that add across batches."""
  log_p = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32))
  nll = -jnp.take_along_axis(log_p, targets_BxT[..., None], axis=-1)[..., 0]
  smoothed = (1.0 - smoothing) * nll - smoothing * jnp.mean(log_p, axis=-1)
  weights = weights_BxT.astype(jnp.float32)
  tokens = jnp.sum(weights)
  loss = jnp.sum(smoothed * weights) / jnp.maximum(tokens, 1.0)
  correct = (jnp.argmax(log_p, axis=-1) == targets_BxT).astype(jnp.float32)
  return loss, {'nll_sum': jnp.sum(nll * weights), 'correct_sum': jnp.sum(correct * weights),
                'tokens': tokens}


def make_train_step(model: Seq2Seq, tx: optax.GradientTransformation, smoothing: float):
  def train_step(state: TrainState, batch: dict, rng: jax.Array):
    dropout = jax.random.fold_in(rng, state.step)

    def loss_fn(params):
      logits = model.apply({'params': params}, batch['source'], batch['source_mask'],
                           batch['target_in'], deterministic=False, rngs={'dropout': dropout})
      return label_smoothed_loss(logits, batch['target_out'], batch['target_mask'], smoothing)

    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    state = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                       opt_state=opt_state)
    return state, dict(sums, loss=loss, grad_norm=optax.tree.norm(grads))

  return jax.jit(train_step, donate_argnums=0)


def make_eval_step(model: Seq2Seq):
  @jax.jit
  def eval_step(params, batch):
    logits = model.apply({'params': params}, batch['source'], batch['source_mask'],
                         batch['target_in'])
    return label_smoothed_loss(logits, batch['target_out'], batch['target_mask'], 0.0)[1]
  return eval_step


@dataclasses.dataclass
class Trained:
  """A trained (or restored) run: what evaluation and the speed benchmark need."""

  config: ml_collections.ConfigDict
  model_config: ModelConfig
  model: Seq2Seq
  params: Any
  data: data_lib.TranslationData
  history: dict  # train/dev curves and timings (also <workdir>/history.json)


def dev_loss(eval_step, params, data, config) -> dict:
  totals = {'nll_sum': 0.0, 'correct_sum': 0.0, 'tokens': 0.0}
  for batch in data_lib.train_batches(data, config.data, seed=0, epoch=0, split='validation'):
    for key, value in eval_step(params, batch).items():
      totals[key] += float(value)
  tokens = max(totals['tokens'], 1.0)
  return {'dev/nll': totals['nll_sum'] / tokens, 'dev/accuracy': totals['correct_sum'] / tokens}


def _params_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'params')


def _abstract_params(model: Seq2Seq, config) -> Any:
  longest = config.data.bucket_lengths[-1]
  ids = jnp.zeros((1, longest), jnp.int32)
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids)['params'])
  return unbox(boxed)


def train(config: ml_collections.ConfigDict, workdir: str, *,
          on_log: Optional[OnLog] = None) -> Trained:
  """Trains one run, or restores it when `<workdir>/params` exists. Prints a progress line
  with tokens/s and ETA every train.log_every_steps; dev loss every train.eval_every_steps."""
  model_config = validate(config)
  data = data_lib.prepare(config.data)
  if data.tokenizer.vocab_size > model_config.vocab_size:
    raise ConfigError(f'model.vocab_size={model_config.vocab_size}: smaller than the '
                      f'tokenizer ({data.tokenizer.vocab_size} pieces)')
  model = Seq2Seq(model_config)
  os.makedirs(workdir, exist_ok=True)
  history_path = os.path.join(workdir, 'history.json')
  checkpointer = ocp.StandardCheckpointer()
  if os.path.isdir(_params_dir(workdir)) and os.path.isfile(history_path):
    params = checkpointer.restore(_params_dir(workdir), _abstract_params(model, config))
    with open(history_path) as f:
      history = json.load(f)
    return Trained(config, model_config, model, params, data, history)

  t = config.train
  tx = make_optimizer(t)
  schedule = learning_rate_schedule(t)
  rng = jax.random.key(t.seed)
  init_rng, dropout_rng = jax.random.split(rng)
  first = next(data_lib.train_batches(data, config.data, seed=t.seed, epoch=0))
  params = unbox(jax.jit(model.init)(init_rng, first['source'], first['source_mask'],
                                     first['target_in'])['params'])
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  train_step = make_train_step(model, tx, t.label_smoothing)
  eval_step = make_eval_step(model)
  writer = metrics_lib.MetricWriter(workdir, enabled=True)
  throughput = metrics_lib.Throughput(config.data.tokens_per_batch, 0, t.num_train_steps)
  history = {'train': [], 'dev': [], 'batches_per_epoch': data_lib.batches_per_epoch(
      data, config.data), 'dropped_train_pairs': data.dropped}
  sums, step, epoch, start = None, 0, 0, time.perf_counter()
  keys = ('nll_sum', 'correct_sum', 'tokens')
  while step < t.num_train_steps:
    for batch in data_lib.train_batches(data, config.data, seed=t.seed, epoch=epoch):
      state, metrics = train_step(state, batch, dropout_rng)
      step += 1
      sums = metrics_lib.add_sums(sums, metrics, keys)
      if step % t.log_every_steps == 0 or step == 1 or step == t.num_train_steps:
        loss = float(metrics['loss'])
        if not math.isfinite(loss):
          raise FloatingPointError(f'non-finite training loss {loss} at step {step}')
        tokens_per_s, seconds_left = throughput.update(step)
        scalars = {'train/loss': loss, 'train/nll': sums['nll_sum'] / max(sums['tokens'], 1),
                   'train/learning_rate': float(schedule(step)),
                   'train/grad_norm': float(metrics['grad_norm'])}
        sums = None
        writer.scalars(step, scalars)
        history['train'].append(dict(scalars, step=step))
        writer.print(f'step {step}/{t.num_train_steps} epoch {epoch} loss {loss:.3f} | '
                     f'{tokens_per_s:,.0f} tokens/s | ETA '
                     f'{metrics_lib.format_duration(seconds_left)}')
        if on_log:
          on_log(step, t.num_train_steps, scalars)
      if step % t.eval_every_steps == 0 or step == t.num_train_steps:
        scores = dev_loss(eval_step, state.params, data, config)
        writer.scalars(step, scores)
        history['dev'].append(dict(scores, step=step))
        writer.print(f'step {step}: dev nll {scores["dev/nll"]:.3f} accuracy '
                     f'{scores["dev/accuracy"]:.3f}')
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
  return Trained(config, model_config, model, state.params, data, history)


@functools.lru_cache(maxsize=None)
def _search_fn(model: Seq2Seq, search: str, max_len: int, bos_id: int, beam_size: int,
               alpha: float):
  """jit((params, source, mask, eos_id) -> tokens); the EOS id is traced (one compilation
  serves real decoding and the no-EOS timing)."""
  if search == 'greedy':
    return jax.jit(lambda params, source, mask, eos_id: decoding.greedy_search(
        model, params, source, mask, max_len=max_len, bos_id=bos_id, eos_id=eos_id)[0])
  if search == 'beam':
    return jax.jit(lambda params, source, mask, eos_id: decoding.beam_search(
        model, params, source, mask, beam_size=beam_size, max_len=max_len, bos_id=bos_id,
        eos_id=eos_id, alpha=alpha)[0])
  raise ValueError(f'search={search!r}: must be greedy or beam')


def search_fn(trained: Trained, search: str, source_length: int,
              eos_id: Optional[int] = None):
  """A jitted (params, source, source_mask) -> tokens [B, max_len] for one source length
  (`eos_id` -1: no token ends a sequence, so every row decodes to the length limit)."""
  d = trained.config.decode
  max_len = min(trained.model_config.max_len, math.ceil(d.length_ratio * source_length))
  fn = _search_fn(trained.model, search, max_len, trained.data.bos_id, d.beam_size,
                  float(d.alpha))
  eos = jnp.asarray(trained.data.eos_id if eos_id is None else eos_id, jnp.int32)
  return lambda params, source, mask: fn(params, source, mask, eos)


def translate(trained: Trained, split: str, search: str) -> list[str]:
  """Detokenised outputs for every pair of `split`, in the split's order."""
  data = trained.data
  outputs = [''] * len(data.splits[split])
  for batch, rows in data_lib.eval_batches(data, split, trained.config.data,
                                           batch_size=trained.config.decode.batch_size):
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
  return {'bleu': bleu.score, 'signature': str(metric.get_signature()), 'seconds': seconds,
          'hypotheses': hypotheses}

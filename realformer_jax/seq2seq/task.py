"""WEB -> BBE translation as a task of the generic training loop (train/task.py, loop.py).

Teacher-forced Seq2Seq (model.py) with label-smoothed cross-entropy on length-bucketed batches
(data.py): each bucket is one batch shape, compiled once; the train stream is a checkpointable
iterator, so a run resumes mid-epoch like pretraining. Evaluation is the validation split's
loss, unsmoothed NLL and token accuracy, beside the floors of a model that ignores its input:
the training targets' unigram distribution (its NLL) and its most frequent token (accuracy).
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from realformer_jax.config import ConfigError, from_section
from realformer_jax.seq2seq import config as config_lib
from realformer_jax.seq2seq import data as data_lib
from realformer_jax.seq2seq.config import DecodeConfig, TranslationTrainConfig
from realformer_jax.seq2seq.model import Seq2Seq
from realformer_jax.seq2seq.model_config import Seq2SeqModelConfig
from realformer_jax.train import config as train_config
from realformer_jax.train.config import AUTO, RunSpec
from realformer_jax.train.task import Task, TaskData

_BATCH_KEYS = ('source', 'source_mask', 'target_in', 'target_out', 'target_mask')


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
  """Seq2Seq on WEB -> BBE pairs; `label_smoothing` is the validated train.label_smoothing
  (config.validate makes the task from it)."""

  name = 'translation'
  sum_metrics = ('smoothed_sum', 'nll_sum', 'correct_sum', 'tokens')
  loss_sum = 'smoothed_sum'
  weight = 'tokens'

  model_config_class = Seq2SeqModelConfig
  data_config_class = data_lib.TranslationDataConfig
  train_config_class = TranslationTrainConfig

  def __init__(self, label_smoothing: float):
    self.label_smoothing = label_smoothing

  # Config.
  def extra_sections(self):
    return {'decode': DecodeConfig}

  def validate(self, spec) -> None:
    if spec.train.label_smoothing != self.label_smoothing:
      raise ConfigError(
        f'train.label_smoothing={spec.train.label_smoothing!r}: differs from the task '
        f'({self.label_smoothing!r}); make the spec with seq2seq.config.validate'
      )
    longest = spec.data.bucket_lengths[-1]
    if spec.model.position_embedding == 'learned' and spec.model.max_len < longest:
      raise ConfigError(
        f'model.max_len={spec.model.max_len}: the learned position table must cover the '
        f'longest bucket, data.bucket_lengths[-1]={longest}'
      )
    if spec.train.grad_accum_steps == AUTO:
      raise ConfigError(
        "train.grad_accum_steps='auto': not for translation (its batches come in one shape "
        'per bucket); give a number'
      )

  # Model and batch.
  def make_model(self, model_config) -> Seq2Seq:
    return Seq2Seq(model_config)

  def batch_shapes(self, data_config, batch_size):
    """`batch_size` rows of the longest bucket (what init and the memory estimate use)."""
    return _shapes(batch_size, data_config.bucket_lengths[-1])

  def data_batch_shapes(self, data_config, batch_size):
    del batch_size  # rows per batch: tokens_per_batch // the bucket's length
    return [
      _shapes(data_config.tokens_per_batch // length, length)
      for length in data_config.bucket_lengths
    ]

  def batch_rows(self, spec):
    d = spec.data
    return {
      f'data.tokens_per_batch // data.bucket_lengths[{i}] ({d.tokens_per_batch} // {length})': (
        d.tokens_per_batch // length
      )
      for i, length in enumerate(d.bucket_lengths)
    }

  def tokens_per_step(self, spec) -> int:
    return spec.data.tokens_per_batch

  def model_inputs(self, batch):
    return batch['source'], batch['source_mask'], batch['target_in']

  def forward(self, model, params, batch, *, step, rng):
    del step  # no part of a Seq2Seq depends on the training step
    deterministic = rng is None
    return model.apply(
      {'params': params},
      *self.model_inputs(batch),
      deterministic=deterministic,
      rngs=None if deterministic else {'dropout': rng},
    )

  def init_variables(self, model, rng, data_config, batch_size):
    shapes = self.batch_shapes(data_config, batch_size)
    zeros = {name: np.zeros(shape, dtype) for name, (shape, dtype) in shapes.items()}
    return model.init({'params': rng}, *self.model_inputs(zeros))

  # Loss and evaluation.
  def batch_weight(self, batch) -> jax.Array:
    return jnp.sum(batch['target_mask'].astype(jnp.float32))

  def loss_sums(self, outputs, batch) -> dict[str, jax.Array]:
    return label_smoothed_sums(
      outputs, batch['target_out'], batch['target_mask'], self.label_smoothing
    )

  def eval_metrics(self, sums, outputs, context) -> dict[str, float]:
    del outputs, context  # every metric is a sum
    return _mean_metrics(sums)

  def train_metrics(self, sums) -> dict[str, float]:
    return _mean_metrics(sums)

  def log_fields(self, metrics) -> str:
    return f'nll {metrics["nll"]:.4f} | acc {metrics["accuracy"]:.4f}'

  def eval_log_fields(self, metrics, baseline) -> str:
    return (
      f'nll {metrics["nll"]:.4f} (unigram {baseline["nll"]:.4f}) | accuracy '
      f'{metrics["accuracy"]:.4f} (most frequent token {baseline["accuracy"]:.4f})'
    )

  # Data.
  def build_data(self, spec, process_index, process_count) -> TaskData:
    data = data_lib.prepare(spec.data)
    if data.tokenizer.vocab_size > spec.model.vocab_size:
      raise ConfigError(
        f'model.vocab_size={spec.model.vocab_size}: smaller than the '
        f'tokenizer ({data.tokenizer.vocab_size} pieces)'
      )
    return TaskData(
      data.tokenizer,
      data_lib.TrainIterator(data, spec.data, spec.train.seed, process_index, process_count),
      data_lib.EvalBatches(data, spec.data, process_index, process_count),
      unigram_floors(data),
    )

  def summary(self, final, baseline, step: int) -> str:
    return (
      f'final dev nll {final["eval/nll"]:.4f} vs the unigram floor {baseline["nll"]:.4f}; '
      f'token accuracy {final["eval/accuracy"]:.4f} vs {baseline["accuracy"]:.4f} '
      f'(step {step})'
    )


def _shapes(rows: int, length: int) -> dict:
  return {name: ((rows, length), np.int32) for name in _BATCH_KEYS}


def _mean_metrics(sums: Mapping[str, float]) -> dict[str, float]:
  """Per real target token: the optimised (smoothed) loss, the NLL, the accuracy."""
  tokens = max(float(sums['tokens']), 1.0)
  return {
    'loss': sums['smoothed_sum'] / tokens,
    'nll': sums['nll_sum'] / tokens,
    'accuracy': sums['correct_sum'] / tokens,
  }


def unigram_floors(data: data_lib.TranslationData) -> dict[str, float]:
  """Validation targets (each + EOS) scored by a model that ignores source and prefix: the
  NLL of the training targets' unigram distribution (add-one smoothed over the vocabulary)
  and the accuracy of always predicting their most frequent token."""
  vocab = data.tokenizer.vocab_size
  tokens = lambda split: np.concatenate(
    [np.append(t, data.eos_id) for t in data.splits[split].targets]
  ).astype(np.int64)
  counts = np.bincount(tokens('train'), minlength=vocab) + 1.0
  dev = tokens('validation')
  return {
    'nll': float(-np.mean(np.log(counts[dev] / counts.sum()))),
    'accuracy': float(np.mean(dev == np.argmax(counts))),
  }


def validate(config: ml_collections.ConfigDict) -> RunSpec:
  """The RunSpec of `config` (its task a TranslationTask; the decode section in
  `spec.sections['decode']`), or one ConfigError / DataError line naming a bad field. An
  `experiment` section is left to its script."""
  sections = ml_collections.ConfigDict()
  for name in config.keys():
    if name != config_lib.EXPERIMENT_SECTION:
      sections[name] = config[name]
  if 'train' not in sections:
    raise ConfigError('train: missing config section')
  train = from_section(TranslationTrainConfig, 'train', sections.train)
  return train_config.validate_config(sections, task=TranslationTask(train.label_smoothing))

"""Masked-LM pretraining as a task of the generic loop (train/task.py): the project's main job.

Evaluation reports loss and accuracy over all predictions and separately at [MASK], kept and
randomly replaced positions (metrics.py), beside the context-free floors of the eval set
(data/baseline.py): the most frequent token, the copy-aware rule and its unigram loss.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax import data
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.mlm import metrics as mlm_metrics
from realformer_jax.model.losses import mlm_loss_and_metrics, mlm_nll_and_correct
from realformer_jax.model.models import MaskedLM
from realformer_jax.train.task import Task, TaskData

SUM_METRICS = ('mlm_loss_sum', 'mlm_correct_sum', 'mlm_weight')  # add across batches


class MaskedLMTask(Task):
  """MaskedLM on packed, masked sequences of the data pipeline (realformer_jax/data)."""

  name = 'mlm'
  sum_metrics = SUM_METRICS
  loss_sum = 'mlm_loss_sum'
  weight = 'mlm_weight'

  data_config_class = data.DataConfig

  def validate(self, spec) -> None:
    if spec.data.vocab_size > spec.model.vocab_size:
      raise ConfigError(
        f'model.vocab_size={spec.model.vocab_size}: smaller than the tokenizer '
        f'vocabulary data.vocab_size={spec.data.vocab_size}'
      )

  def make_model(self, model_config: ModelConfig) -> MaskedLM:
    return MaskedLM(model_config)

  def batch_shapes(self, data_config, batch_size):
    length, predictions = data_config.max_len, data_config.max_predictions
    return {
      'input_ids': ((batch_size, length), np.int32),
      'segment_ids': ((batch_size, length), np.int32),
      'input_mask': ((batch_size, length), np.int32),
      'masked_positions': ((batch_size, predictions), np.int32),
      'masked_ids': ((batch_size, predictions), np.int32),
      'masked_weights': ((batch_size, predictions), np.float32),
    }

  def model_inputs(self, batch):
    return (
      batch['input_ids'],
      batch['input_mask'],
      batch['segment_ids'],
      batch['masked_positions'],
    )

  def init_variables(self, model, rng, data_config, batch_size):
    # As it always was (ones for the mask); parameters depend on shapes only.
    ids = np.zeros((batch_size, data_config.max_len), np.int32)
    positions = np.zeros((batch_size, data_config.max_predictions), np.int32)
    return model.init(
      {'params': rng},
      ids,
      np.ones_like(ids),
      ids,
      positions,
      deterministic=True,
      step=np.zeros((), np.int32),
    )

  def batch_weight(self, batch) -> jax.Array:
    return jnp.sum(batch['masked_weights'].astype(jnp.float32))

  def loss_sums(self, outputs: jax.Array, batch) -> dict[str, jax.Array]:
    _, sums = mlm_loss_and_metrics(outputs, batch['masked_ids'], batch['masked_weights'])
    return sums

  def eval_outputs(self, outputs: jax.Array, batch) -> dict[str, jax.Array]:
    """Per-slot loss, correctness, target, weight and the id the model saw there ([B, P])."""
    nll_BxP, correct_BxP = mlm_nll_and_correct(outputs, batch['masked_ids'])
    visible_BxP = jnp.take_along_axis(batch['input_ids'], batch['masked_positions'], axis=1)
    return {
      'nll': nll_BxP,
      'correct': correct_BxP,
      'visible_ids': visible_BxP,
      'masked_ids': batch['masked_ids'],
      'masked_weights': batch['masked_weights'],
    }

  def eval_metrics(self, sums: Mapping[str, float], outputs, context: int) -> dict[str, float]:
    """`context`: the tokenizer's [MASK] id (TaskData.eval_context), which tells a [MASK]
    slot from a kept or randomly replaced one."""
    metrics = _mean_metrics(sums)
    if not outputs:
      return metrics
    rows = mlm_metrics.per_row_sums(
      outputs['nll'],
      outputs['correct'],
      outputs['visible_ids'],
      outputs['masked_ids'],
      outputs['masked_weights'],
      context,
    )
    by_kind = mlm_metrics.metrics_from_sums(rows)
    # loss and mlm_accuracy stay the device sums' (the same numbers, summed in float32).
    return {**metrics, **{k: v for k, v in by_kind.items() if k not in metrics}}

  def train_metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
    return _mean_metrics(sums)

  def log_fields(self, metrics: Mapping[str, float]) -> str:
    return f'acc {metrics["mlm_accuracy"]:.4f}'

  def eval_log_fields(self, metrics, baseline) -> str:
    line = (
      f'MLM accuracy {metrics["mlm_accuracy"]:.4f} (most frequent '
      f'{baseline["mlm_accuracy"]:.4f}, copy-aware {baseline["copy_accuracy"]:.4f})'
    )
    if _has_mask_slots(metrics):
      line += (
        f' | at [MASK] {metrics["mask_accuracy"]:.4f} (most frequent '
        f'{baseline["mask_accuracy"]:.4f}), loss {metrics["mask_loss"]:.4f} (token-frequency '
        f'floor {baseline["mask_unigram_loss"]:.4f})'
      )
    return line

  def build_data(self, spec, process_index, process_count) -> TaskData:
    tokenizer = data.prepare(spec.data)
    if tokenizer.vocab_size > spec.model.vocab_size:
      raise ConfigError(
        f'model.vocab_size={spec.model.vocab_size}: smaller than the '
        f'tokenizer vocabulary {tokenizer.vocab_size} ({tokenizer.source})'
      )
    batch_size = spec.train.global_batch_size
    train_iter = data.make_train_iterator(
      spec.data, batch_size, spec.train.seed, process_index, process_count
    )
    eval_batches = data.make_eval_iterator(spec.data, batch_size, process_index, process_count)
    # 'mlm_accuracy' (the most frequent token's) first: the loop reports it as 'baseline'.
    floors = data.context_free_floors(spec.data, batch_size)
    return TaskData(tokenizer, train_iter, eval_batches, floors, eval_context=tokenizer.mask_id)

  def summary(self, final, baseline, step: int) -> str:
    at_mask = _has_mask_slots({k.split('/', 1)[1]: v for k, v in final.items()})
    if not at_mask:  # no [MASK] accuracy to compare (nor to judge the run by)
      print(
        f'note: the eval set has no [MASK] slot ({int(final.get("eval/predictions", 0))} '
        'predictions, all kept or randomly replaced tokens): [MASK] accuracy and loss are not '
        'measured; give more eval text (data.eval_files, data.eval_percent)',
        file=sys.stderr,
        flush=True,
      )
    below = mlm_metrics.below_floors(
      final['eval/loss'], final['eval/mask_accuracy'] if at_mask else None, baseline
    )
    verdict = (
      f'; NOT TRAINED: at or below the context-free floors ({"; ".join(below)}): this model '
      'predicts no better than token frequencies, do not use it'
      if below
      else '; learned: above the context-free floors'
    )
    return (
      f'final eval MLM accuracy {final["eval/mlm_accuracy"]:.4f} vs most-frequent-'
      f'token baseline {baseline["mlm_accuracy"]:.4f} and copy-aware '
      f'{baseline["copy_accuracy"]:.4f}; '
      + (
        f'at [MASK] {final["eval/mask_accuracy"]:.4f} vs {baseline["mask_accuracy"]:.4f}; '
        if at_mask
        else ''
      )
      + f'eval loss {final["eval/loss"]:.4f} vs the copy-aware '
      f'unigram loss {baseline["copy_unigram_loss"]:.4f} (step {step}){verdict}'
    )


def _has_mask_slots(metrics: Mapping[str, float]) -> bool:
  """Whether the evaluation held a [MASK] slot (a tiny eval set may hold only kept or randomly
  replaced ones: its [MASK] accuracy is then no number)."""
  return metrics.get('mask_predictions', 0) > 0 and np.isfinite(metrics['mask_accuracy'])


def _mean_metrics(sums: Mapping[str, Any]) -> dict[str, float]:
  """Loss and accuracy per prediction."""
  weight = max(sums['mlm_weight'], 1.0)
  return {'loss': sums['mlm_loss_sum'] / weight, 'mlm_accuracy': sums['mlm_correct_sum'] / weight}

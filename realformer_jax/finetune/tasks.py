"""Fine-tuning tasks for the generic training loop (realformer_jax/train/task.py).

    task = make_task(config)          # by the dataset's kind: the entry point picks it once
    train.train_and_evaluate(config, workdir, task=task)

  ClassificationTask   SequenceClassifier, cross-entropy; accuracy, F1 (two classes),
                       Matthews correlation; baseline: always the train split's majority class
  RegressionTask       SequenceClassifier with one output, squared error; Pearson, Spearman,
                       MSE; baseline: always the train split's mean
  SpanTask             SpanExtractor, mean of start and end cross-entropies over windows;
                       SQuAD exact match / F1 after span post-processing (squad.py);
                       baseline: always answering '' (no answer)

Evaluation sums the loss on the device and pulls each row's prediction (or logits) with its
example index to the host, where the metrics are computed over the whole split.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from realformer_jax.config import ConfigError, ModelConfig, from_section
from realformer_jax.finetune import batches as batches_lib
from realformer_jax.finetune import config as config_lib
from realformer_jax.finetune import datasets, encoding, squad
from realformer_jax.finetune import metrics as metrics_lib
from realformer_jax.finetune.starting_point import StartingPoint, place_like
from realformer_jax.model.models import SequenceClassifier, SpanExtractor
from realformer_jax.train.task import Task, TaskData

_INPUTS = ('input_ids', 'segment_ids', 'input_mask')


def make_task(config: ml_collections.ConfigDict) -> 'FinetuneTask':
  """The task of a fine-tuning config, by its dataset's kind (read here, at the entry point;
  the rest of the config is validated into a RunSpec by train.validate_config)."""
  finetune = from_section(config_lib.FinetuneConfig, 'finetune', config.finetune)
  dataset = datasets.spec_of(config.data)
  return {
    datasets.CLASSIFICATION: ClassificationTask,
    datasets.REGRESSION: RegressionTask,
    datasets.SPAN: SpanTask,
  }[dataset.kind](dataset, finetune)


class FinetuneTask(Task):
  """What the three fine-tuning tasks share: config, starting point, tokenizer, batches."""

  data_config_class = config_lib.FinetuneDataConfig

  def __init__(self, dataset: datasets.DatasetSpec, finetune: config_lib.FinetuneConfig):
    self.spec = dataset
    self.name = dataset.name
    self.finetune = finetune
    self.best_metric = finetune.best_metric or dataset.metric
    # Reads only configs (cheap, before anything is compiled).
    self.starting_point = StartingPoint.from_config(finetune)

  # Config.
  def extra_sections(self):
    return {'finetune': config_lib.FinetuneConfig}

  def model_config(self, section) -> ModelConfig:
    return self.starting_point.model_config(section)

  def validate(self, spec) -> None:
    if spec.sections['finetune'] != self.finetune:
      raise ConfigError(
        'finetune: the config differs from the one its task was made from '
        '(make the task with finetune.make_task(config))'
      )
    model = spec.model
    if self.uses_segments and model.type_vocab_size < 2:
      raise ConfigError(
        f'model.type_vocab_size={model.type_vocab_size}: {self.name} has two '
        'segments (text pairs / question and context)'
      )
    if self.best_metric not in self.metric_names:
      raise ConfigError(
        f'finetune.best_metric={self.best_metric!r}: {self.name} reports '
        f'{", ".join(self.metric_names)}'
      )

  uses_segments = property(lambda self: len(self.spec.text_features) > 1)
  metric_names: tuple[str, ...] = ()

  # Model and batch.
  def model_inputs(self, batch):
    return batch['input_ids'], batch['input_mask'], batch['segment_ids']

  def batch_weight(self, batch) -> jax.Array:
    return jnp.sum(batch['weights'])

  def _input_shapes(self, data_config, batch_size) -> dict:
    shapes = {name: ((batch_size, data_config.max_len), np.int32) for name in _INPUTS}
    shapes['weights'] = ((batch_size,), np.float32)
    return shapes

  # Data and starting point.
  def tokenizer(self, data_config):
    return self.starting_point.tokenizer(data_config)

  def check_vocabulary(self, tokenizer, model_config: ModelConfig) -> None:
    if tokenizer.vocab_size > model_config.vocab_size:
      raise ConfigError(
        f'model.vocab_size={model_config.vocab_size} '
        f'({self.starting_point.describe()}): smaller than the tokenizer '
        f'vocabulary {tokenizer.vocab_size} ({tokenizer.source})'
      )

  def initial_params(self, params, setup):
    source = self.starting_point
    if source.kind == 'random':
      return params
    loaded = source.load_encoder(setup.model.config)
    merged = dict(params)
    for name, subtree in loaded.items():
      if name in params:  # a checkpoint's pooler, when the model has one
        merged[name] = place_like(subtree, params[name], f'params/{name}')
    return merged

  def train_size(self, data_config) -> int:
    """Training examples (SQuAD: windows) in the train split."""
    return len(self._train_arrays(data_config)['weights'])

  def build_data(self, spec, process_index, process_count) -> TaskData:
    tokenizer = self.tokenizer(spec.data)
    self.check_vocabulary(tokenizer, spec.model)
    train_arrays = self._train_arrays(spec.data)
    eval_arrays, targets = self._eval_data(spec.data, datasets.split_name(spec.data, 'eval'))
    batch_size = spec.train.global_batch_size
    return TaskData(
      tokenizer,
      batches_lib.ExampleIterator(
        train_arrays, batch_size, spec.train.seed, process_index, process_count
      ),
      batches_lib.eval_batches(eval_arrays, batch_size, process_index, process_count),
      self.baseline(train_arrays, targets),
      eval_context=targets,  # what eval_metrics compares against
    )

  def eval_split_data(self, spec, split: str, process_index=0, process_count=1):
    """(eval batches, baseline, eval context: the split's targets) of another split (e.g.
    the test split)."""
    eval_arrays, targets = self._eval_data(spec.data, split)
    batches = batches_lib.eval_batches(
      eval_arrays, spec.train.global_batch_size, process_index, process_count
    )
    return batches, self.baseline(self._train_arrays(spec.data), targets), targets

  def _train_arrays(self, data_config) -> dict[str, np.ndarray]:
    return _cached_arrays(self, data_config, datasets.split_name(data_config, 'train'), 'train')

  def summary(self, final, baseline, step: int) -> str:
    metric = self.best_metric
    return (
      f'final eval {metric} {final[f"eval/{metric}"]:.4f} vs {self.baseline_name} '
      f'{baseline[metric]:.4f} (eval loss {final["eval/loss"]:.4f}, step {step})'
    )

  def eval_log_fields(self, metrics, baseline) -> str:
    return ' | '.join(f'{name} {metrics[name]:.4f}' for name in self.metric_names) + (
      f' ({self.baseline_name} {self.best_metric} {baseline[self.best_metric]:.4f})'
    )

  baseline_name = 'baseline'

  # Subclasses.
  def encode_split(self, data_config, split: str) -> tuple[dict[str, np.ndarray], Any]:
    """(arrays [N, ...] with 'weights' and '<...>_index', eval targets) of a split."""
    raise NotImplementedError

  def baseline(self, train_arrays, eval_targets) -> dict[str, float]:
    raise NotImplementedError

  def _eval_data(self, data_config, split):
    return _cached_arrays(self, data_config, split, 'eval')


def _cached_arrays(task: FinetuneTask, data_config, split: str, role: str):
  """Encoded split, memoized per process by everything it depends on."""
  key = (task.name, split, data_config, task.finetune.init, task.finetune.hf_config)
  arrays, targets = _ENCODED.get(key) or _ENCODED.setdefault(
    key, task.encode_split(data_config, split)
  )
  return arrays if role == 'train' else (arrays, targets)


_ENCODED: dict[tuple, tuple] = {}


class ClassificationTask(FinetuneTask):
  sum_metrics = ('loss_sum', 'correct_sum', 'weight')
  baseline_name = 'majority-class baseline'

  @property
  def metric_names(self):
    names = ('accuracy', 'matthews_corrcoef')
    return names + (('f1',) if self.spec.num_classes == 2 else ())

  def make_model(self, model_config):
    # One output a class; a regression's one output (DatasetSpec.num_classes is 1 there).
    return SequenceClassifier(model_config, self.spec.num_classes)

  def batch_shapes(self, data_config, batch_size):
    return dict(
      self._input_shapes(data_config, batch_size),
      labels=((batch_size,), np.int32),
      example_index=((batch_size,), np.int32),
    )

  def loss_sums(self, outputs, batch):
    logits_BxC = outputs.astype(jnp.float32)
    nll_B = (
      jax.nn.logsumexp(logits_BxC, axis=-1)
      - jnp.take_along_axis(logits_BxC, batch['labels'][:, None], axis=-1)[:, 0]
    )
    correct_B = (jnp.argmax(logits_BxC, axis=-1) == batch['labels']).astype(jnp.float32)
    weights_B = batch['weights']
    return {
      'loss_sum': jnp.sum(nll_B * weights_B),
      'correct_sum': jnp.sum(correct_B * weights_B),
      'weight': jnp.sum(weights_B),
    }

  def eval_outputs(self, outputs, batch):
    return {
      'prediction': jnp.argmax(outputs, axis=-1).astype(jnp.int32),
      'example_index': batch['example_index'],
    }

  def train_metrics(self, sums):
    weight = max(sums['weight'], 1.0)
    return {'loss': sums['loss_sum'] / weight, 'accuracy': sums['correct_sum'] / weight}

  def log_fields(self, metrics):
    return f'acc {metrics["accuracy"]:.4f}'

  def scores(self, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    scores = {
      'accuracy': metrics_lib.accuracy(predictions, labels),
      'matthews_corrcoef': metrics_lib.matthews_corrcoef(predictions, labels),
    }
    if self.spec.num_classes == 2:
      scores['f1'] = metrics_lib.binary_f1(predictions, labels)
    return scores

  def eval_metrics(self, sums, outputs, context):
    """`context`: the eval split's labels."""
    predictions = _in_example_order(outputs, 'prediction', len(context))
    return {
      'loss': sums['loss_sum'] / max(sums['weight'], 1.0),
      **self.scores(predictions, context),
    }

  def baseline(self, train_arrays, eval_targets):
    majority = np.bincount(train_arrays['labels'], minlength=self.spec.num_classes).argmax()
    return self.scores(np.full(len(eval_targets), majority), eval_targets)

  def encode_split(self, data_config, split):
    texts = datasets.labelled_texts(data_config, split)
    arrays = encoding.encode_texts(
      self.tokenizer(data_config), texts['texts_a'], texts['texts_b'], data_config.max_len
    )
    labels = np.asarray(texts['labels'], self.batch_shapes(data_config, 1)['labels'][1])
    arrays.update(
      labels=labels,
      weights=np.ones(len(labels), np.float32),
      example_index=np.arange(len(labels), dtype=np.int32),
    )
    return arrays, labels


class RegressionTask(ClassificationTask):
  sum_metrics = ('loss_sum', 'weight')
  baseline_name = 'train-mean baseline'
  metric_names = ('pearson', 'spearman', 'mse')
  best_mode = 'max'

  def batch_shapes(self, data_config, batch_size):
    shapes = super().batch_shapes(data_config, batch_size)
    shapes['labels'] = ((batch_size,), np.float32)
    return shapes

  def loss_sums(self, outputs, batch):
    error_B = outputs[:, 0].astype(jnp.float32) - batch['labels']
    return {
      'loss_sum': jnp.sum(error_B * error_B * batch['weights']),
      'weight': jnp.sum(batch['weights']),
    }

  def eval_outputs(self, outputs, batch):
    return {
      'prediction': outputs[:, 0].astype(jnp.float32),
      'example_index': batch['example_index'],
    }

  def train_metrics(self, sums):
    return {'loss': sums['loss_sum'] / max(sums['weight'], 1.0)}

  def log_fields(self, metrics):
    return ''  # the loss is the squared error

  def scores(self, predictions, labels):
    return {
      'pearson': metrics_lib.pearson(predictions, labels),
      'spearman': metrics_lib.spearman(predictions, labels),
      'mse': float(np.mean((np.asarray(predictions, np.float64) - labels) ** 2)),
    }

  def baseline(self, train_arrays, eval_targets):
    return self.scores(np.full(len(eval_targets), train_arrays['labels'].mean()), eval_targets)


class SpanTask(FinetuneTask):
  uses_segments = True
  baseline_name = "always-'' baseline"

  @property
  def metric_names(self):
    return ('exact_match', 'f1')

  @property
  def version_2(self) -> bool:
    return self.spec.unanswerable

  def make_model(self, model_config):
    return SpanExtractor(model_config)

  def batch_shapes(self, data_config, batch_size):
    return dict(
      self._input_shapes(data_config, batch_size),
      start_positions=((batch_size,), np.int32),
      end_positions=((batch_size,), np.int32),
      feature_index=((batch_size,), np.int32),
    )

  def loss_sums(self, outputs, batch):
    def nll(logits_BxL, positions_B):
      return (
        jax.nn.logsumexp(logits_BxL, axis=-1)
        - jnp.take_along_axis(logits_BxL, positions_B[:, None], axis=-1)[:, 0]
      )

    start_BxL, end_BxL = outputs
    nll_B = 0.5 * (nll(start_BxL, batch['start_positions']) + nll(end_BxL, batch['end_positions']))
    return {'loss_sum': jnp.sum(nll_B * batch['weights']), 'weight': jnp.sum(batch['weights'])}

  def eval_outputs(self, outputs, batch):
    start_BxL, end_BxL = outputs
    return {
      'start_logits': start_BxL,
      'end_logits': end_BxL,
      'feature_index': batch['feature_index'],
    }

  def train_metrics(self, sums):
    return {'loss': sums['loss_sum'] / max(sums['weight'], 1.0)}

  def eval_metrics(self, sums, outputs, context):
    """`context`: the eval split's (examples, features, data config)."""
    examples, features, data = context
    count = len(features.example_index)
    predictions = squad.predict(
      examples,
      features,
      _in_example_order(outputs, 'start_logits', count, 'feature_index'),
      _in_example_order(outputs, 'end_logits', count, 'feature_index'),
      version_2=self.version_2,
      max_answer_len=data.max_answer_len,
      n_best=data.n_best,
      null_threshold=data.null_threshold,
    )
    return {
      'loss': sums['loss_sum'] / max(sums['weight'], 1.0),
      **{k: v for k, v in squad.score(examples, predictions).items() if k in self.metric_names},
    }

  def baseline(self, train_arrays, eval_targets):
    examples = eval_targets[0]
    scores = squad.score(examples, [''] * len(examples.questions))
    return {k: scores[k] for k in self.metric_names}

  def encode_split(self, data_config, split):
    examples = squad.examples_from_records(datasets.read_records(data_config, split))
    features = squad.make_features(
      examples,
      self.tokenizer(data_config),
      data_config.max_len,
      data_config.doc_stride,
      data_config.max_query_len,
    )
    arrays = dict(
      features.arrays,
      weights=np.ones(len(features.example_index), np.float32),
      feature_index=np.arange(len(features.example_index), dtype=np.int32),
    )
    return arrays, (examples, features, data_config)


def _in_example_order(
  outputs: Mapping[str, np.ndarray], name: str, count: int, index_name: str = 'example_index'
) -> np.ndarray:
  """outputs[name] rows sorted by their index, padding rows (index -1) dropped; every index
  in [0, count) must occur once."""
  index = outputs[index_name]
  real = index >= 0
  values, index = outputs[name][real], index[real]
  if len(index) != count or len(np.unique(index)) != count:
    raise AssertionError(f'eval produced {len(index)} rows for {count} examples')
  ordered = np.empty((count,) + values.shape[1:], values.dtype)
  ordered[index] = values
  return ordered

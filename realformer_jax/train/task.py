"""What the training loop needs to know about a task, and nothing else.

The loop (loop.py), steps (step.py) and setup (build.py: mesh, state init, compiled steps) are
written against this interface and know no task: masked-LM pretraining (realformer_jax/mlm), the
fine-tuning tasks (classification, regression, span extraction; realformer_jax/finetune) and
translation (realformer_jax/seq2seq) are packages above this one, each a `Task`.

The entry points that take no task (`train.train_and_evaluate(config, workdir)`) train the
default task: masked-LM pretraining (realformer_jax/mlm), which this package names only by
its import path and imports on first use (config.py: `default_task`, `set_default_task`;
its validate_config takes the default when given no task).

A task (`Task`) is three parts and its data: `TaskConfig` (read by config.py), `TaskModel`
(all the compiled steps need: step.py, build.py), `TaskConsole` (its words on the
console, loop.py). A task says
  * its config: the `data` section's schema (a frozen dataclass that checks itself), any extra
    sections, how the `model` section becomes a ModelConfig, and checks across sections (on the
    validated RunSpec, train/config.py);
  * its model and batch: the Flax module, the batch arrays' shapes (for ahead-of-time
    compilation; several when its data is length-bucketed, each compiled once), which batch
    arrays the model is called with (the first, its token ids: their longest length is where
    how attention runs is decided);
  * its loss: per-(micro)batch sums that add across batches, devices and microbatches
    (`sum_metrics`; the loss is `sums[loss_sum] / sums[weight]`);
  * its evaluation: sums added on the device, plus optional per-example outputs pulled to the
    host for metrics that are not sums (F1, Matthews correlation, SQuAD EM/F1);
  * its data: tokenizer, an endless checkpointable train iterator, eval batches, a baseline,
    and what its eval metrics need from the data (`TaskData.eval_context`, handed back to
    `eval_metrics`: a task keeps no state between building its data and scoring);
  * its starting point: `initial_params` may replace freshly initialised parameters (e.g. with
    a pretrained encoder) before the first step.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

import jax
import ml_collections
import numpy as np

from realformer_jax.config import ModelConfig, from_section, to_config_dict
from realformer_jax.train.config import TrainConfig

if TYPE_CHECKING:
  from realformer_jax.train.config import RunSpec

Batch = dict[str, jax.Array]


@dataclasses.dataclass
class TaskData:
  tokenizer: Any  # realformer_jax.data.Tokenizer (copied into the workdir)
  train_iter: Any  # endless grain-style iterator: next(), get_state(), set_state(), close()
  eval_batches: Iterable[dict]  # one finite pass of this process's eval batches; re-iterable
  baseline: dict[str, float]  # eval metrics of a model that ignores its input (unprefixed)
  # What eval_metrics needs from the data besides the outputs (e.g. fine-tuning: the eval
  # split's targets), handed to it by the loop.
  eval_context: Any = None


class TaskConfig:
  """A task's config: its sections' schemas and the checks across them (config.py)."""

  model_config_class: type = ModelConfig  # the `model` section's (seq2seq adds its decoder)
  data_config_class: type = type(None)  # the `data` section's schema (a frozen dataclass)
  train_config_class: type = TrainConfig  # the `train` section's (a task may add fields)

  def extra_sections(self) -> dict[str, type]:
    """Config sections beyond model / data / train / mesh / rules / distributed: name ->
    schema (a frozen dataclass that checks itself)."""
    return {}

  def default_data_config(self) -> ml_collections.ConfigDict:
    """The editable `data` section, from the schema's defaults."""
    return to_config_dict(self.data_config_class())

  def data_config(self, section: Mapping[str, Any]) -> Any:
    """The checked data section (raises ConfigError / DataError naming the field)."""
    return from_section(self.data_config_class, 'data', section)

  def model_config(self, section: Mapping[str, Any]) -> ModelConfig:
    """The ModelConfig (model_config_class) of the `model` section."""
    return self.model_config_class.from_mapping(section)

  def validate(self, spec: 'RunSpec') -> None:
    """Checks across sections (after each section's own checks)."""


class TaskModel:
  """What the compiled steps run (build.py, step.py): the model and its batches, the
  loss as sums that add across batches, devices and microbatches (`sum_metrics`; the loss is
  `sums[loss_sum] / sums[weight]`), and the metrics made from those sums."""

  sum_metrics: tuple[str, ...] = ('loss_sum', 'weight')
  loss_sum = 'loss_sum'  # the summed loss; the optimised loss is loss_sum / weight
  weight = 'weight'  # the number of predictions the loss is summed over

  # Model and batch.
  def make_model(self, model_config: ModelConfig) -> Any:
    raise NotImplementedError

  def batch_shapes(
    self, data_config: Any, batch_size: int
  ) -> dict[str, tuple[tuple[int, ...], Any]]:
    """{name: (shape, dtype)} of one batch of `batch_size` rows (the data contract)."""
    raise NotImplementedError

  def data_batch_shapes(self, data_config: Any, batch_size: int) -> list[dict]:
    """Every batch shape the data yields, each compiled once (default: `batch_shapes`; a task
    with length buckets has one per bucket)."""
    return [self.batch_shapes(data_config, batch_size)]

  def batch_rows(self, spec: 'RunSpec') -> dict[str, int]:
    """{what sets it: rows} of every global batch shape (each must split over the devices)."""
    return {'train.global_batch_size': spec.train.global_batch_size}

  def tokens_per_step(self, spec: 'RunSpec') -> int:
    """Padded tokens of one global batch (the throughput line's unit)."""
    return spec.train.global_batch_size * spec.data.max_len

  def model_inputs(self, batch: Mapping[str, jax.Array]) -> tuple:
    """Positional arguments of the model call, taken from a batch."""
    raise NotImplementedError

  def forward(
    self, model: Any, params: Any, batch: Batch, *, step: jax.Array, rng: Optional[jax.Array]
  ) -> Any:
    """The model's outputs on `batch`; dropout on iff `rng` is given."""
    deterministic = rng is None
    return model.apply(
      {'params': params},
      *self.model_inputs(batch),
      deterministic=deterministic,
      step=step,
      rngs=None if deterministic else {'dropout': rng},
    )

  def sequence_length(self, data_config: Any) -> int:
    """The longest sequence the model reads: how attention runs is decided once, at this
    length (residual_carry='auto' and the kernel check; train/build.py). The model's first
    input is its token ids, [rows, length], and `batch_shapes` is the longest batch."""
    return self.model_inputs(self._zeros(data_config, 1))[0].shape[1]

  def init_variables(self, model: Any, rng: jax.Array, data_config: Any, batch_size: int) -> dict:
    """model.init on a batch of zeros (parameters depend on shapes only)."""
    zeros = self._zeros(data_config, batch_size)
    return model.init(
      {'params': rng}, *self.model_inputs(zeros), deterministic=True, step=np.zeros((), np.int32)
    )

  def _zeros(self, data_config: Any, batch_size: int) -> dict[str, np.ndarray]:
    return {
      name: np.zeros(shape, dtype)
      for name, (shape, dtype) in self.batch_shapes(data_config, batch_size).items()
    }

  # Loss and evaluation.
  def batch_weight(self, batch: Batch) -> jax.Array:
    """The batch's number of predictions (float32 scalar): the loss is divided by it."""
    raise NotImplementedError

  def loss_sums(self, outputs: Any, batch: Batch) -> dict[str, jax.Array]:
    """Sums (float32 scalars, `sum_metrics`) of one (micro)batch."""
    raise NotImplementedError

  def eval_outputs(self, outputs: Any, batch: Batch) -> dict[str, jax.Array]:
    """Per-row arrays to pull to the host for metrics that are not sums (default: none)."""
    del outputs, batch
    return {}

  def eval_metrics(
    self, sums: Mapping[str, float], outputs: Mapping[str, np.ndarray], context: Any
  ) -> dict[str, float]:
    """Eval metrics (unprefixed) from the summed metrics, the concatenated outputs and the
    eval data's `TaskData.eval_context`."""
    raise NotImplementedError

  def train_metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
    """Train metrics (unprefixed, 'loss' first) from sums over a log interval."""
    raise NotImplementedError


class TaskConsole:
  """A task's words on the console: its part of the train and eval lines, the last line."""

  def log_fields(self, metrics: Mapping[str, float]) -> str:
    """The task's part of a train console line, e.g. 'acc 0.1234', from unprefixed metrics."""
    return ''

  def eval_log_fields(self, metrics: Mapping[str, float], baseline: Mapping[str, float]) -> str:
    """The task's part of an eval console line (after the loss)."""
    return f'{self.log_fields(metrics)} (baseline {self.log_fields(baseline)})'

  def summary(self, final: Mapping[str, float], baseline: Mapping[str, float], step: int) -> str:
    """The run's last console line."""
    raise NotImplementedError


class Task(TaskConfig, TaskModel, TaskConsole):
  """A whole task: config, model and console parts, its data and starting point, and the
  metric that picks the best checkpoint. A task overrides what differs from the defaults."""

  name = 'task'
  best_metric: Optional[str] = None  # eval metric that picks the best checkpoint (None: off)
  best_mode = 'max'  # 'max' or 'min'

  # Data and starting point.
  def build_data(self, spec: 'RunSpec', process_index: int, process_count: int) -> TaskData:
    raise NotImplementedError

  def initial_params(self, params: Any, setup: Any) -> Any:
    """Parameters of a fresh run (default: the random init). `params` is that init, sharded
    as `setup.layout.shardings.params`; the result must have the same shapes and shardings."""
    del setup
    return params


def prefixed(metrics: Mapping[str, float], prefix: str) -> dict[str, float]:
  return {f'{prefix}/{name}': value for name, value in metrics.items()}

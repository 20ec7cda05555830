"""The fine-tuning config: the pretraining sections plus `finetune`, a task `data` section, and
a `model` section whose fields default to "whatever the starting checkpoint has".

    model      ModelConfig fields; None (the default) = from the starting checkpoint (random
               init: ModelConfig's default). Only FINETUNE_MODEL_FIELDS (dropout, dtype,
               layout of the computation) may differ from a checkpoint; any other set field
               that differs is a one-line ConfigError naming both values.
    data       dataset (datasets.py), splits, tokenizer, sequence and SQuAD window settings
    finetune   starting point (init), epochs, warmup, the metric that picks the best checkpoint
    train, mesh, logical_axis_rules, distributed   as for pretraining (train/config.py);
               train.num_train_steps, warmup_steps, eval_every_steps and checkpoint_every_steps
               are derived from finetune.num_epochs (evaluation and a checkpoint every epoch)
"""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from realformer_jax.config import ConfigError, ModelConfig, fields_of, to_config_dict
from realformer_jax.data.errors import DataError
from realformer_jax.finetune import datasets
from realformer_jax.train import config as train_config

# May differ from the starting checkpoint: they change how the model is trained (dropout) or
# computed (dtype, scan layout, remat, kernels), not which function its weights define.
FINETUNE_MODEL_FIELDS = fields_of('regularisation', 'execution')


def default_model_config() -> ml_collections.ConfigDict:
  """Every ModelConfig field as a typed placeholder (None = from the starting checkpoint)."""
  c = ml_collections.ConfigDict()
  for field in dataclasses.fields(ModelConfig):
    kind = train_config.MODEL_FIELD_TYPES.get(field.name, type(field.default))
    c[field.name] = config_dict.placeholder(kind)
  return c


@dataclasses.dataclass(frozen=True)
class FinetuneDataConfig:
  """The fine-tuning `data` section. Hashable: it keys the per-process encoded-split cache."""

  dataset: str = 'bible_sections'  # datasets.DATASETS: embedded bible_*, glue/*, squad/*, files
  # Your own labelled files (dataset='files'; --train_file sets both): .csv / .tsv / .jsonl
  # (classification) or SQuAD-format .json (span extraction); finetune/files.py.
  train_file: str = ''  # the classes are its labels
  validation_file: str = ''  # evaluated each epoch: picks the best checkpoint
  test_file: str = ''  # optional: evaluated once with the best checkpoint
  text_column: str = 'text'  # tables: the text
  text_pair_column: str = ''  # tables: the second text of a pair ('' = one text)
  label_column: str = 'label'  # tables: the class (any value; the train file's set the classes)
  data_dir: str = '~/tensorflow_datasets'  # TFDS data dir (GLUE / SQuAD prepared as array_record)
  download: bool = False  # let TFDS download and prepare a missing catalog dataset
  train_split: str = ''  # '' = the dataset's default (train)
  eval_split: str = ''  # '' = the dataset's default (validation; MNLI: validation_matched)
  test_split: str = ''  # '' = the dataset's labelled test split if it has one (embedded tasks)
  max_examples: int = (
    -1
  )  # N examples per split (-1: all; embedded tasks: evenly spaced); smoke runs
  # Tokenizer: '' = the starting checkpoint's (a workdir's copy; vocab.txt beside Hugging Face
  # weights; random init: SentencePiece trained on the embedded pretraining corpus).
  vocab_file: str = ''
  lower_case: bool = True  # WordPiece vocab.txt: BERT uncased
  vocab_size: int = 8000  # random init without vocab_file: pieces of that trained tokenizer
  max_len: int = 128  # tokens per sequence, [CLS] and [SEP]s included
  doc_stride: int = 128  # SQuAD: tokens between the starts of consecutive context windows
  max_query_len: int = 64  # SQuAD: question tokens kept
  max_answer_len: int = 30  # SQuAD: longest predicted answer, in tokens
  n_best: int = 20  # SQuAD: start / end candidates per window
  null_threshold: float = 0.0  # SQuAD v2.0: answer '' when no-answer score - best span > this

  def __post_init__(self):
    def need(ok: bool, field: str, rule: str):
      if not ok:
        raise DataError(f'data config: {field}={getattr(self, field)!r} is invalid: {rule}.')

    kind = datasets.spec_of(self).kind  # an unknown dataset or an unreadable file: DataError
    need(self.max_len >= 4, 'max_len', 'need room for [CLS], two texts and two [SEP]s')
    need(self.max_examples == -1 or self.max_examples > 0, 'max_examples', 'must be -1 or > 0')
    need(self.vocab_size > 5, 'vocab_size', 'must exceed the 5 special tokens')
    if kind == datasets.SPAN:
      need(self.doc_stride > 0, 'doc_stride', 'must be positive')
      need(self.max_query_len > 0, 'max_query_len', 'must be positive')
      need(
        self.max_query_len + 4 <= self.max_len,
        'max_query_len',
        'must leave room in data.max_len for [CLS], [SEP]s and one context token',
      )
      need(self.max_answer_len > 0, 'max_answer_len', 'must be positive')
      need(self.n_best > 0, 'n_best', 'must be positive')


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
  """The `finetune` section: where training starts, how long, which metric picks the best."""

  # Starting point: '' = random init; a workdir of experiments.train (its latest checkpoint,
  # or init_step); a Hugging Face BERT checkpoint file (.safetensors, or a PyTorch .bin state
  # dict where torch is installed) with its config.json beside it (or hf_config).
  init: str = ''
  init_step: int = -1  # the workdir checkpoint's step; -1 = its latest
  hf_config: str = ''  # the Hugging Face config.json; '' = the one beside init
  num_epochs: float = 3  # passes over the train split
  warmup_fraction: float = 0.1  # of the steps, linear warmup (then linear decay to 0)
  best_metric: str = ''  # eval metric that picks the kept best checkpoint; '' = the dataset's

  def __post_init__(self):
    if not (isinstance(self.num_epochs, (int, float)) and self.num_epochs > 0):
      raise ConfigError(f'finetune.num_epochs={self.num_epochs!r}: must be positive')
    if not 0 <= self.warmup_fraction < 1:
      raise ConfigError(f'finetune.warmup_fraction={self.warmup_fraction!r}: must be in [0, 1)')


def default_data_config() -> ml_collections.ConfigDict:
  return to_config_dict(FinetuneDataConfig())


def default_finetune_config() -> ml_collections.ConfigDict:
  return to_config_dict(FinetuneConfig())


def default_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = default_model_config()
  config.data = default_data_config()
  config.finetune = default_finetune_config()
  train = train_config.default_train_config()
  # BERT's fine-tuning recipe (batch 32, lr 2e-5 .. 5e-5, 3 epochs, 10% warmup).
  train.global_batch_size = 32
  train.learning_rate = 5e-5
  train.log_every_steps = 50
  train.keep_checkpoints = 1
  config.train = train
  config.mesh = train_config.default_mesh_config()
  config.logical_axis_rules = train_config.DEFAULT_LOGICAL_AXIS_RULES
  config.distributed = train_config.default_distributed_config()
  return config

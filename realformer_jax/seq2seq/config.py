"""The translation run's config: model, data, train and decode sections, checked once.

    config = default_translation_config()        # the editable ConfigDict; configs/translate.py
    spec = validate(config)                      # TranslationSpec of frozen sections, or one
                                                 # ConfigError / DataError line naming the field

An `experiment` section may ride along (experiments/translate.py reads it); any other unknown
section or field is an error.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from realformer_jax.config import ConfigError, ModelConfig, from_section, to_config_dict
from realformer_jax.seq2seq.data import TranslationDataConfig, default_translation_data_config
from realformer_jax.train.defaults import default_model_config

# Owned by the experiment script, not checked here.
EXPERIMENT_SECTION = 'experiment'


def _require(ok: bool, field: str, value, rule: str) -> None:
  if not ok:
    raise ConfigError(f'{field}={value!r}: {rule}')


@dataclasses.dataclass(frozen=True)
class TranslationTrainConfig:
  """The `train` section of a translation run (the optimizer fields match train.TrainConfig's,
  so the shared schedule and optimizer read either)."""

  num_train_steps: int = 2000
  warmup_steps: int = 200  # linear warmup to learning_rate, then linear decay to 0
  learning_rate: float = 1e-3
  weight_decay: float = 0.01
  adam_b1: float = 0.9
  adam_b2: float = 0.98  # Transformer NMT's value
  adam_eps: float = 1e-9
  clip_grad_norm: float = 1.0  # 0 = off
  label_smoothing: float = 0.1
  log_every_steps: int = 50
  eval_every_steps: int = 500  # dev loss (also at the last step)
  seed: int = 0  # params init, dropout and batch order

  def __post_init__(self):
    _require(
      self.num_train_steps > 0, 'train.num_train_steps', self.num_train_steps, 'must be positive'
    )
    _require(
      0 <= self.warmup_steps < self.num_train_steps,
      'train.warmup_steps',
      self.warmup_steps,
      'must be in [0, num_train_steps)',
    )
    _require(self.learning_rate > 0, 'train.learning_rate', self.learning_rate, 'must be positive')
    _require(
      0.0 <= self.label_smoothing < 1.0,
      'train.label_smoothing',
      self.label_smoothing,
      'must be in [0, 1)',
    )
    _require(
      self.log_every_steps > 0, 'train.log_every_steps', self.log_every_steps, 'must be positive'
    )
    _require(
      self.eval_every_steps > 0, 'train.eval_every_steps', self.eval_every_steps, 'must be positive'
    )


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """The `decode` section: how BLEU's outputs are searched."""

  batch_size: int = 64  # sources per decoding call
  beam_size: int = 4
  alpha: float = 0.6  # GNMT length penalty ((5 + |y|) / 6) ** alpha in beam search
  # Output length limit: length_ratio * the padded source length (the last bucket), at most
  # model.max_len. One shape for every decoding call: each search compiles once.
  length_ratio: float = 1.5

  def __post_init__(self):
    _require(self.batch_size > 0, 'decode.batch_size', self.batch_size, 'must be positive')
    _require(self.beam_size > 0, 'decode.beam_size', self.beam_size, 'must be positive')
    _require(self.length_ratio > 0, 'decode.length_ratio', self.length_ratio, 'must be positive')


@dataclasses.dataclass(frozen=True)
class TranslationSpec:
  """A validated translation run."""

  model: ModelConfig
  data: TranslationDataConfig
  train: TranslationTrainConfig
  decode: DecodeConfig


def default_translation_config() -> ml_collections.ConfigDict:
  """Every field a translation run can set; configs/translate.py sizes it."""
  config = ml_collections.ConfigDict()
  config.data = default_translation_data_config()
  config.model = default_model_config(
    ModelConfig(
      hidden_size=256,
      num_layers=3,
      num_decoder_layers=3,
      num_heads=4,
      mlp_dim=1024,
      max_len=128,
      ln_placement='post',
      init='ds_init',
      decoder_attention='standard',
    )
  )
  config.model.vocab_size = config.data.get_ref('vocab_size')
  config.train = to_config_dict(TranslationTrainConfig())
  config.decode = to_config_dict(DecodeConfig())
  return config


def validate(config: ml_collections.ConfigDict) -> TranslationSpec:
  """The TranslationSpec of `config`; one-line ConfigError / DataError naming a bad field."""
  sections = ('model', 'data', 'train', 'decode')
  for name in config.keys():
    if name not in sections + (EXPERIMENT_SECTION,):
      raise ConfigError(f'{name}: unknown config section (known: {", ".join(sections)})')
  spec = TranslationSpec(
    model=ModelConfig.from_mapping(config.model),
    data=from_section(TranslationDataConfig, 'data', config.data),
    train=from_section(TranslationTrainConfig, 'train', config.train),
    decode=from_section(DecodeConfig, 'decode', config.decode),
  )
  if (
    spec.model.position_embedding == 'learned' and spec.model.max_len < spec.data.bucket_lengths[-1]
  ):
    raise ConfigError(
      f'model.max_len={spec.model.max_len}: the learned position table must '
      f'cover the longest bucket, data.bucket_lengths[-1]='
      f'{spec.data.bucket_lengths[-1]}'
    )
  return spec

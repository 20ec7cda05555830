"""The translation run's config: the training loop's sections (model, data, train, mesh,
logical_axis_rules, distributed) and `decode`, checked once.

    config = default_translation_config()        # the editable ConfigDict; configs/translate.py
    spec = validate(config)                      # RunSpec of frozen sections, or one
                                                 # ConfigError / DataError line naming the field

An `experiment` section may ride along (commands/translate.py reads it); any other unknown
section or field is an error.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from realformer_jax.config import to_config_dict
from realformer_jax.seq2seq.data import default_translation_data_config
from realformer_jax.seq2seq.model_config import Seq2SeqModelConfig
from realformer_jax.train import config as train_config
from realformer_jax.train.config import TrainConfig, _require, default_model_config

# Owned by the experiment script, not checked here.
EXPERIMENT_SECTION = 'experiment'


@dataclasses.dataclass(frozen=True)
class TranslationTrainConfig(TrainConfig):
  """The `train` section of a translation run: the training loop's (train/config.py, one set
  of rules) with translation's defaults, plus label smoothing. train.global_batch_size is
  not used: data.tokens_per_batch sizes each bucket's batches."""

  num_train_steps: int = 2000
  warmup_steps: int = 200  # linear warmup to learning_rate, then linear decay to 0
  learning_rate: float = 1e-3
  adam_b2: float = 0.98  # Transformer NMT's value
  adam_eps: float = 1e-9
  log_every_steps: int = 50
  eval_every_steps: int = 500  # dev loss (also at the last step)
  checkpoint_every_steps: int = 500  # also at the last step and on SIGTERM
  label_smoothing: float = 0.1  # of the target distribution in the loss

  def __post_init__(self):
    super().__post_init__()
    _require(
      0.0 <= self.label_smoothing < 1.0,
      'train.label_smoothing',
      self.label_smoothing,
      'must be in [0, 1)',
    )


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """The `decode` section: how BLEU's outputs are searched."""

  batch_size: int = 64  # sources per decoding call
  beam_size: int = 4  # hypotheses kept per source in beam search
  alpha: float = 0.6  # GNMT length penalty ((5 + |y|) / 6) ** alpha in beam search
  # Output length limit: length_ratio * the padded source length (the last bucket), at most
  # model.max_len. One shape for every decoding call: each search compiles once.
  length_ratio: float = 1.5

  def __post_init__(self):
    _require(self.batch_size > 0, 'decode.batch_size', self.batch_size, 'must be positive')
    _require(self.beam_size > 0, 'decode.beam_size', self.beam_size, 'must be positive')
    _require(self.length_ratio > 0, 'decode.length_ratio', self.length_ratio, 'must be positive')


def default_translation_config() -> ml_collections.ConfigDict:
  """Every field a translation run can set; configs/translate.py sizes it."""
  config = ml_collections.ConfigDict()
  config.data = default_translation_data_config()
  config.model = default_model_config(
    Seq2SeqModelConfig(
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
  config.train = to_config_dict(TranslationTrainConfig(), field_types={'grad_accum_steps': object})
  config.mesh = train_config.default_mesh_config()
  config.logical_axis_rules = train_config.DEFAULT_LOGICAL_AXIS_RULES
  config.distributed = train_config.default_distributed_config()
  config.decode = to_config_dict(DecodeConfig())
  return config

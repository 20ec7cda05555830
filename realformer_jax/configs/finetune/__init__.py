"""What the fine-tuning config files share: their argument ('[VALUE,]init=PATH') and the
model a random init gets, configs/tiny.py's."""

from __future__ import annotations

import dataclasses

import ml_collections

from realformer_jax.config import ModelConfig
from realformer_jax.configs import parse_arg, tiny
from realformer_jax.finetune import config as finetune_config
from realformer_jax.finetune.config import FINETUNE_MODEL_FIELDS


def start_from_arg(
  config: ml_collections.ConfigDict, arg: str, positional: str = '', **defaults: str
) -> dict[str, str]:
  """Reads a fine-tuning config file's argument (`positional` and `defaults`: its own keys,
  e.g. task='mrpc'): `init=` sets the starting point (the model section then stays unset: the
  checkpoint's); without it the model is configs/tiny.py's, randomly initialised. Returns
  every key's value."""
  values = parse_arg(arg, dict(defaults, init=''), positional)
  if values['init']:
    config.finetune.init = values['init']
  else:
    config.model.update(tiny_model())
    config.data.vocab_size = config.model.vocab_size
  return values


def tfds_config(arg: str, family: str, key: str, choices: tuple[str, ...], default: str):
  """The default fine-tuning config on TFDS dataset `family/<choice>`: the choice is `arg`'s
  `key` (its positional value; one of `choices`), the starting point as start_from_arg reads
  it."""
  config = finetune_config.default_config()
  choice = start_from_arg(config, arg, positional=key, **{key: default})[key]
  if choice not in choices:
    raise ValueError(f'{family} {key} {choice!r}: one of {", ".join(choices)}')
  config.data.dataset = f'{family}/{choice}'
  return config


def tiny_model() -> dict:
  """configs/tiny.py's architecture: the model fields it sets away from ModelConfig's defaults,
  but those fine-tuning sets itself (FINETUNE_MODEL_FIELDS: dropout and how the model is
  computed), with an embedding table the size of its tokenizer's vocabulary."""
  pretraining = tiny.get_config()
  defaults = dataclasses.asdict(ModelConfig())
  model = {
    k: v
    for k, v in pretraining.model.items()
    if k not in FINETUNE_MODEL_FIELDS and v != defaults[k]
  }
  model['vocab_size'] = pretraining.data.vocab_size
  return model

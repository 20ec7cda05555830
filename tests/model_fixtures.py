"""Small shared helpers for model tests."""

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax import MaskedLM, ModelConfig
from realformer_jax.model import params as params_lib
from realformer_jax.seq2seq.model_config import Seq2SeqModelConfig

TINY = dict(
  vocab_size=50,
  hidden_size=32,
  num_layers=3,
  num_heads=4,
  mlp_dim=48,
  max_len=24,
  dropout_rate=0.0,
  attention_dropout_rate=0.0,
)


def tiny_config(**overrides) -> ModelConfig:
  return ModelConfig(**{**TINY, **overrides})


def seq2seq_config(**overrides):
  """TINY as a translation model: 2 encoder and 2 decoder layers over 16 tokens."""
  fields = {**TINY, 'num_layers': 2, 'num_decoder_layers': 2, 'max_len': 16}
  return Seq2SeqModelConfig(**{**fields, **overrides})


def kernel_fields(max_len: int, **overrides) -> dict:
  """TINY as the kernel tests run it: 2 RealFormer layers of 2 heads of 16 (the smallest head
  the fused kernels' tiles take) over `max_len` tokens; a test adds what it is about."""
  shape = dict(num_layers=2, num_heads=2, max_len=max_len, ln_placement='realformer')
  return {**TINY, **shape, **overrides}


def kernel_config(max_len: int, **overrides) -> ModelConfig:
  return ModelConfig(**kernel_fields(max_len, **overrides))


def padded_batch(batch=2, length=12, vocab=50, seed=0, real_lengths=(12, 7)):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(batch, length)).astype(np.int32)
  mask = np.zeros((batch, length), np.int32)
  for b, n in enumerate(real_lengths):
    mask[b, :n] = 1
  ids = ids * mask  # [PAD] = 0 at padding
  segments = (np.arange(length)[None, :] >= length // 2).astype(np.int32) * mask
  return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments)


def init_params(config: ModelConfig, ids, mask, segments, seed=0):
  variables = MaskedLM(config).init(jax.random.key(seed), ids, mask, segments)
  return params_lib.unbox(variables['params'])

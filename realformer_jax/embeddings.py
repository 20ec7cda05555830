"""Word + position + segment embeddings, then norm and dropout (BERT)."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax import initializers
from realformer_jax.config import ModelConfig
from realformer_jax.layers import Dropout
from realformer_jax.normalization import Norm


class Embeddings(nn.Module):
  """Token embeddings; `attend` is the tied MLM decoder (hidden -> vocab logits)."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    embed = lambda num, axes: nn.Embed(
        num, cfg.hidden_size,
        embedding_init=nn.with_logical_partitioning(initializers.embedding_init(cfg), axes),
        dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype)
    self.word = embed(cfg.vocab_size, ('vocab', 'embed'))
    self.position = embed(cfg.max_len, (None, 'embed'))
    self.segment = embed(cfg.type_vocab_size, (None, 'embed'))
    self.norm = Norm(cfg)
    self.dropout = Dropout(cfg.dropout_rate)

  def __call__(self, input_ids_BxL: jax.Array, segment_ids_BxL: jax.Array,
               deterministic: bool = True) -> jax.Array:
    length = input_ids_BxL.shape[1]
    if length > self.config.max_len:
      raise ValueError(f'sequence length {length} exceeds model.max_len='
                       f'{self.config.max_len} (the position table)')
    x_BxLxD = (self.word(input_ids_BxL) + self.position(jnp.arange(length)[None, :])
               + self.segment(segment_ids_BxL))
    x_BxLxD = self.norm(x_BxLxD)
    x_BxLxD = nn.with_logical_constraint(x_BxLxD, ('batch', 'length', 'embed'))
    return self.dropout(x_BxLxD, deterministic=deterministic)

  def attend(self, h_BxPxD: jax.Array) -> jax.Array:
    return self.word.attend(h_BxPxD)

"""Word + position + segment embeddings, then norm and dropout (BERT)."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig
from realformer_jax.model import initializers
from realformer_jax.model.layers import Dropout
from realformer_jax.model.normalization import Norm

# Tables this small are looked up as one_hot(ids) @ table. Speed: the gradient of a gather is
# a scatter-add, and a scatter of B*L rows into 2 rows is an atomic pile-up on GPUs (measured
# on an H100: ~40% of a BERT-Base step, for both this model and Hugging Face's); the gradient
# of the one-hot matmul is a [T, B*L] x [B*L, D] matmul. Same values (one term of the sum is
# exactly the row, the others exactly 0), tested in tests/model/test_fast_layers.py.
ONE_HOT_MAX_ROWS = 16


class Embeddings(nn.Module):
  """Token embeddings; `attend` is the tied MLM decoder (hidden -> vocab logits)."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    embed = lambda num, axes: nn.Embed(
      num,
      cfg.hidden_size,
      embedding_init=nn.with_logical_partitioning(initializers.embedding_init(cfg), axes),
      dtype=cfg.compute_dtype,
      param_dtype=cfg.storage_dtype,
    )
    self.word = embed(cfg.vocab_size, ('vocab', 'embed'))
    if cfg.position_embedding == 'learned':  # rope acts in attention; none has no positions
      self.position = embed(cfg.max_len, (None, 'embed'))
    self.segment = embed(cfg.type_vocab_size, (None, 'embed'))
    self.norm = Norm(cfg)
    self.dropout = Dropout(cfg.dropout_rate, generator=cfg.dropout_generator)

  def __call__(
    self, input_ids_BxL: jax.Array, segment_ids_BxL: jax.Array, deterministic: bool = True
  ) -> jax.Array:
    cfg = self.config
    length = input_ids_BxL.shape[1]
    dtype = cfg.compute_dtype
    # A negative id would wrap to a row from the end (the gather's NumPy indexing); moved past
    # the table, it gives what every id >= vocab_size gives: NaN (out-of-range fill).
    x_BxLxD = self.word(jnp.where(input_ids_BxL < 0, cfg.vocab_size, input_ids_BxL))
    if cfg.position_embedding == 'learned':
      if length > cfg.max_len:
        raise ValueError(
          f'sequence length {length} exceeds model.max_len={cfg.max_len} (the '
          "learned position table; position_embedding='rope' has no limit)"
        )
      # Positions 0..L-1 are a static slice: its gradient pads instead of scattering.
      x_BxLxD = x_BxLxD + self.position.embedding[None, :length].astype(dtype)
    if cfg.type_vocab_size <= ONE_HOT_MAX_ROWS:
      one_hot_BxLxT = jax.nn.one_hot(segment_ids_BxL, cfg.type_vocab_size, dtype=dtype)
      # HIGHEST: a TF32 matmul (the GPU default for float32) would round the rows.
      segment_BxLxD = jnp.einsum(
        'blt,td->bld',
        one_hot_BxLxT,
        self.segment.embedding.astype(dtype),
        precision=jax.lax.Precision.HIGHEST,
      )
    else:
      segment_BxLxD = self.segment(segment_ids_BxL)
    x_BxLxD = x_BxLxD + segment_BxLxD
    x_BxLxD = self.norm(x_BxLxD)
    x_BxLxD = nn.with_logical_constraint(x_BxLxD, ('batch', 'length', 'embed'))
    return self.dropout(x_BxLxD, deterministic=deterministic)

  def attend(self, h_BxPxD: jax.Array) -> jax.Array:
    return self.word.attend(h_BxPxD)

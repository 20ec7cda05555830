"""LayerNorm and RMSNorm with logical axis names on their parameters.

Statistics are computed in float32 whatever the compute dtype: the mean of squares of a
bfloat16 residual stream loses too many bits otherwise.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig


class Norm(nn.Module):
  """`layernorm`: (x - mean) / sqrt(var + eps) * scale + bias.
  `rmsnorm`: x / sqrt(mean(x^2) + eps) * scale (no centring, no bias).

  `use_bias=False` in the config removes the LayerNorm bias too (T5 style).
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    cfg = self.config
    features = x_BxLxD.shape[-1]
    x = x_BxLxD.astype(jnp.float32)
    if cfg.norm == 'layernorm':
      x = x - jnp.mean(x, axis=-1, keepdims=True)
    mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(mean_square + cfg.norm_epsilon)
    scale = self.param(
      'scale',
      nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
      (features,),
      cfg.storage_dtype,
    )
    y = y * scale.astype(jnp.float32)
    if cfg.norm == 'layernorm' and cfg.use_bias:
      bias = self.param(
        'bias',
        nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
        (features,),
        cfg.storage_dtype,
      )
      y = y + bias.astype(jnp.float32)
    return y.astype(cfg.compute_dtype)

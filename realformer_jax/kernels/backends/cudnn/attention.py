"""Post / pre attention through jax's cuDNN flash attention (`attention_impl='cudnn'`).

`jax.nn.dot_product_attention(..., implementation='cudnn')` fuses softmax(scale Q K^T + bias) V
forward and backward, but takes one static scale and has no dropout (jax's private cuDNN
wrapper has a dropout rate, with cuDNN's own random stream that we cannot reproduce or test;
we do not rely on it). So: residual attention and attention dropout are refused by the config
(config.py), and the per-sequence entropy-invariant scale is folded into the queries, which in
bfloat16 rounds q * scale once more than the einsum path does. Nothing here runs on a CPU; the
wrapper's arithmetic is tested through jax's 'xla' implementation of the same call, and the
cuDNN custom call only by compiling it for an H100 target.
"""

import jax
import jax.numpy as jnp


def cudnn_attention(
  q_BxLxHxK: jax.Array,
  k_BxLxHxK: jax.Array,
  v_BxLxHxK: jax.Array,
  bias_Bx1x1xL: jax.Array,
  scale_B: jax.Array,
  implementation: str = 'cudnn',
) -> jax.Array:
  """softmax(scale q k^T + bias) v, [B, L, H, K] in q's dtype."""
  scaled_q = (q_BxLxHxK.astype(jnp.float32) * scale_B[:, None, None, None]).astype(q_BxLxHxK.dtype)
  return jax.nn.dot_product_attention(
    scaled_q,
    k_BxLxHxK,
    v_BxLxHxK,
    bias=bias_Bx1x1xL.astype(q_BxLxHxK.dtype),
    scale=1.0,
    implementation=implementation,
  )

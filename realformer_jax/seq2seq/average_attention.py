"""Average attention (AAN; Zhang, Xiong and Su, ACL 2018): a decoder self-attention whose
weights are fixed to the uniform average over the prefix.

For decoder inputs y_1..y_T (position j sees y_1..y_j):
  1. average:  a_j = (1/j) sum_{k<=j} y_k                  (= causal attention with uniform weights)
  2. FFN:      g_j = FFN(a_j) = W2 act(W1 a_j + b1) + b2    (the paper's position-wise FFN,
                                                            ReLU there; here model.activation)
  3. gating:   i_j, f_j = sigmoid(W [y_j; g_j] + b)  (input and forget gates, each D wide)
               h_j = i_j * y_j + f_j * g_j
The layer around it adds the residual and the norm, LN(y + h) (decoder.py).

Incremental decoding keeps the running sum S_j = S_{j-1} + y_j and the step count in the
'cache' collection: O(1) work and memory per step, whatever the prefix length.

`uniform_prefix_average` (step 1 alone, for a whole sequence or one decoding step) is shared
with merged attention (decoder.py), which averages value projections instead of inputs.
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig
from realformer_jax.model import initializers
from realformer_jax.model.activations import get_activation
from realformer_jax.model.layers import DenseGeneral


def uniform_prefix_average(x_BxTx___: jax.Array) -> jax.Array:
  """Position j holds the mean of x_1..x_j (axis 1), in float32 arithmetic."""
  counts = jnp.arange(1, x_BxTx___.shape[1] + 1, dtype=jnp.float32)
  counts = counts.reshape((1, -1) + (1,) * (x_BxTx___.ndim - 2))
  total = jnp.cumsum(x_BxTx___.astype(jnp.float32), axis=1)
  return (total / counts).astype(x_BxTx___.dtype)


def cached_prefix_average(module: nn.Module, x_Bx1x___: jax.Array, name: str) -> jax.Array:
  """One decoding step of `uniform_prefix_average`: the running sum lives in 'cache'.

  At cache creation (the first, full-length call that makes the variables) nothing is
  averaged; the caller ignores that call's output."""
  initialised = module.has_variable('cache', f'{name}_sum')
  total = module.variable(
    'cache', f'{name}_sum', jnp.zeros, (x_Bx1x___.shape[0],) + x_Bx1x___.shape[2:], jnp.float32
  )
  count = module.variable('cache', f'{name}_count', lambda: jnp.zeros((), jnp.int32))
  if not initialised:
    return uniform_prefix_average(x_Bx1x___)
  total.value = total.value + x_Bx1x___[:, 0].astype(jnp.float32)
  count.value = count.value + 1
  return (total.value / count.value.astype(jnp.float32))[:, None].astype(x_Bx1x___.dtype)


class AverageAttention(nn.Module):
  """The AAN sublayer's branch: average, FFN, gating (the caller adds residual and norm)."""

  config: ModelConfig
  layer: Optional[int] = None  # 1-based depth in the decoder stack (DS-Init)

  @nn.compact
  def __call__(self, y_BxTxD: jax.Array, decode: bool = False) -> jax.Array:
    cfg = self.config
    d = cfg.hidden_size
    dense = lambda features, axes, fan_in, name: DenseGeneral(
      features=(features,),
      kernel_axes=axes,
      use_bias=cfg.use_bias,
      kernel_init=initializers.kernel_init(cfg, fan_in=fan_in, fan_out=features, layer=self.layer),
      ntk=cfg.parameterization == 'ntk',
      dtype=cfg.compute_dtype,
      param_dtype=cfg.storage_dtype,
      name=name,
    )
    if decode:
      average_BxTxD = cached_prefix_average(self, y_BxTxD, 'inputs')
    else:
      average_BxTxD = uniform_prefix_average(y_BxTxD)
    hidden = get_activation(cfg.activation)(
      dense(cfg.mlp_dim, ('embed', 'mlp'), d, 'ffn_in')(average_BxTxD)
    )
    g_BxTxD = dense(d, ('mlp', 'embed'), cfg.mlp_dim, 'ffn_out')(hidden)
    gates = dense(2 * d, ('embed', 'mlp'), 2 * d, 'gates')(
      jnp.concatenate([y_BxTxD.astype(g_BxTxD.dtype), g_BxTxD], axis=-1)
    )
    input_gate, forget_gate = jnp.split(jax.nn.sigmoid(gates.astype(jnp.float32)), 2, axis=-1)
    h = input_gate * y_BxTxD.astype(jnp.float32) + forget_gate * g_BxTxD.astype(jnp.float32)
    return h.astype(cfg.compute_dtype)

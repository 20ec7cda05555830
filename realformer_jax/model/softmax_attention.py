"""softmax -> dropout -> P V, with a backward pass that keeps one score-sized tensor.

    context_BxLxHxK, probs_BxHxLxL = softmax_dropout_values(
        scores_BxHxLxL, bias_Bx1x1xL, divisor, v_BxLxHxK, dropout_key, keep_prob, dtype,
        generator)

computes  z = scores / divisor + bias  (float32),  p = softmax(z),  p_drop = dropout(p) in the
compute dtype,  context = p_drop V.  Left to autodiff, this saves for the backward pass the
float32 exp (or p), the compute-dtype copy of p that meets V, and the boolean dropout mask: three
[B, H, L, L] tensors per layer, which a rolled layer scan stacks for every layer. The custom VJP
here saves only p in the compute dtype (the tensor the P V matmul reads anyway) and the dropout
key: the backward regenerates the mask from the key (dropout_bits.keep_mask is a pure function of
the key and the element's position) and computes the softmax gradient from the saved p:

    dV = p_drop^T dC,   dp = mask * (dC V^T) / keep,   dz = p * (dp - sum(dp * p)),
    dscores = dz / divisor,   dbias = sum of dz over the broadcast axes.

In float32 this is the same arithmetic as autodiff's. In bfloat16 the softmax gradient reads p
rounded to bfloat16 (relative error 2^-9 per element), as the P V matmul already did.
`divisor` is the running-mean count (l + 1), or 1. The scores' cotangent is float32, as they are.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from realformer_jax.kernels.dropout.dropout_bits import keep_mask, realised_keep_prob


def _probabilities(scores, bias, divisor):
  z = scores / divisor + bias if divisor is not None else scores + bias
  return jax.nn.softmax(z, axis=-1)


def _drop(p_c, key, keep_prob, generator):
  if key is None:
    return p_c
  mask = keep_mask(key, keep_prob, p_c.shape, generator)
  keep = realised_keep_prob(keep_prob)
  return jnp.where(mask, p_c / jnp.asarray(keep, p_c.dtype), jnp.zeros_like(p_c))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def softmax_dropout_values(
  scores_BxHxLxL: jax.Array,
  bias_Bx1x1xL: jax.Array,
  divisor: Optional[jax.Array],
  v_BxLxHxK: jax.Array,
  key: Optional[jax.Array],
  keep_prob: float,
  dtype: jnp.dtype,
  generator: str = 'threefry',
) -> tuple[jax.Array, jax.Array]:
  """(context [B, L, H, K] in `dtype`, probabilities [B, H, L, L] float32 before dropout).

  `key` None means no dropout (evaluation, or rate 0); `generator` is the mask's hash
  (model.dropout_generator)."""
  p = _probabilities(scores_BxHxLxL, bias_Bx1x1xL, divisor)
  p_drop = _drop(p.astype(dtype), key, keep_prob, generator)
  return jnp.einsum('bhqv,bvhk->bqhk', p_drop, v_BxLxHxK.astype(dtype)), p


def _forward(scores, bias, divisor, v, key, keep_prob, dtype, generator='threefry'):
  p = _probabilities(scores, bias, divisor)
  p_c = p.astype(dtype)
  context = jnp.einsum('bhqv,bvhk->bqhk', _drop(p_c, key, keep_prob, generator), v.astype(dtype))
  return (context, p), (p_c, v, divisor, key, bias.shape)


def _backward(keep_prob, dtype, generator, residuals, cotangents):
  p_c, v, divisor, key, bias_shape = residuals
  g_context, g_p = cotangents
  p_drop = _drop(p_c, key, keep_prob, generator)
  g_v = jnp.einsum('bhqv,bqhk->bvhk', p_drop, g_context.astype(dtype)).astype(v.dtype)
  # d(p_drop): dC V^T in float32, then back through dropout with the regenerated mask.
  g_p_drop = jnp.einsum(
    'bqhk,bvhk->bhqv', g_context.astype(dtype), v.astype(dtype), preferred_element_type=jnp.float32
  )
  g_probs = (
    _drop(g_p_drop, key, keep_prob, generator) + g_p
  )  # g_p: a user of the returned p, usually 0
  p = p_c.astype(jnp.float32)
  g_z = p * (g_probs - jnp.sum(g_probs * p, axis=-1, keepdims=True))
  g_scores = g_z / divisor if divisor is not None else g_z
  reduce_axes = tuple(i for i, n in enumerate(bias_shape) if n == 1)
  g_bias = jnp.sum(g_z, axis=reduce_axes, keepdims=True)
  g_divisor = None if divisor is None else jnp.zeros_like(divisor)  # a layer count: constant
  return g_scores, g_bias, g_divisor, g_v, None


softmax_dropout_values.defvjp(_forward, _backward)

"""Multi-head self-attention with RealFormer residual scores (docs/design.md §1).

For layer l, per head:
  s_l   = scale * Q_l K_l^T                    (this layer's own scaled scores)
  acc_l = s_l            if l == 0 else acc_{l-1} + s_l
  z_l   = acc_l          or acc_l / (l + 1) with running_mean
  p_l   = softmax(z_l + mask_bias)             (mask added AFTER the residual sum)
  out   = dropout(p_l) V_l, then the output projection
The value handed to layer l+1 is acc_l: no mask, no running-mean division, no dropout, and
always float32 (it grows with depth).
"""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax import kernels
from realformer_jax.config import ModelConfig
from realformer_jax.model import initializers
from realformer_jax.model.layers import configured_dense
from realformer_jax.model.rotary import apply_rotary
from realformer_jax.model.softmax_attention import softmax_dropout_values

SCORES_AXES = ('batch', 'heads', 'length', 'kv_length')
# A masked logit before a softmax (padding keys here, SpanHead's padding, the decoder's future
# keys): exp underflows to 0 next to any real logit, and finite (not -inf), so a row with
# nothing allowed gets a uniform softmax instead of NaN.
MASKED_LOGIT = -1e9


def mask_bias(input_mask_BxL: jax.Array) -> jax.Array:
  """Additive float32 bias [B, 1, 1, L]: 0 at real keys, a large finite negative at padding.

  Finite (not -inf) so that a row with no real key gives a uniform softmax instead of NaN.
  """
  neg = jnp.asarray(MASKED_LOGIT, jnp.float32)
  return jnp.where(input_mask_BxL[:, None, None, :] > 0, 0.0, neg).astype(jnp.float32)


def score_scale(config: ModelConfig, input_mask_BxL: jax.Array) -> jax.Array:
  """Multiplier of Q K^T, broadcastable to [B, H, L, L] (float32).

  entropy_invariant: log_{base}(n) / sqrt(d), n = number of real keys the row may attend to.
  With a bidirectional padding mask every row of a sequence sees the same n.
  """
  inv_sqrt_d = config.head_dim**-0.5
  if config.attention_scale == 'standard':
    return jnp.asarray(inv_sqrt_d, jnp.float32)
  if config.attention_scale == 't5':
    return jnp.asarray(1.0, jnp.float32)
  n_B = jnp.maximum(jnp.sum(input_mask_BxL > 0, axis=-1), 1).astype(jnp.float32)
  log_base_n_B = jnp.log(n_B) / jnp.log(float(config.entropy_base_len))
  return (log_base_n_B * inv_sqrt_d)[:, None, None, None]


class ResidualSelfAttention(nn.Module):
  """Self-attention that adds the previous layers' scores before the softmax."""

  config: ModelConfig

  @nn.compact
  def __call__(
    self,
    x_BxLxD: jax.Array,
    bias_Bx1x1xL: jax.Array,
    scale: jax.Array,
    prev_scores: Any,
    layer: jax.Array,
    deterministic: bool = True,
    path: Optional[kernels.ScorePath] = None,
  ):
    """Returns (output [B, L, D], scores to carry or None).

    The scores are a float32 [B, H, L, L] sum unless `path` (the encoder's
    kernels.stack_path, one for the whole stack) carries them in another form; without a
    path the layer takes kernels.layer_path, which carries the bare sum."""
    cfg = self.config
    d_model, heads, head_dim = cfg.hidden_size, cfg.num_heads, cfg.head_dim

    def qkv_init(key, shape, param_dtype=jnp.float32):
      # One fused [embed, 3, heads, kv] kernel (one big matmul), each of Q/K/V initialised on
      # its own so that role-specific rules (T5 query scaling) apply per slice.
      keys = jax.random.split(key, 3)
      slices = [
        initializers.kernel_init(cfg, fan_in=d_model, fan_out=d_model, role=role, layer=layer + 1)(
          k, (shape[0],) + tuple(shape[2:]), param_dtype
        )
        for k, role in zip(keys, ('query', 'key', 'value'))
      ]
      return jnp.stack(slices, axis=1)

    qkv_BxLx3xHxK = configured_dense(
      cfg,
      features=(3, heads, head_dim),
      kernel_init=qkv_init,
      kernel_axes=('embed', None, 'heads', 'kv'),
      name='qkv',
    )(x_BxLxD)
    qkv_BxLx3xHxK = nn.with_logical_constraint(
      qkv_BxLx3xHxK, ('batch', 'length', None, 'heads', 'kv')
    )
    q_BxLxHxK = qkv_BxLx3xHxK[:, :, 0]
    k_BxLxHxK = qkv_BxLx3xHxK[:, :, 1]
    v_BxLxHxK = qkv_BxLx3xHxK[:, :, 2]
    if cfg.position_embedding == 'rope':  # relative positions: q_m . k_n sees only n - m
      q_BxLxHxK = apply_rotary(q_BxLxHxK, cfg.rope_base)
      k_BxLxHxK = apply_rotary(k_BxLxHxK, cfg.rope_base)

    divisor = None
    if cfg.use_residual_attention and cfg.running_mean:
      divisor = jnp.asarray(layer, jnp.float32) + 1.0
    dropout_key = None
    if not deterministic and cfg.attention_dropout_rate > 0.0:
      dropout_key = self.make_rng('dropout')
    maps_requested = self.is_mutable_collection('intermediates')
    if path is None:  # a layer on its own; in a stack the encoder chose the path once
      path = kernels.layer_path(
        cfg, x_BxLxD.shape[1], einsum=einsum_attention, maps_requested=maps_requested
      )
    if cfg.position_embedding == 'rope':
      qkv_BxLx3xHxK = jnp.stack([q_BxLxHxK, k_BxLxHxK, v_BxLxHxK], axis=2)
    context_BxLxHxK, carried = path.attend(
      qkv_BxLx3xHxK,
      prev_scores,
      bias_Bx1x1xL,
      scale,
      divisor,
      dropout_key,
      1.0 - cfg.attention_dropout_rate,
      (lambda name, value: self.sow('intermediates', name, value)) if maps_requested else None,
    )

    out_BxLxD = configured_dense(
      cfg,
      features=(d_model,),
      axis=(-2, -1),
      kernel_init=initializers.kernel_init(
        cfg, fan_in=d_model, fan_out=d_model, role='attention_out', layer=layer + 1
      ),
      kernel_axes=('heads', 'kv', 'embed'),
      name='out',
    )(context_BxLxHxK)
    return out_BxLxD, carried


def einsum_attention(
  qkv_BxLx3xHxK,
  prev_scores_BxHxLxL,
  bias_Bx1x1xL,
  scale,
  divisor,
  dropout_key,
  keep_prob,
  dtype,
  record,
  generator='threefry',
):
  """(context [B, L, H, K], scores [B, H, L, L] float32): the reference path, the einsum
  implementation of kernels.ScorePath.attend. `record(name, value)` sows the attention maps
  (None: not asked for); `generator`: the dropout mask's hash (model.dropout_generator)."""
  q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (qkv_BxLx3xHxK[:, :, part] for part in range(3))
  logits_BxHxLxL = jnp.einsum(
    'bqhk,bvhk->bhqv', q_BxLxHxK, k_BxLxHxK, preferred_element_type=jnp.float32
  )
  scores_BxHxLxL = logits_BxHxLxL * scale
  if prev_scores_BxHxLxL is not None:
    scores_BxHxLxL = prev_scores_BxHxLxL + scores_BxHxLxL
  scores_BxHxLxL = nn.with_logical_constraint(scores_BxHxLxL, SCORES_AXES)
  # softmax(scores / divisor + bias) -> dropout -> P V, saving only P (compute dtype) for the
  # backward pass (softmax_attention.py).
  context_BxLxHxK, probs_BxHxLxL = softmax_dropout_values(
    scores_BxHxLxL, bias_Bx1x1xL, divisor, v_BxLxHxK, dropout_key, keep_prob, dtype, generator
  )
  if record is not None:  # free when not asked for
    softmax_in = scores_BxHxLxL if divisor is None else scores_BxHxLxL / divisor
    record('attention_logits', softmax_in + bias_Bx1x1xL)
    record('attention_probs', probs_BxHxLxL)
  return context_BxLxHxK, scores_BxHxLxL

"""A Transformer decoder with three kinds of attention sublayers, and incremental decoding.

`Seq2SeqModelConfig.decoder_attention` (model_config.py) chooses the layer (x: the layer input,
H: encoder output, N: the norm, D: dropout on the branch; Post-LN shown, Pre-LN normalises
branch inputs instead and adds a final norm):

  standard  h = N(x + D(SelfAttn(x)));   h' = N(h + D(CrossAttn(h, H)));   y = N(h' + D(FFN(h')))
            causal self-attention; with residual attention (`realformer` placement or
            `residual_attention=True`) its scores are carried across decoder layers exactly as
            in the encoder (the mask added after the sum, the sum float32, never masked).
  aan       as standard, with the average attention network (average_attention.py: prefix
            average, FFN, gating) in place of self-attention (Zhang, Xiong, Su 2018).
  merged    h = N(x + D(MAtt(x, H)));    y = N(h + D(FFN(h)))   (Zhang, Titov, Sennrich 2019)
            MAtt(S) = AAN(S) + Att(S, H), with the simplified AAN of that paper (no FFN or
            gates): per head, the prefix average of the decoder's value projections S W_v, added
            to the cross-attention context softmax(Q K_H^T / sqrt(d)) H W_v, sharing W_v and
            the output projection W_o, so one attention sublayer replaces two.

Incremental decoding (`decode=True`, one target position per call) keeps per layer, in the
'cache' collection: the self-attention keys and values written at the step's index (standard),
the running sum of the inputs or of the value projections (aan / merged: O(1) per step), and
the cross-attention keys and values of the encoder output, computed once, when the cache is
created (`Seq2Seq.init_cache`). Every kernel takes the initialiser of `config.init` with the
decoder layer's 1-based depth (so DS-Init scales the decoder by its own depth), and norms,
activation, biases and parameterisation follow the config as in the encoder. So do the
residual branches (rezero / skipinit: a zero-initialised scalar gate per sublayer and the
encoder's rule for which norms go; block.py), the attention scale (entropy-invariant: n is
the number of keys a row sees, t + 1 for causal rows, the real source length for
cross-attention) and the running mean of carried scores (softmax of acc_l / l). The layers
are a Python loop (not nn.scan): decoding keeps a different cache per layer.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.model import initializers
from realformer_jax.model.attention import MASKED_LOGIT, mask_bias, score_scale
from realformer_jax.model.block import FeedForward
from realformer_jax.model.heads import tied_logits
from realformer_jax.model.layers import DenseGeneral, Dropout
from realformer_jax.model.normalization import Norm
from realformer_jax.model.placement import placement, trained_gate
from realformer_jax.model.rotary import apply_rotary
from realformer_jax.model.softmax_attention import softmax_dropout_values
from realformer_jax.seq2seq.average_attention import (
  AverageAttention,
  cached_prefix_average,
  uniform_prefix_average,
)
from realformer_jax.seq2seq.model_config import Seq2SeqModelConfig


def causal_bias(length: int) -> jax.Array:
  """[1, 1, L, L] float32: 0 where key <= query, MASKED_LOGIT above the diagonal."""
  allowed = jnp.tril(jnp.ones((length, length), bool))
  return jnp.where(allowed, 0.0, MASKED_LOGIT)[None, None].astype(jnp.float32)


def _projection(
  cfg: Seq2SeqModelConfig,
  features,
  axes,
  fan_in: int,
  fan_out: int,
  layer: int,
  name: str,
  axis=(-1,),
  role: str = 'dense',
) -> DenseGeneral:
  return DenseGeneral(
    features=features,
    axis=axis,
    kernel_axes=axes,
    use_bias=cfg.use_bias,
    kernel_init=initializers.kernel_init(
      cfg, fan_in=fan_in, fan_out=fan_out, role=role, layer=layer
    ),
    ntk=cfg.parameterization == 'ntk',
    dtype=cfg.compute_dtype,
    param_dtype=cfg.storage_dtype,
    name=name,
  )


def _heads(cfg: Seq2SeqModelConfig, layer: int, name: str, role: str) -> DenseGeneral:
  d = cfg.hidden_size
  return _projection(
    cfg, (cfg.num_heads, cfg.head_dim), ('embed', 'heads', 'kv'), d, d, layer, name, role=role
  )


def _output(cfg: Seq2SeqModelConfig, layer: int) -> DenseGeneral:
  d = cfg.hidden_size
  return _projection(
    cfg, (d,), ('heads', 'kv', 'embed'), d, d, layer, 'out', axis=(-2, -1), role='attention_out'
  )


def causal_scale(cfg: Seq2SeqModelConfig, positions_T: jax.Array) -> jax.Array:
  """Multiplier of Q K^T for causal rows at 0-based `positions_T`, [1, 1, T, 1] float32.

  As the encoder's `score_scale`, where a row at position t sees n = t + 1 keys
  (entropy-invariant: log_base(n) / sqrt(d))."""
  if cfg.attention_scale != 'entropy_invariant':
    return score_scale(cfg, jnp.ones((1, 1), jnp.int32))
  n_T = positions_T.astype(jnp.float32) + 1.0
  scale_T = jnp.log(n_T) / jnp.log(float(cfg.entropy_base_len)) * cfg.head_dim**-0.5
  return scale_T[None, None, :, None]


def _attend(module: nn.Module, scores, bias, divisor, v, deterministic: bool):
  """softmax(scores / divisor + bias) V with the config's attention dropout, its key drawn from
  `module`'s 'dropout' stream when training."""
  cfg = module.config
  key = module.make_rng('dropout') if not deterministic and cfg.attention_dropout_rate > 0 else None
  context, _ = softmax_dropout_values(
    scores,
    bias,
    divisor,
    v,
    key,
    1.0 - cfg.attention_dropout_rate,
    cfg.compute_dtype,
    cfg.dropout_generator,
  )
  return context


class CausalSelfAttention(nn.Module):
  """Masked multi-head self-attention, optionally adding the previous layer's scores."""

  config: Seq2SeqModelConfig
  layer: int  # 1-based

  @nn.compact
  def __call__(self, x_BxTxD, prev_scores_BxHxTxS, decode: bool, deterministic: bool):
    """(output [B, T, D], scores to carry [B, H, T, S] float32 or None).

    Training: T = S = the target length. Decoding: T = 1 and S = the cache length; the carried
    scores are the current row's."""
    cfg = self.config
    q = _heads(cfg, self.layer, 'query', 'query')(x_BxTxD)
    k = _heads(cfg, self.layer, 'key', 'key')(x_BxTxD)
    v = _heads(cfg, self.layer, 'value', 'value')(x_BxTxD)
    if decode:
      q, k, v, bias, offset = self._update_cache(q, k, v)
    else:
      bias, offset = causal_bias(x_BxTxD.shape[1]), 0
    positions_T = offset + jnp.arange(q.shape[1])
    if cfg.position_embedding == 'rope':
      q = apply_rotary(q, cfg.rope_base, offset)
      if not decode:  # cached keys were rotated when written
        k = apply_rotary(k, cfg.rope_base)
    scores = jnp.einsum('bqhk,bvhk->bhqv', q, k, preferred_element_type=jnp.float32)
    scores = scores * causal_scale(cfg, positions_T)
    if prev_scores_BxHxTxS is not None:
      scores = prev_scores_BxHxTxS + scores
    divisor = None  # running mean (docs/design.md §1): softmax sees acc_l / l, l 1-based
    if cfg.use_residual_attention and cfg.running_mean:
      divisor = jnp.asarray(self.layer, jnp.float32)
    context = _attend(self, scores, bias, divisor, v, deterministic)
    out = _output(cfg, self.layer)(context)
    return out, (scores if cfg.use_residual_attention else None)

  def _update_cache(self, q, k, v):
    """Writes this step's key and value at the cache index; returns all keys and values so
    far (later slots masked), the bias, and the step's position."""
    cfg = self.config
    initialised = self.has_variable('cache', 'cached_key')
    cached_k = self.variable('cache', 'cached_key', jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable('cache', 'cached_value', jnp.zeros, v.shape, v.dtype)
    index = self.variable('cache', 'cache_index', lambda: jnp.zeros((), jnp.int32))
    if not initialised:  # the cache-creating call: full length, nothing written
      return q, k, v, causal_bias(k.shape[1]), 0
    position = index.value
    if cfg.position_embedding == 'rope':
      k = apply_rotary(k, cfg.rope_base, position)
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, position, 0, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, position, 0, 0))
    index.value = position + 1
    length = cached_k.value.shape[1]
    bias = jnp.where(jnp.arange(length) <= position, 0.0, MASKED_LOGIT)[None, None, None, :]
    return q, cached_k.value, cached_v.value, bias.astype(jnp.float32), position


class CrossAttention(nn.Module):
  """Attention from decoder positions to the encoder output. With `with_average` (merged
  attention), the prefix average of the decoder's own value projections is added to the
  context before the shared output projection."""

  config: Seq2SeqModelConfig
  layer: int
  with_average: bool = False

  @nn.compact
  def __call__(
    self,
    x_BxTxD,
    encoded_BxSxD,
    source_bias_Bx1x1xS,
    source_scale,
    decode: bool,
    deterministic: bool,
  ):
    cfg = self.config
    q = _heads(cfg, self.layer, 'query', 'query')(x_BxTxD)
    key_proj = _heads(cfg, self.layer, 'key', 'key')
    value_proj = _heads(cfg, self.layer, 'value', 'value')
    if decode:
      # Computed from the encoder output once, when the cache is created.
      k = self.variable('cache', 'source_key', key_proj, encoded_BxSxD).value
      v = self.variable('cache', 'source_value', value_proj, encoded_BxSxD).value
    else:
      k, v = key_proj(encoded_BxSxD), value_proj(encoded_BxSxD)
    scores = jnp.einsum('bqhk,bvhk->bhqv', q, k, preferred_element_type=jnp.float32)
    scores = scores * source_scale
    context = _attend(self, scores, source_bias_Bx1x1xS, None, v, deterministic)
    if self.with_average:
      own_values = value_proj(x_BxTxD)  # W_v shared with the encoder side
      average = (
        cached_prefix_average(self, own_values, 'values')
        if decode
        else uniform_prefix_average(own_values)
      )
      context = context + average.astype(context.dtype)
    return _output(cfg, self.layer)(context)


class DecoderLayer(nn.Module):
  """One decoder layer (see the module docstring for the order of operations)."""

  config: Seq2SeqModelConfig
  layer: int  # 1-based depth in the decoder

  @nn.compact
  def __call__(
    self,
    x_BxTxD,
    prev_scores,
    encoded_BxSxD,
    source_bias,
    source_scale,
    decode: bool,
    deterministic: bool,
  ):
    cfg = self.config
    # The encoder's rule for norms and gates (placement.py); the decoder has no training step,
    # so no fixed_schedule gate (Seq2Seq refuses it).
    layout = placement(cfg)
    post = layout.post

    def sublayer(x, branch, name):
      """x + g·D(branch(.)) with the placement's norms; returns the new trunk."""
      norm = Norm(cfg, name=f'{name}_norm') if layout.layer_norms else (lambda t: t)
      out = Dropout(cfg.dropout_rate, generator=cfg.dropout_generator)(
        branch(x if post else norm(x)), deterministic=deterministic
      )
      if layout.trained_gate:
        out = out * trained_gate(self, f'{name}_gate').astype(out.dtype)
      y = x + out
      return norm(y) if post else y

    scores = None
    kind = cfg.decoder_attention
    if kind == 'standard':

      def self_attention(h):
        nonlocal scores
        out, scores = CausalSelfAttention(cfg, self.layer, name='self_attention')(
          h, prev_scores, decode, deterministic
        )
        return out

      x_BxTxD = sublayer(x_BxTxD, self_attention, 'self_attention')
    elif kind == 'aan':
      x_BxTxD = sublayer(
        x_BxTxD, lambda h: AverageAttention(cfg, self.layer, name='aan')(h, decode), 'aan'
      )
    name = 'merged_attention' if kind == 'merged' else 'cross_attention'
    x_BxTxD = sublayer(
      x_BxTxD,
      lambda h: CrossAttention(cfg, self.layer, with_average=kind == 'merged', name=name)(
        h, encoded_BxSxD, source_bias, source_scale, decode, deterministic
      ),
      name,
    )
    x_BxTxD = sublayer(
      x_BxTxD, lambda h: FeedForward(cfg, name='mlp')(h, jnp.asarray(self.layer - 1)), 'mlp'
    )
    return nn.with_logical_constraint(x_BxTxD, ('batch', 'length', 'embed')), scores


class Decoder(nn.Module):
  """Target ids (shifted right) and the encoder output -> vocabulary logits (float32)."""

  config: Seq2SeqModelConfig

  @nn.compact
  def __call__(
    self,
    target_in_BxT,
    encoded_BxSxD,
    source_mask_BxS,
    *,
    decode: bool = False,
    deterministic: bool = True,
  ):
    cfg = self.config
    dtype = cfg.compute_dtype
    embed = lambda num, axes, name: nn.Embed(
      num,
      cfg.hidden_size,
      dtype=dtype,
      param_dtype=cfg.storage_dtype,
      name=name,
      embedding_init=nn.with_logical_partitioning(initializers.embedding_init(cfg), axes),
    )
    word = embed(cfg.vocab_size, ('vocab', 'embed'), 'word')
    x_BxTxD = word(target_in_BxT)
    if cfg.position_embedding == 'learned':
      position_table = embed(cfg.max_len, (None, 'embed'), 'position').embedding
      stepping = decode and self.has_variable('cache', 'position_index')
      if decode:
        index = self.variable('cache', 'position_index', lambda: jnp.zeros((), jnp.int32))
      if stepping:  # one position per call, at the cache's index
        x_BxTxD = x_BxTxD + jax.lax.dynamic_slice_in_dim(position_table, index.value, 1)[
          None
        ].astype(dtype)
        index.value = index.value + 1
      else:  # training, or the cache-creating call
        if target_in_BxT.shape[1] > cfg.max_len:
          raise ValueError(
            f'target length {target_in_BxT.shape[1]} exceeds model.max_len='
            f'{cfg.max_len} (the decoder position table)'
          )
        x_BxTxD = x_BxTxD + position_table[None, : target_in_BxT.shape[1]].astype(dtype)
    if placement(cfg).embedding_norm:  # every placement, as the encoder's embeddings (BERT)
      x_BxTxD = Norm(cfg, name='embedding_norm')(x_BxTxD)
    x_BxTxD = Dropout(cfg.dropout_rate, generator=cfg.dropout_generator)(
      x_BxTxD, deterministic=deterministic
    )
    source_bias = mask_bias(source_mask_BxS)
    source_scale = score_scale(cfg, source_mask_BxS)
    scores = None
    for index in range(cfg.num_decoder_layers):
      x_BxTxD, scores = DecoderLayer(cfg, index + 1, name=f'layers_{index}')(
        x_BxTxD, scores, encoded_BxSxD, source_bias, source_scale, decode, deterministic
      )
    if placement(cfg).final_norm:
      x_BxTxD = Norm(cfg, name='final_norm')(x_BxTxD)
    return tied_logits(self, cfg, word.attend(x_BxTxD))  # tied output embedding

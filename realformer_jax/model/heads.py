"""Task heads: masked-LM (evaluated at the masked positions only), pooler, classifier."""

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig
from realformer_jax.model import initializers
from realformer_jax.model.activations import get_activation
from realformer_jax.model.attention import MASKED_LOGIT
from realformer_jax.model.layers import DenseGeneral, Dropout, configured_dense
from realformer_jax.model.normalization import Norm


def _dense(cfg: ModelConfig, features: int, axes, name: str) -> DenseGeneral:
  return configured_dense(
    cfg,
    features=(features,),
    kernel_axes=axes,
    kernel_init=initializers.kernel_init(
      cfg, fan_in=cfg.hidden_size, fan_out=features, role='head'
    ),
    name=name,
  )


def gather_positions(h_BxLxD: jax.Array, positions_BxP: jax.Array) -> jax.Array:
  return jnp.take_along_axis(h_BxLxD, positions_BxP[:, :, None].astype(jnp.int32), axis=1)


def tied_logits(module: nn.Module, cfg: ModelConfig, decoded: jax.Array) -> jax.Array:
  """float32 logits from the tied embedding's `decoded` output, plus `module`'s 'output_bias'
  [vocab] where the config has biases (the masked-LM head's and the translation decoder's)."""
  logits = decoded.astype(jnp.float32)
  if cfg.use_bias:
    bias_V = module.param(
      'output_bias',
      nn.with_logical_partitioning(nn.initializers.zeros, ('vocab',)),
      (cfg.vocab_size,),
      cfg.storage_dtype,
    )
    logits = logits + bias_V.astype(jnp.float32)
  return logits


class MaskedLMHead(nn.Module):
  """dense -> activation -> norm -> tied decoder + output bias. Logits are float32.

  Takes hidden states already gathered at the predicted positions, so pretraining never builds
  a [batch, length, vocab] tensor (BERT's gather_indexes).
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, h_BxPxD: jax.Array, decode: Callable[[jax.Array], jax.Array]) -> jax.Array:
    cfg = self.config
    x_BxPxD = _dense(cfg, cfg.hidden_size, ('embed', 'mlp'), 'transform')(h_BxPxD)
    # Pin the layout before the tied decoder: without it, a data x fsdp x tensor mesh (kernel
    # ('embed','mlp') -> (fsdp, tensor), embeddings ('vocab','embed') -> (tensor, fsdp)) gets
    # a wrong transform-kernel gradient from XLA's SPMD partitioner (jax 0.10.2; reproduced
    # with plain einsums, both partitioners). tests/train/test_train_sharding.py guards it.
    x_BxPxD = nn.with_logical_constraint(x_BxPxD, ('batch', 'length', 'embed'))
    x_BxPxD = get_activation(cfg.activation)(x_BxPxD)
    x_BxPxD = Norm(cfg, name='norm')(x_BxPxD)
    return tied_logits(self, cfg, decode(x_BxPxD))


class Pooler(nn.Module):
  """tanh(dense(h[:, 0])): the [CLS] summary BERT feeds to sentence-level heads."""

  config: ModelConfig

  @nn.compact
  def __call__(self, h_BxLxD: jax.Array) -> jax.Array:
    return jnp.tanh(
      _dense(self.config, self.config.hidden_size, ('embed', 'mlp'), 'dense')(h_BxLxD[:, 0])
    )


class ClassificationHead(nn.Module):
  """Pooled [CLS] -> dropout -> logits [B, num_classes] (float32)."""

  config: ModelConfig
  num_classes: int

  @nn.compact
  def __call__(self, pooled_BxD: jax.Array, deterministic: bool = True) -> jax.Array:
    x_BxD = Dropout(self.config.dropout_rate, generator=self.config.dropout_generator)(
      pooled_BxD, deterministic=deterministic
    )
    return _dense(self.config, self.num_classes, ('embed', None), 'classifier')(x_BxD).astype(
      jnp.float32
    )


class SpanHead(nn.Module):
  """Hidden states -> (start, end) logits [B, L] each, float32 (BERT's SQuAD head: one dense
  layer with two outputs). Padding positions get a large negative logit, so a softmax over
  the sequence never picks them."""

  config: ModelConfig

  @nn.compact
  def __call__(self, h_BxLxD: jax.Array, input_mask_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits_BxLx2 = _dense(self.config, 2, ('embed', None), 'span')(h_BxLxD).astype(jnp.float32)
    logits_BxLx2 = jnp.where(input_mask_BxL[..., None] > 0, logits_BxLx2, MASKED_LOGIT)
    return logits_BxLx2[..., 0], logits_BxLx2[..., 1]

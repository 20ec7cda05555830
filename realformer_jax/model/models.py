"""End-to-end models: masked-LM pretraining, sequence classification, span extraction."""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig
from realformer_jax.model.encoder import Encoder
from realformer_jax.model.heads import (
  ClassificationHead,
  MaskedLMHead,
  Pooler,
  SpanHead,
  gather_positions,
)


class MaskedLM(nn.Module):
  """Encoder + MLM head. params: {'encoder': ..., 'mlm_head': ...}."""

  config: ModelConfig

  @nn.compact
  def __call__(
    self,
    input_ids_BxL: jax.Array,
    input_mask_BxL: Optional[jax.Array] = None,
    segment_ids_BxL: Optional[jax.Array] = None,
    masked_positions_BxP: Optional[jax.Array] = None,
    *,
    deterministic: bool = True,
    step: Optional[jax.Array] = None,
  ) -> jax.Array:
    """Logits float32 [B, P, V] at `masked_positions` ([B, L, V] at every position if None:
    for analysis only, never for pretraining)."""
    encoder = Encoder(self.config, name='encoder')
    h_BxLxD = encoder(
      input_ids_BxL, input_mask_BxL, segment_ids_BxL, deterministic=deterministic, step=step
    )
    if masked_positions_BxP is not None:
      h_BxLxD = gather_positions(h_BxLxD, masked_positions_BxP)
    return MaskedLMHead(self.config, name='mlm_head')(h_BxLxD, encoder.attend)


class SequenceClassifier(nn.Module):
  """Encoder + pooler + classifier. params: {'encoder', 'pooler', 'classifier'}."""

  config: ModelConfig
  num_classes: int

  @nn.compact
  def __call__(
    self,
    input_ids_BxL: jax.Array,
    input_mask_BxL: Optional[jax.Array] = None,
    segment_ids_BxL: Optional[jax.Array] = None,
    *,
    deterministic: bool = True,
    step: Optional[jax.Array] = None,
  ) -> jax.Array:
    h_BxLxD = Encoder(self.config, name='encoder')(
      input_ids_BxL, input_mask_BxL, segment_ids_BxL, deterministic=deterministic, step=step
    )
    pooled_BxD = Pooler(self.config, name='pooler')(h_BxLxD)
    return ClassificationHead(self.config, self.num_classes, name='classifier')(
      pooled_BxD, deterministic
    )


class SpanExtractor(nn.Module):
  """Encoder + span head (SQuAD): (start, end) logits [B, L] each. params: {'encoder', 'span'}."""

  config: ModelConfig

  @nn.compact
  def __call__(
    self,
    input_ids_BxL: jax.Array,
    input_mask_BxL: Optional[jax.Array] = None,
    segment_ids_BxL: Optional[jax.Array] = None,
    *,
    deterministic: bool = True,
    step: Optional[jax.Array] = None,
  ) -> tuple[jax.Array, jax.Array]:
    if input_mask_BxL is None:
      input_mask_BxL = jnp.ones_like(input_ids_BxL)
    h_BxLxD = Encoder(self.config, name='encoder')(
      input_ids_BxL, input_mask_BxL, segment_ids_BxL, deterministic=deterministic, step=step
    )
    return SpanHead(self.config, name='span')(h_BxLxD, input_mask_BxL)

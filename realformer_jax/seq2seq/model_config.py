"""The encoder-decoder's config: the encoder's ModelConfig (realformer_jax/config.py) plus the
decoder, a concern only encoder-decoder models have.

    cfg = Seq2SeqModelConfig(num_layers=6, num_decoder_layers=6, decoder_attention='aan')
"""

from __future__ import annotations

import dataclasses

from realformer_jax.config import ConfigError, ModelConfig

# 'standard' (masked self-attention, cross-attention, FFN), 'aan' (average attention with FFN
# and gating instead of self-attention), 'merged' (DS-Init paper: AAN + cross-attention in one
# sublayer, then FFN): decoder.py.
DECODER_ATTENTIONS = ('standard', 'aan', 'merged')


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """The decoder's own fields (its width, heads, norms and kernels are the encoder's)."""

  num_decoder_layers: int = 6  # decoder depth; num_layers stays the encoder's
  decoder_attention: str = 'standard'  # 'standard' | 'aan' | 'merged' (DECODER_ATTENTIONS)


@dataclasses.dataclass(frozen=True)
class Seq2SeqModelConfig(DecoderConfig, ModelConfig):
  """ModelConfig plus the decoder; the `model` section of a translation run."""

  def __post_init__(self):
    super().__post_init__()
    if self.decoder_attention not in DECODER_ATTENTIONS:
      raise ConfigError(
        f'model.decoder_attention={self.decoder_attention!r}: must be one of '
        f'{", ".join(DECODER_ATTENTIONS)}'
      )
    layers = self.num_decoder_layers
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
      raise ConfigError(f'model.num_decoder_layers={layers!r}: must be a positive integer')


# The decoder's fields, by the one dataclass that declares them.
DECODER_FIELDS = tuple(f.name for f in dataclasses.fields(DecoderConfig))

"""Encoder-decoder model: the project's encoder (every LN placement, residual attention,
initialisation and scaling variant) and the decoder of decoder.py.

    model = Seq2Seq(config)    # a Seq2SeqModelConfig; config.num_layers: encoder depth
    logits = model.apply(variables, source, source_mask, target_in)     # teacher forcing
    encoded = model.apply(variables, source, source_mask, method=Seq2Seq.encode)

Token conventions (decoding.py): targets start with `bos_id` when shifted right, end with
`eos_id`, and are padded with 0 ([PAD]).
"""

import flax.linen as nn
import jax

from realformer_jax.config import ConfigError
from realformer_jax.model.encoder import Encoder
from realformer_jax.seq2seq.decoder import Decoder
from realformer_jax.seq2seq.model_config import Seq2SeqModelConfig


class Seq2Seq(nn.Module):
  """params: {'encoder', 'decoder'}; decoding caches live in the 'cache' collection."""

  config: Seq2SeqModelConfig

  def setup(self):
    cfg = self.config
    if cfg.residual_branch == 'fixed_schedule':
      # Its gate is a function of the training step, which decoding does not have.
      raise ConfigError(
        "model.residual_branch='fixed_schedule': not supported by Seq2Seq "
        '(decoding has no training step); use plain, rezero or skipinit'
      )
    self.encoder = Encoder(cfg)
    self.decoder = Decoder(cfg)

  def encode(
    self, source_BxS: jax.Array, source_mask_BxS: jax.Array, *, deterministic: bool = True
  ) -> jax.Array:
    return self.encoder(source_BxS, source_mask_BxS, deterministic=deterministic)

  def decode(
    self,
    target_in_BxT: jax.Array,
    encoded_BxSxD: jax.Array,
    source_mask_BxS: jax.Array,
    *,
    decode: bool = False,
    deterministic: bool = True,
  ) -> jax.Array:
    return self.decoder(
      target_in_BxT, encoded_BxSxD, source_mask_BxS, decode=decode, deterministic=deterministic
    )

  def __call__(
    self,
    source_BxS: jax.Array,
    source_mask_BxS: jax.Array,
    target_in_BxT: jax.Array,
    *,
    deterministic: bool = True,
  ) -> jax.Array:
    """Logits [B, T, V] float32 for every target position (teacher forcing)."""
    encoded = self.encode(source_BxS, source_mask_BxS, deterministic=deterministic)
    return self.decode(target_in_BxT, encoded, source_mask_BxS, deterministic=deterministic)

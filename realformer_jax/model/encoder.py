"""The encoder: embeddings, then a scanned (or looped) stack of layers carrying
(hidden states, residual attention scores).

With `scan_layers=True` the layer parameters are stacked on a leading `layers` axis
(params['layers'][...] has shape [num_layers, ...]); with `scan_layers=False` each layer has its
own subtree `layers_<i>`. `realformer_jax.model.params.stack_layers / unstack_layers` convert
between the two, and both paths compute the same numbers from the same weights.
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax import kernels
from realformer_jax.config import ModelConfig
from realformer_jax.kernels.recomputed_scores import residual_stack
from realformer_jax.model.attention import SCORES_AXES, mask_bias, score_scale
from realformer_jax.model.block import EncoderLayer, LayerInputs
from realformer_jax.model.embeddings import Embeddings
from realformer_jax.model.normalization import Norm
from realformer_jax.model.params import unbox
from realformer_jax.model.placement import placement

REMAT_POLICIES = {
  'full': jax.checkpoint_policies.nothing_saveable,
  'dots': jax.checkpoint_policies.dots_saveable,
  'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _layer_class(config: ModelConfig):
  if config.remat_policy == 'none':
    return EncoderLayer
  # prevent_cse=False is safe only when each layer is its own (rolled) scan iteration:
  # otherwise XLA's CSE merges the backward's recomputation with the forward and the
  # rematerialisation saves nothing.
  rolled = config.scan_layers and config.scan_unroll == 1
  # `deterministic` rides in LayerInputs as static pytree data: no static_argnums needed.
  return nn.remat(EncoderLayer, policy=REMAT_POLICIES[config.remat_policy], prevent_cse=not rolled)


def residual_gate_value(config: ModelConfig, step: Optional[jax.Array]) -> Optional[jax.Array]:
  """The fixed-schedule residual gate min(1, step / gate_schedule_steps), else None."""
  if config.residual_branch != 'fixed_schedule':
    return None
  if step is None:
    raise ValueError(
      "model.residual_branch='fixed_schedule' needs the training step: "
      'pass step=... to the model call'
    )
  return jnp.clip(jnp.asarray(step, jnp.float32) / config.gate_schedule_steps, 0.0, 1.0)


class Encoder(nn.Module):
  """Token ids -> contextual hidden states [B, L, D] (Pre-LN adds a final norm)."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embeddings = Embeddings(cfg)
    layer_cls = _layer_class(cfg)
    if cfg.scan_layers:
      self.layers = nn.scan(
        layer_cls,
        variable_axes={'params': 0, 'intermediates': 0, 'perturbations': 0},
        split_rngs={'params': True, 'dropout': True},
        in_axes=(0, nn.broadcast),  # (layer index, LayerInputs)
        length=cfg.num_layers,
        unroll=cfg.scan_unroll,
        metadata_params={nn.PARTITION_NAME: 'layers'},
      )(cfg)
    else:
      self.layers = [layer_cls(cfg) for _ in range(cfg.num_layers)]
    if placement(cfg).final_norm:
      self.final_norm = Norm(cfg)

  def __call__(
    self,
    input_ids_BxL: jax.Array,
    input_mask_BxL: Optional[jax.Array] = None,
    segment_ids_BxL: Optional[jax.Array] = None,
    *,
    deterministic: bool = True,
    step: Optional[jax.Array] = None,
  ) -> jax.Array:
    cfg = self.config
    if input_mask_BxL is None:
      input_mask_BxL = jnp.ones_like(input_ids_BxL)
    if segment_ids_BxL is None:
      segment_ids_BxL = jnp.zeros_like(input_ids_BxL)
    x_BxLxD = self.embeddings(input_ids_BxL, segment_ids_BxL, deterministic)
    inputs = LayerInputs(
      bias_Bx1x1xL=mask_bias(input_mask_BxL),
      scale=score_scale(cfg, input_mask_BxL),
      gate=residual_gate_value(cfg, step),
      deterministic=deterministic,
    )

    attention_plan = kernels.plan(
      cfg, input_ids_BxL.shape[1], maps_requested=self.is_mutable_collection('intermediates')
    )
    # Fused residual attention carries (sum, shadow) and rebuilds the sums going down
    # (kernels/carried.py); the top of the stack is sealed with the final sum.
    pair = kernels.pair_carry(cfg, attention_plan)
    scores = None
    if cfg.use_residual_attention and (cfg.scan_layers or pair):
      # Zeros are exact: 0 + s_0 == s_0, so layer 0 still sees only its own scores.
      batch, length = input_ids_BxL.shape
      scores = jnp.zeros((batch, cfg.num_heads, length, length), jnp.float32)
      scores = nn.with_logical_constraint(scores, SCORES_AXES)
    if cfg.scan_layers and self._recompute_scores():
      x_BxLxD = self._recomputed_stack(x_BxLxD, scores, inputs, fused=attention_plan is not None)
      pair = False
    elif cfg.scan_layers:
      scores = kernels.initial_carry(scores) if pair else scores
      (x_BxLxD, scores), _ = self.layers((x_BxLxD, scores), jnp.arange(cfg.num_layers), inputs)
    else:
      scores = kernels.initial_carry(scores) if pair else scores
      for index, layer in enumerate(self.layers):
        (x_BxLxD, scores), _ = layer((x_BxLxD, scores), jnp.asarray(index), inputs)
    if pair:
      x_BxLxD = kernels.seal(x_BxLxD, scores)
    if placement(cfg).final_norm:
      x_BxLxD = self.final_norm(x_BxLxD)
    return x_BxLxD

  def _recompute_scores(self) -> bool:
    # Analysis collections (sown maps, perturbation probes) take the plain scan, which
    # records them; the recomputed path is for training.
    cfg = self.config
    return (
      cfg.use_residual_attention
      and cfg.residual_scores_backward == 'recomputed'
      and not self.is_initializing()
      and not self.is_mutable_collection('intermediates')
      and not self.has_variable('perturbations', 'layers')
    )

  def _recomputed_stack(self, x_BxLxD, scores, inputs: LayerInputs, fused: bool):
    """The scanned layers through recomputed_scores.residual_stack, or its fused-kernel form
    (kernels/recomputed_stack.py); same parameters."""
    cfg = self.config
    params_N = unbox(self.variables['params']['layers'])
    layer = EncoderLayer(cfg, parent=None)  # unbound: applied to one layer's params at a time
    keys_N = None
    if not inputs.deterministic and (cfg.dropout_rate > 0 or cfg.attention_dropout_rate > 0):
      keys_N = jax.random.split(self.make_rng('dropout'), cfg.num_layers)

    def layer_fn(params_l, x, acc, index, key, layer_inputs):
      (y, acc_new), _ = layer.apply(
        {'params': params_l},
        (x, acc),
        index,
        layer_inputs,
        rngs=None if key is None else {'dropout': key},
      )
      return y, acc_new

    stack = kernels.kernel_residual_stack if fused else residual_stack
    return stack(layer_fn, params_N, x_BxLxD, scores, keys_N, inputs)

  def attend(self, h_BxPxD: jax.Array) -> jax.Array:
    """Tied decoder: hidden states -> vocabulary logits through the word embeddings."""
    return self.embeddings.attend(h_BxPxD)

"""The encoder: embeddings, then a scanned (or looped) stack of layers carrying
(hidden states, residual attention scores).

With `scan_layers=True` the layer parameters are stacked on a leading `layers` axis
(params['layers'][...] has shape [num_layers, ...]); with `scan_layers=False` each layer has its
own subtree `layers_<i>`. `realformer_jax.model.params.stack_layers / unstack_layers` convert
between the two, and both paths compute the same numbers from the same weights.
"""

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax.config import ModelConfig
from realformer_jax.kernels.plumbing.fused import SAVED_FOR_BACKWARD
from realformer_jax.kernels.score_paths.score_path import stack_path
from realformer_jax.model import layer_unroll
from realformer_jax.model.attention import SCORES_AXES, einsum_attention, mask_bias, score_scale
from realformer_jax.model.block import EncoderLayer, LayerInputs
from realformer_jax.model.embeddings import Embeddings
from realformer_jax.model.normalization import Norm
from realformer_jax.model.params import unbox
from realformer_jax.model.placement import placement

_policies = jax.checkpoint_policies
# Every policy also keeps what the fused attention names for its backward (its output and row
# statistics: kernels/plumbing/fused.py), so that the re-run of a layer runs no attention forward
# kernel; nothing else of the layer is kept beyond the policy's own choice. The einsum path and
# the carried-sum kernels name nothing.
_ATTENTION = _policies.save_only_these_names(SAVED_FOR_BACKWARD)
REMAT_POLICIES = {
  'full': _ATTENTION,
  'dots': _policies.save_from_both_policies(_policies.dots_saveable, _ATTENTION),
  'dots_no_batch': _policies.save_from_both_policies(
    _policies.dots_with_no_batch_dims_saveable, _ATTENTION
  ),
}


def _layer_class(config: ModelConfig):
  if config.remat_policy == 'none':
    return EncoderLayer
  # prevent_cse=False is safe only when each layer is its own (rolled) scan iteration:
  # otherwise XLA's CSE merges the backward's recomputation with the forward and the
  # rematerialisation saves nothing.
  rolled = config.scan_layers and layer_unroll.layers_per_iteration(config) == 1
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


def check_token_ids(ids: jax.Array, vocab_size: int, under_jit: bool = False) -> None:
  """ValueError naming the first token id outside [0, vocab_size) and where it is: at once for
  concrete ids (an eager call), at run time under jit when `under_jit` (a host callback, whose
  error the step raises as a JaxRuntimeError carrying this message)."""
  if not isinstance(ids, jax.core.Tracer):
    _raise_for_bad_ids(ids, vocab_size)
  elif under_jit:
    jax.debug.callback(functools.partial(_raise_for_bad_ids, vocab_size=vocab_size), ids)


def _raise_for_bad_ids(ids, vocab_size: int) -> None:
  ids = np.asarray(ids)
  bad = np.argwhere((ids < 0) | (ids >= vocab_size))
  if len(bad):
    where = tuple(int(i) for i in bad[0])
    raise ValueError(
      f'input_ids{list(where)} = {int(ids[where])}: outside the vocabulary [0, {vocab_size}) '
      f'(model.vocab_size; {len(bad)} such id(s)); an embedding lookup there gives NaN'
    )


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
        unroll=layer_unroll.layers_per_iteration(cfg),  # 'auto': model/layer_unroll.py
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
    """Contextual hidden states of a batch of token ids.

    Args:
      input_ids_BxL: int[batch, len] token ids in [0, config.vocab_size). An id outside embeds
        as NaN (a gather out of range): an eager call raises ValueError instead, and under jit
        `config.check_token_ids=True` makes the step raise (check_token_ids below).
      input_mask_BxL: 1 at real tokens, 0 at padding (default: all real); padding is never
        attended to and leaves the real positions' outputs unchanged.
      segment_ids_BxL: token types in [0, config.type_vocab_size) (default: all 0).
      deterministic: no dropout (evaluation); False needs a 'dropout' PRNG stream.
      step: the training step, for the residual branches gated on a schedule
        (`residual_branch='fixed_schedule'`).

    Returns:
      float[batch, len, hidden_size] in config.dtype; Pre-LN ends with the final norm.
    """
    cfg = self.config
    check_token_ids(input_ids_BxL, cfg.vocab_size, under_jit=cfg.check_token_ids)
    if input_mask_BxL is None:
      input_mask_BxL = jnp.ones_like(input_ids_BxL)
    if segment_ids_BxL is None:
      segment_ids_BxL = jnp.zeros_like(input_ids_BxL)
    x_BxLxD = self.embeddings(input_ids_BxL, segment_ids_BxL, deterministic)
    # How attention runs and how its scores travel through the stack, decided once here
    # (kernels/score_paths/score_path.py); the path runs the stack and every layer attends through
    # it.
    path = stack_path(
      cfg,
      input_ids_BxL.shape[1],
      einsum=einsum_attention,
      maps_requested=self.is_mutable_collection('intermediates'),
      may_recompute=self._may_recompute(),
    )
    inputs = LayerInputs(
      bias_Bx1x1xL=mask_bias(input_mask_BxL),
      scale=score_scale(cfg, input_mask_BxL),
      gate=residual_gate_value(cfg, step),
      deterministic=deterministic,
      path=path,
    )
    x_BxLxD = path.run_stack(_Layers(self, inputs, input_ids_BxL.shape), x_BxLxD)
    if placement(cfg).final_norm:
      x_BxLxD = self.final_norm(x_BxLxD)
    return x_BxLxD

  def _may_recompute(self) -> bool:
    # Analysis collections (sown maps, perturbation probes) take the plain scan, which
    # records them; the recomputing stacks are for training.
    return (
      not self.is_initializing()
      and not self.is_mutable_collection('intermediates')
      and not self.has_variable('perturbations', 'layers')
    )

  def attend(self, h_BxPxD: jax.Array) -> jax.Array:
    """Tied decoder: hidden states -> vocabulary logits through the word embeddings."""
    return self.embeddings.attend(h_BxPxD)


class _Layers:
  """The encoder's layers as kernels.LayerStack: what a ScorePath runs the stack with."""

  def __init__(self, encoder: Encoder, inputs: LayerInputs, shape_BxL: tuple[int, int]):
    self.encoder, self.inputs, self.shape_BxL = encoder, inputs, shape_BxL
    self.scanned = encoder.config.scan_layers

  def zero_scores(self) -> jax.Array:
    batch, length = self.shape_BxL
    scores = jnp.zeros((batch, self.encoder.config.num_heads, length, length), jnp.float32)
    return nn.with_logical_constraint(scores, SCORES_AXES)

  def run(self, x_BxLxD, scores):
    encoder = self.encoder
    if self.scanned:
      indices = jnp.arange(encoder.config.num_layers)
      (x_BxLxD, scores), _ = encoder.layers((x_BxLxD, scores), indices, self.inputs)
      return x_BxLxD, scores
    for index, layer in enumerate(encoder.layers):
      (x_BxLxD, scores), _ = layer((x_BxLxD, scores), jnp.asarray(index), self.inputs)
    return x_BxLxD, scores

  def recompute(self, stack_fn, x_BxLxD, *paths, carry0=None):
    """The scanned layers' parameters through a functional stack (same parameters)."""
    encoder, cfg = self.encoder, self.encoder.config
    params_N = unbox(encoder.variables['params']['layers'])
    layer = EncoderLayer(cfg, parent=None)  # unbound: applied to one layer's params at a time
    keys_N = None
    if not self.inputs.deterministic and (cfg.dropout_rate > 0 or cfg.attention_dropout_rate > 0):
      keys_N = jax.random.split(encoder.make_rng('dropout'), cfg.num_layers)

    def layer_fn_of(path):
      def layer_fn(params_l, x, scores, index, key, layer_inputs):
        (y, scores), _ = layer.apply(
          {'params': params_l},
          (x, scores),
          index,
          layer_inputs.replace(path=path),
          rngs=None if key is None else {'dropout': key},
        )
        return y, scores

      return layer_fn

    layer_fns = tuple(layer_fn_of(path) for path in paths)
    carry0 = self.zero_scores() if carry0 is None else carry0
    return stack_fn(layer_fns, params_N, x_BxLxD, carry0, keys_N, self.inputs)

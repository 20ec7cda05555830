"""How attention runs and how residual attention's scores travel: one object per model call.

The encoder asks `stack_path(config, seq_len, ...)` once, hands the result to every layer
(block.LayerInputs.path) and lets it run the layer stack; each layer's ResidualSelfAttention
asks it to attend. Everything about the form of the carried scores (a bare float32 sum, a
(sum, shadow) pair that must be sealed at the top, a known sum re-read going down) stays
behind these two methods, so the encoder and the attention module never branch on it:

  attend(qkv, carried, bias, scale, divisor, dropout_key, keep_prob, record)
      -> (context [B, L, H, K], what to carry to the next layer, or None)
  run_stack(layers, x) -> the stack's output
      `layers` (a LayerStack, the encoder's) runs the layer modules on (x, initial carry),
      or gives a functional layer for the stacks that recompute going down.

| path                 | attention                | carried between layers              |
|----------------------|--------------------------|-------------------------------------|
| EinsumPath           | the einsum path (model)  | the sum; autodiff saves it          |
| FusedPath            | Pallas kernels or cuDNN  | the sum; autodiff saves it          |
| SealedPairPath       | Pallas kernels           | (sum, shadow), sealed (carried.py)  |
| RecomputedEinsumPath | the einsum path          | the sum; recomputed_scores.py       |
| RecomputedFusedPath  | Pallas kernels           | the sum; recomputed_stack.py        |
| QKPath               | einsum path or kernels   | every layer's Q, K (qk_carry.py)    |
| RingPath             | ring over the sequence   | the sum's query rows; autodiff      |
| RecomputedRingPath   | ring over the sequence   | the sum's rows; recomputed_scores   |
| RingQKPath           | ring over the sequence   | every layer's Q, K (the K travel)   |

The ring paths (ring_attention.py) are taken when the traced program's mesh splits the length
(the `sequence` axis); each block is attended with the einsum formula.

A future way of carrying scores is one more implementation of these two methods and one more
row of `_PATHS`, the table that `stack_path` decides by (`stack_carry` names the carry).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig
from realformer_jax.kernels.plumbing import refusals
from realformer_jax.kernels.plumbing.attend import fused_self_attention, plan_spec
from realformer_jax.kernels.plumbing.select import (
  AttentionPlan,
  check_qk,
  pair_carry,
  plan,
  resolve_residual_carry,
)
from realformer_jax.kernels.score_paths import carried, qk_carry, qk_reference, ring_attention
from realformer_jax.kernels.score_paths.recomputed_scores import residual_stack
from realformer_jax.kernels.score_paths.recomputed_stack import kernel_residual_stack

# einsum(qkv, prev_scores, bias, scale, divisor, dropout_key, keep_prob, dtype, record,
#   generator) -> (context, scores): the model's reference attention (model/attention.py),
# handed in so that kernels/ does not import the model.
EinsumAttention = Callable[..., tuple[jax.Array, jax.Array]]
# record(name, value): stores an attention map (the module's `sow`), or None.
Record = Optional[Callable[[str, jax.Array], Any]]


def _einsum(path, qkv, prev_scores, bias, scale, divisor, dropout_key, keep_prob, record):
  """`path.einsum` in the path's compute dtype and with its dropout generator."""
  return path.einsum(
    qkv,
    prev_scores,
    bias,
    scale,
    divisor,
    dropout_key,
    keep_prob,
    path.dtype,
    record,
    path.generator,
  )


class LayerStack(Protocol):
  """What the encoder hands `run_stack`: its layers, run two ways."""

  scanned: bool  # the layers are one nn.scan (the carry must keep one structure)

  def zero_scores(self) -> jax.Array:
    """float32 [B, H, L, L] zeros, laid out as the carried scores are."""

  def run(self, x: jax.Array, scores: Any) -> tuple[jax.Array, Any]:
    """The layer modules (scan or loop) on (x, scores) -> (y, final scores)."""

  def recompute(
    self, stack_fn: Callable[..., jax.Array], x: jax.Array, *paths: 'ScorePath', carry0=None
  ):
    """stack_fn(layer_fns, params_N, x, acc0, keys_N, inputs): a stack that recomputes going
    down, given one functional layer per path (layer_fn(params_l, x, scores, index, key,
    inputs) -> (y, scores'), attending through that path). acc0: `carry0`, else
    zero_scores()."""


@dataclasses.dataclass(frozen=True)
class ScorePath:
  """Base: attention whose carried scores (if any) are a bare sum that autodiff saves."""

  residual: bool  # the layers carry scores (residual attention)

  def attend(
    self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob: float, record: Record
  ) -> tuple[jax.Array, Any]:
    raise NotImplementedError

  def initial_carry(self, layers: LayerStack) -> Any:
    # Zeros are exact (0 + s_0 == s_0); a loop starts from None, a scan needs one structure.
    return layers.zero_scores() if self.residual and layers.scanned else None

  def run_stack(self, layers: LayerStack, x: jax.Array) -> jax.Array:
    y, _ = layers.run(x, self.initial_carry(layers))
    return y


@dataclasses.dataclass(frozen=True)
class EinsumPath(ScorePath):
  """The reference path: the model's einsum attention (probabilities materialised)."""

  einsum: EinsumAttention = None
  dtype: Any = None  # the compute dtype
  generator: str = 'threefry'  # the dropout masks' hash (model.dropout_generator)

  def attend(self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob, record):
    context, scores = _einsum(
      self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob, record
    )
    return context, scores if self.residual else None


@dataclasses.dataclass(frozen=True)
class FusedPath(ScorePath):
  """A fused kernel (kernels/plumbing/select.py's plan); a carried sum is read and written as is."""

  plan: AttentionPlan = None
  # The kernels give the bias and scale no gradient: one asked for is refused (refusals.py).
  # Off only where this path's caller differentiates them on purpose (_TopDownPath).
  refuse_bias_and_scale_gradients: bool = True

  def _fused(self, form, qkv, scores_in, bias, scale, divisor, dropout_key, keep_prob):
    if self.refuse_bias_and_scale_gradients:
      bias, scale = refusals.refuse_tangent((bias, scale), refusals.SCALE_OR_BIAS)
    return fused_self_attention(
      self.plan,
      form,
      qkv,
      scores_in,
      bias,
      scale,
      divisor,
      dropout_key,
      keep_prob,
      carry_out=self.residual,
    )

  def attend(self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob, record):
    scores_in = () if carried_in is None else (carried_in,)
    context, scores = self._fused(
      'sum', qkv, scores_in, bias, scale, divisor, dropout_key, keep_prob
    )
    return context, scores[0] if scores else None


@dataclasses.dataclass(frozen=True)
class SealedPairPath(FusedPath):
  """Residual attention on the kernels without remat: the layers carry a (sum, shadow) pair
  and the kernels rebuild each layer's sum going down (carried.py); run_stack makes the pair
  and seals the top, so no caller can forget to."""

  def attend(self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob, record):
    if not isinstance(carried_in, carried.CarriedScores):
      raise TypeError(
        'SealedPairPath.attend: the carried scores must come from its run_stack '
        f'(got {type(carried_in).__name__}); a single layer takes kernels.layer_path'
      )
    context, scores = self._fused(
      'pair', qkv, tuple(carried_in), bias, scale, divisor, dropout_key, keep_prob
    )
    return context, carried.CarriedScores(*scores)

  def run_stack(self, layers: LayerStack, x: jax.Array) -> jax.Array:
    y, final = layers.run(x, carried.initial_carry(layers.zero_scores()))
    return carried.seal(y, final)


@dataclasses.dataclass(frozen=True)
class _TopDownPath(FusedPath):
  """A layer re-run going down from the sum it wrote (recomputed_stack.py's backward, whose
  layer VJP differentiates the shared inputs; RecomputedFusedPath refuses their gradient at
  the stack's entrance instead)."""

  refuse_bias_and_scale_gradients: bool = False

  def attend(self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob, record):
    context, scores = self._fused(
      'top_down', qkv, tuple(carried_in), bias, scale, divisor, dropout_key, keep_prob
    )
    return context, carried.TopDown(*scores)


@dataclasses.dataclass(frozen=True)
class RecomputedEinsumPath(EinsumPath):
  """`residual_scores_backward='recomputed'` on the einsum path: recomputed_scores.py."""

  def run_stack(self, layers: LayerStack, x: jax.Array) -> jax.Array:
    return layers.recompute(_one_layer_fn(residual_stack), x, self)


@dataclasses.dataclass(frozen=True)
class RecomputedFusedPath(FusedPath):
  """`residual_scores_backward='recomputed'` on the kernels: recomputed_stack.py. Going up the
  layers carry the bare sum; going down each is re-run by a _TopDownPath."""

  def run_stack(self, layers: LayerStack, x: jax.Array) -> jax.Array:
    return layers.recompute(
      _stack_refusing_input_gradients, x, self, _TopDownPath(self.residual, self.plan)
    )


@dataclasses.dataclass(frozen=True)
class QKPath(ScorePath):
  """`residual_carry='qk'`: the layers carry qk_carry.QKCarry (every layer's queries and
  keys, and the layer index) and each layer rebuilds its score sum from them: through the
  einsum path (one einsum over the stacked slots, then the model's einsum attention with that
  sum as its incoming scores) without a plan, else through the kernels. With `recompute` (a
  training call of a scanned stack) run_stack takes qk_carry.qk_stack, which saves the stack
  once instead of once per layer."""

  plan: Optional[AttentionPlan] = None  # None: the einsum path
  einsum: EinsumAttention = None
  dtype: Any = None  # the compute dtype
  generator: str = 'threefry'  # the einsum path's dropout hash (the kernels': the plan's)
  num_layers: int = 0
  heads: int = 0
  stack_head_dim: int = 0  # the head size the backend's kernels run at (Triton: padded)
  recompute: bool = False
  # As FusedPath's; off in the layers that qk_stack re-runs (it refuses at its entrance).
  refuse_bias_and_scale_gradients: bool = True
  # The layers qk_stack re-runs going down: attention from the carry's SavedAttention slot.
  replay: bool = False

  def attend(self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob, record):
    stack, index, saved = carried_in
    q, k, v = (qkv[:, :, part] for part in range(3))
    stack = nn.with_logical_constraint(qk_carry.push(stack, index, q, k), qk_carry.STACK_AXES)
    if self.plan is None:
      earlier = qk_reference.summed_scores(stack, index, scale, self.dtype)  # acc_{l-1}
      context, _ = _einsum(self, qkv, earlier, bias, scale, divisor, dropout_key, keep_prob, record)
    else:
      if self.refuse_bias_and_scale_gradients:
        bias, scale = refusals.refuse_tangent((bias, scale), refusals.SCALE_OR_BIAS)
      mine = saved.layer(index) if saved is not None and self.replay else None
      context, stack, attention = qk_carry.kernel_attention_saving(
        self.plan, stack, v, index, bias, scale, divisor, dropout_key, keep_prob, mine
      )
      if saved is not None and not self.replay:  # going up under qk_stack: keep it
        saved = saved.written(index, attention)
    return context, qk_carry.QKCarry(stack, index + 1, saved)

  def run_stack(self, layers: LayerStack, x: jax.Array) -> jax.Array:
    batch, length = x.shape[:2]
    shape = (2, self.num_layers, batch, length, self.heads, self.stack_head_dim)
    stack0 = nn.with_logical_constraint(jnp.zeros(shape, self.dtype), qk_carry.STACK_AXES)
    if self.recompute:
      refuse = self.plan is not None
      up = dataclasses.replace(self, refuse_bias_and_scale_gradients=False)
      down = dataclasses.replace(up, replay=True)
      return layers.recompute(
        _qk_stack_fn(refuse, self.saved_attention), x, up, down, carry0=stack0
      )
    y, _ = layers.run(x, qk_carry.QKCarry(stack0, jnp.zeros((), jnp.int32)))
    return y

  def saved_attention(self, stack0: jax.Array) -> Optional[qk_carry.SavedAttention]:
    """What the layers going up under qk_stack keep for their re-run going down (the kernels'
    output and statistics), or None: the einsum path re-runs its attention."""
    return None if self.plan is None else qk_carry.SavedAttention.zeros(stack0)


@dataclasses.dataclass(frozen=True)
class RingPath(EinsumPath):
  """The length split over the `sequence` mesh axis (ring_attention.py): each device attends
  its queries to the key / value blocks passed round the ring; a carried sum is held as each
  device's query rows and never crosses devices."""

  shards: ring_attention.SequenceShards = None

  def attend(self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob, record):
    q, k, v = (qkv[:, :, part] for part in range(3))
    return ring_attention.sequence_attention(
      self.shards,
      ring_attention.pair_logits,
      q,
      k,
      v,
      carried_in,
      bias,
      scale,
      divisor,
      dropout_key,
      keep_prob,
      self.dtype,
      carry_out=self.residual,
      generator=self.generator,
    )


@dataclasses.dataclass(frozen=True)
class RecomputedRingPath(RingPath, RecomputedEinsumPath):
  """`residual_scores_backward='recomputed'` over the ring: RingPath's attention, the stack of
  recomputed_scores.py (the rows of acc_{l-1} rebuilt going down, on each device)."""


@dataclasses.dataclass(frozen=True)
class RingQKPath(QKPath):
  """`residual_carry='qk'` over the ring: each device keeps its queries' stack (every layer's
  q so far, the layers above this one zeroed) and the key stack travels with V; each block's
  sum is rebuilt from them (ring_attention.stack_logits)."""

  shards: ring_attention.SequenceShards = None
  # The fused backend's plan whose qk block kernel attends each block of the forward
  # (ring_attention.block_backend), or None: the einsum formula.
  block_plan: Optional[AttentionPlan] = None

  def attend(self, qkv, carried_in, bias, scale, divisor, dropout_key, keep_prob, record):
    stack, index, saved = carried_in
    q, k, v = (qkv[:, :, part] for part in range(3))
    stack = nn.with_logical_constraint(qk_carry.push(stack, index, q, k), qk_carry.STACK_AXES)
    # Slots 0..index: the layers below and this one (a product with 0, as qk_reference).
    used = (jnp.arange(stack.shape[1]) <= index).astype(stack.dtype)[:, None, None, None, None]
    mine = saved.layer(index) if saved is not None and self.replay else None
    context, _, stats = ring_attention.sequence_attention_saving(
      self.shards,
      ring_attention.stack_logits,
      (stack[0] * used).astype(self.dtype),
      stack[1].astype(self.dtype),
      v,
      None,
      bias,
      scale,
      divisor,
      dropout_key,
      keep_prob,
      self.dtype,
      carry_out=False,
      generator=self.generator,
      saved=None if mine is None else (mine.out, (mine.m, mine.log_l)),
      block_kernel=None
      if self.block_plan is None
      else plan_spec(self.block_plan, self.heads, dropout_key, keep_prob),
      layer=index,
    )
    if saved is not None and not self.replay:  # going up under qk_stack: keep it
      saved = saved.written(index, qk_carry.SavedAttention(context, *stats))
    return context, qk_carry.QKCarry(stack, index + 1, saved)

  def saved_attention(self, stack0: jax.Array) -> qk_carry.SavedAttention:
    """The ring's output and statistics (m, log l), kept going up so that the layers re-run
    going down run only the backward ring: one forward ring per layer and step. Split as the
    layers' activations (the length over the ring)."""
    saved = qk_carry.SavedAttention.zeros(stack0)
    stats = (None, 'batch', 'heads', 'length')
    return qk_carry.SavedAttention(
      nn.with_logical_constraint(saved.out, qk_carry.STACK_AXES[1:]),
      nn.with_logical_constraint(saved.m, stats),
      nn.with_logical_constraint(saved.log_l, stats),
    )


def _qk_stack_fn(refuse: bool, saved_attention: Callable):
  """qk_carry.qk_stack over the layers run through the `up` and `down` paths; the layers going
  up save their attention in `saved_attention(stack0)` (qk_carry.SavedAttention; None: none)
  for the re-run going down. With the kernels (`refuse`) the bias and scale refuse a gradient."""

  def stack_fn(layer_fns, params_N, x, stack0, keys_N, inputs):
    saved0 = saved_attention(stack0)
    if refuse:
      inputs = refusals.refuse_tangent(inputs, refusals.SCALE_OR_BIAS)
    up_fn, down_fn = layer_fns

    def up(params_l, x, carry, index, key, aux):
      stack, saved = carry
      y, carry = up_fn(params_l, x, qk_carry.QKCarry(stack, index, saved), index, key, aux)
      return y, (carry.stack, carry.saved)

    def down(params_l, x, stack, saved, index, key, aux):
      y, carry = down_fn(params_l, x, qk_carry.QKCarry(stack, index, saved), index, key, aux)
      return y, carry.stack

    return qk_carry.qk_stack(up, down, params_N, x, stack0, saved0, keys_N, inputs)

  return stack_fn


def _stack_refusing_input_gradients(layer_fns, params_N, x, acc0, keys_N, inputs):
  inputs = refusals.refuse_tangent(inputs, refusals.SCALE_OR_BIAS)
  return kernel_residual_stack(layer_fns, params_N, x, acc0, keys_N, inputs)


def _one_layer_fn(stack_fn):
  return lambda layer_fns, *args: stack_fn(layer_fns[0], *args)


# The one table that decides a stack's path: (how the layers carry residual attention's
# scores, what attends: the einsum path, a fused kernel, or the ring over a split sequence)
# -> the path (the module docstring's table). Without residual attention the carry is
# 'saved': nothing is carried.
_PATHS = {
  ('saved', 'einsum'): EinsumPath,
  ('saved', 'kernels'): FusedPath,
  ('sealed', 'kernels'): SealedPairPath,
  ('recomputed', 'einsum'): RecomputedEinsumPath,
  ('recomputed', 'kernels'): RecomputedFusedPath,
  ('qk', 'einsum'): QKPath,
  ('qk', 'kernels'): QKPath,
  ('saved', 'ring'): RingPath,
  ('recomputed', 'ring'): RecomputedRingPath,
  ('qk', 'ring'): RingQKPath,
}


def _attends(config: ModelConfig, seq_len: int, maps_requested: bool):
  """(what attends: 'ring' | 'kernels' | 'einsum', the kernels' plan or None, the sequence
  shards or None). A split sequence takes the ring (unless attention maps are sown: the einsum
  path, whose probabilities GSPMD lays out over the mesh)."""
  shards = None if maps_requested else ring_attention.sequence_shards()
  if shards is not None:  # what the ring cannot run was refused at validation (check_config)
    return 'ring', None, shards
  attention_plan = plan(config, seq_len, maps_requested=maps_requested)
  return ('einsum' if attention_plan is None else 'kernels'), attention_plan, None


def stack_carry(
  config: ModelConfig,
  seq_len: int,
  attention_plan: Optional[AttentionPlan],
  may_recompute: bool = False,
) -> str:
  """How a layer stack carries residual attention's scores: 'qk' (every layer's queries and
  keys: residual_carry 'qk', or 'auto' decided so for this length), 'recomputed' (the sum,
  rebuilt going down: residual_scores_backward='recomputed' in a training call of a scanned
  stack), 'sealed' (the sum as a sealed pair on the kernels: select.pair_carry) or 'saved'
  (the sum, saved by autodiff; also without residual attention)."""
  if not config.use_residual_attention:
    return 'saved'
  if resolve_residual_carry(config, seq_len) == 'qk':
    return 'qk'
  if may_recompute and config.scan_layers and config.residual_scores_backward == 'recomputed':
    return 'recomputed'
  return 'sealed' if pair_carry(config, attention_plan) else 'saved'


def stack_path(
  config: ModelConfig,
  seq_len: int,
  *,
  einsum: EinsumAttention,
  maps_requested: bool = False,
  may_recompute: bool = False,
) -> ScorePath:
  """The path of one encoder call (_PATHS). `maps_requested`: attention maps are sown (einsum
  path); `may_recompute`: the caller allows a stack that recomputes going down (a training
  call: not init, no analysis collections), taken when the config asks for it (always with
  residual_carry='qk', whose stack saves the carry once). residual_carry='auto' left for the
  model to decide (a model used outside the train setup) is select.py's rule against the
  first local device's memory."""
  attends, attention_plan, shards = _attends(config, seq_len, maps_requested)
  residual = config.use_residual_attention
  carry = stack_carry(config, seq_len, attention_plan, may_recompute)
  path_class = _PATHS[carry, attends]
  ring = {} if shards is None else {'shards': shards}
  if carry == 'qk':
    check_qk(config, attention_plan)
    if shards is not None and ring_attention.block_backend(config) is not None:
      ring['block_plan'] = plan(config, seq_len)
    return path_class(
      residual,
      plan=attention_plan,
      einsum=einsum,
      dtype=config.compute_dtype,
      generator=config.dropout_generator,
      num_layers=config.num_layers,
      heads=config.num_heads,
      stack_head_dim=(
        config.head_dim
        if attention_plan is None
        else attention_plan.kernels.head_dim(config.head_dim)
      ),
      recompute=may_recompute and config.scan_layers,
      **ring,
    )
  if attention_plan is None:
    return path_class(
      residual, einsum, config.compute_dtype, generator=config.dropout_generator, **ring
    )
  return path_class(residual, attention_plan)


def layer_path(
  config: ModelConfig, seq_len: int, *, einsum: EinsumAttention, maps_requested: bool = False
) -> ScorePath:
  """The path of one attention layer used on its own (no stack): the sum carried as is."""
  attends, attention_plan, shards = _attends(config, seq_len, maps_requested)
  if attends == 'ring':
    return RingPath(
      config.use_residual_attention,
      einsum,
      config.compute_dtype,
      generator=config.dropout_generator,
      shards=shards,
    )
  if attention_plan is None:
    return EinsumPath(
      config.use_residual_attention, einsum, config.compute_dtype, config.dropout_generator
    )
  return FusedPath(config.use_residual_attention, attention_plan)

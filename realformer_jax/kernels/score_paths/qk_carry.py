"""residual_carry='qk': residual attention carrying the stacked queries and keys of the layers
below instead of their float32 [B, H, L, L] score sum (qk_reference.py has the identity).

The carry between layers is `QKCarry(stack, index)`: `stack` [2, N, B, L, H, K] in the compute
dtype (part 0 the queries, part 1 the keys; layer i writes slot i; the values were computed in
that dtype, so storing them in it is exact) and `index` the int32 number of the next layer, so
the layer index is a traced scalar and the stack stays one rolled nn.scan.
Layer l writes its q, k (after the rotary rotation) into slot l and attends with
acc_l = sum_{i<=l} scale Q_i K_i^T, which is formed tile by tile inside the kernels
(backends/triton/qk_attention.py, backends/mosaic/qk_attention.py) or, on the einsum path, by
one einsum over the slots (qk_reference.summed_scores), and never carried.
Memory: 2 N B L H K values of the compute dtype, O(L).

`qk_attention` is the kernels' op (a custom VJP whose forward saves the output and the row log-sum-
exp, so its backward never runs the forward again; the backward adds dS_l K_i, dS_l^T Q_i into every
earlier layer's gradient over the stack's cotangent). Left to autodiff, a layer stack would save
each layer's input carry, the whole stack, once per layer: O(N^2 L). `qk_stack` is the stack-level
custom VJP training takes instead (as recomputed_scores.py, whose scans it shares): it saves each
layer's input x_l [B, L, D] and the final stack ONCE; going down, each layer is re-run from x_l on
the final stack (slots above l are never read) and its VJP adds its share into the stack's gradient.
With the kernels (and on the ring, ring_attention.ring_attention_replay) the layers going up also
write their attention output and row statistics into SavedAttention (O(N L)), and the re-run going
down takes them from there (`qk_attention_replay`): the attention forward kernel runs once per layer
and step, not twice. Peak: the stack, its gradient, SavedAttention and one layer's transients. The
gradient has the stack's dtype: in a bfloat16 model each layer's share is computed in float32 and
rounded once when added (N roundings for slot 0, as a bfloat16 residual stream's gradient takes one
a layer).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from realformer_jax.config import ConfigError
from realformer_jax.kernels import backends
from realformer_jax.kernels.plumbing import refusals
from realformer_jax.kernels.plumbing.attend import _axis_size, _mesh_axes, kernel_inputs, plan_spec
from realformer_jax.kernels.plumbing.select import AttentionPlan
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.kernels.score_paths import recomputed_scores

# Layer i's slot of the carried stack, [2, N, B, L, H, K].
STACK_AXES = (None, None, 'batch', 'length', 'heads', 'kv')


def push(stack: jax.Array, index: jax.Array, q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array):
  """The stack with layer `index`'s queries and keys in its slot (the stack's dtype; a [B, L, H, K']
  slot wider than q is zero-padded: zero features add nothing to a product)."""
  qk = jnp.stack([q_BxLxHxK, k_BxLxHxK]).astype(stack.dtype)
  pad = stack.shape[-1] - qk.shape[-1]
  if pad:
    qk = jnp.pad(qk, [(0, 0)] * 4 + [(0, pad)])
  start = (jnp.zeros((), jnp.int32), jnp.asarray(index, jnp.int32)) + (
    jnp.zeros((), jnp.int32),
  ) * 4
  return jax.lax.dynamic_update_slice(stack, qk[:, None], start)


class SavedAttention(NamedTuple):
  """Every layer's attention output and row statistics, written going up the stack (slot l by
  layer l) so that the layers qk_stack re-runs going down read them instead of running the
  attention forward again. O(N L): [N, B, L, H, K] in the compute dtype and 2 [N, B, H, L]
  float32 (at BERT-Base, L = 65,536, bfloat16: 1.2 GiB)."""

  out: jax.Array  # [N, B, L, H, K]: the kernels' output (Triton: the padded head size)
  # The row statistics in the backend's units (Triton's: base 2, tile_math.py), read only by the
  # same backend's backward.
  m: jax.Array  # [N, B, H, L] float32: the row maxima of the scores
  log_l: jax.Array  # [N, B, H, L] float32: the log of the rows' softmax denominators

  @classmethod
  def zeros(cls, stack: jax.Array) -> 'SavedAttention':
    _, layers, batch, seq_len, heads, head_dim = stack.shape
    stat = jnp.zeros((layers, batch, heads, seq_len), jnp.float32)
    return cls(jnp.zeros(stack.shape[1:], stack.dtype), stat, stat)

  def layer(self, index: jax.Array) -> 'SavedAttention':
    """Slot `index`'s out [B, L, H, K], m and log_l [B, H, L]."""
    return SavedAttention(*(jax.lax.dynamic_index_in_dim(x, index, 0, False) for x in self))

  def written(self, index: jax.Array, one: 'SavedAttention') -> 'SavedAttention':
    """With slot `index` holding one layer's (out, m, log_l)."""
    return SavedAttention(
      *(
        jax.lax.dynamic_update_index_in_dim(x, y.astype(x.dtype), index, 0)
        for x, y in zip(self, one)
      )
    )


class QKCarry(NamedTuple):
  stack: jax.Array  # [2, N, B, L, H, K], compute dtype: every layer's queries and keys
  index: jax.Array  # int32 scalar: the layer that reads this carry
  # Kernels under qk_stack only: written going up, read by the layers re-run going down.
  saved: Optional[SavedAttention] = None


def _kernels(spec: KernelSpec):
  # The plan's backend's qk kernels: the module its record names (the built-in ones:
  # kernels/backends/<name>/qk_attention.py), imported on first use.
  return backends.get(spec.backend).qk_kernels()


# The kernel calls, wrapped so that differentiating them (grad of grad) is the fused kernels'
# one-line refusal (refusals.HIGHER_ORDER) instead of an error from inside Pallas.


def _refuse_higher_order(*_):
  raise ConfigError(refusals.HIGHER_ORDER)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _forward(stack, v, bias, fparams, iparams, layer, spec):
  return _kernels(spec).forward(stack, v, bias, fparams, iparams, layer, spec)


_forward.defvjp(lambda *args: (_forward(*args), None), _refuse_higher_order)


@functools.partial(jax.custom_vjp, nondiff_argnums=(11,))
def _backward(stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec):
  return _kernels(spec).backward(
    stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec
  )


_backward.defvjp(lambda *args: (_backward(*args), None), _refuse_higher_order)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def qk_attention(stack, v, bias, fparams, iparams, layer, spec: KernelSpec):
  """(out [B, L, H, K], stack unchanged, lse = (m, log l) [B, H, L]): attention of layer
  `layer` (int32 [1]) whose queries and keys are already in its slot. The stack is passed
  through so that its cotangent (the layers above's gradients) reaches this op's backward,
  which adds to it in place. lse is returned for SavedAttention (no gradient flows into it)."""
  out, lse, _ = _forward(stack, v, bias, fparams, iparams, layer, spec)
  return out, stack, lse


def _qk_fwd(stack, v, bias, fparams, iparams, layer, spec):
  out, lse, bits = _forward(stack, v, bias, fparams, iparams, layer, spec)
  return (out, stack, lse), (stack, v, bias, fparams, iparams, layer, out, lse, bits)


def _qk_bwd(spec, residuals, cotangents):
  g_out, g_stack = cotangents[:2]  # lse's cotangent is ignored (see qk_attention)
  return _gradients(spec, residuals, g_out, g_stack)


def _gradients(spec, residuals, g_out, g_stack):
  stack, v, bias, fparams, iparams, layer, out, lse, bits = residuals
  g_out = g_out.astype(v.dtype)
  delta = jnp.einsum('blhk,blhk->bhl', out.astype(jnp.float32), g_out.astype(jnp.float32))
  dv, g_stack = _backward(
    stack, v, g_out, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec
  )
  return g_stack, dv, jnp.zeros_like(bias), jnp.zeros_like(fparams), None, None


qk_attention.defvjp(_qk_fwd, _qk_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def qk_attention_replay(stack, v, bias, fparams, iparams, layer, out, lse, spec: KernelSpec):
  """qk_attention for a layer re-run going down (qk_stack): `out` and `lse` are what
  qk_attention returned for these inputs going up (SavedAttention), so no kernel runs
  forward; the backward is qk_attention's from them. out and lse get no cotangent: they are
  constants of the re-run."""
  del v, bias, fparams, iparams, layer, lse
  return out, stack


def _replay_fwd(stack, v, bias, fparams, iparams, layer, out, lse, spec):
  del spec
  return (out, stack), (stack, v, bias, fparams, iparams, layer, out, lse, None)


def _replay_bwd(spec, residuals, cotangents):
  g_out, g_stack = cotangents
  return (*_gradients(spec, residuals, g_out, g_stack), None, None)


qk_attention_replay.defvjp(_replay_fwd, _replay_bwd)


def kernel_attention(plan: AttentionPlan, stack: jax.Array, *args) -> tuple[jax.Array, jax.Array]:
  """kernel_attention_saving's (context, stack), for a caller that keeps no SavedAttention."""
  return kernel_attention_saving(plan, stack, *args)[:2]


def kernel_attention_saving(
  plan: AttentionPlan,
  stack: jax.Array,
  v_BxLxHxK: jax.Array,
  index: jax.Array,
  bias_Bx1x1xL: jax.Array,
  scale: jax.Array,
  divisor: Optional[jax.Array],
  dropout_key: Optional[jax.Array],
  keep_prob: float,
  saved: Optional[SavedAttention] = None,
) -> tuple[jax.Array, jax.Array, SavedAttention]:
  """(context [B, L, H, K], stack, this layer's SavedAttention slot (out, m, log_l) to keep)
  through the plan's kernels, per shard under a mesh (as attend.fused_self_attention: batch
  and heads split, global offsets for the dropout mask). The stack's head dimension may be
  padded (Triton's power-of-two tiles); v is padded to it and the context sliced back. With
  `saved` (this layer's slot, written when it ran going up) no forward kernel runs:
  qk_attention_replay computes the same gradients from it."""
  _, _, heads, head_dim = v_BxLxHxK.shape
  bias_BxL, _, fparams, words = kernel_inputs(bias_Bx1x1xL, scale, divisor, dropout_key)
  spec = plan_spec(plan, heads, dropout_key, keep_prob)
  # The backend's tiles for this stack: per device (Triton), shrinking with depth (Mosaic).
  fit_blocks = getattr(_kernels(spec), 'fit_blocks', None)
  if fit_blocks is not None:
    spec = fit_blocks(spec, stack.shape[1], stack.shape[3], stack.shape[-1])
  padded = stack.shape[-1]
  v = v_BxLxHxK
  if padded != head_dim:
    v = jnp.pad(v, [(0, 0)] * 3 + [(0, padded - head_dim)])
  layer = jnp.reshape(jnp.asarray(index, jnp.int32), (1,))
  context, stack, lse = _sharded(spec, stack, v, bias_BxL, fparams, words, layer, saved)
  return context[..., :head_dim], stack, SavedAttention(context, *lse)


def _sharded(spec, stack, v, bias, fparams, words, layer, saved):
  mesh = jax.sharding.get_abstract_mesh()
  op = functools.partial(_op, spec=spec)
  if mesh.empty or mesh.size == 1:
    iparams = jnp.concatenate([words, jnp.zeros((2,), jnp.uint32)])
    return op(stack, v, bias, fparams, iparams, layer, saved)
  batch_axes, head_axes = _mesh_axes('batch'), _mesh_axes('heads')
  _, _, batch, _, heads, _ = stack.shape
  local_batch = batch // _axis_size(mesh, batch_axes)
  local_heads = heads // _axis_size(mesh, head_axes)

  def offset(axes, size):
    if axes is None:
      return jnp.zeros((), jnp.uint32)
    return jax.lax.axis_index(axes).astype(jnp.uint32) * np.uint32(size)

  def per_shard(stack, v, bias, fparams, words, layer, *saved):
    offsets = jnp.stack([offset(batch_axes, local_batch), offset(head_axes, local_heads)])
    iparams = jnp.concatenate([words, offsets])
    return op(stack, v, bias, fparams, iparams, layer, saved[0] if saved else None)

  rows = P(batch_axes, None, head_axes, None)
  stacked = P(None, None, batch_axes, None, head_axes, None)
  stats = P(batch_axes, head_axes, None)
  in_specs = (stacked, rows, P(batch_axes, None), P(batch_axes, None), P(), P())
  args = (stack, v, bias, fparams, words, layer)
  if saved is not None:  # this layer's slot, sharded as the op's outputs
    in_specs, args = in_specs + (SavedAttention(rows, stats, stats),), args + (saved,)
  return jax.shard_map(
    per_shard,
    mesh=mesh,
    in_specs=in_specs,
    out_specs=(rows, stacked, (stats, stats)),
    check_vma=False,
  )(*args)


def _op(stack, v, bias, fparams, iparams, layer, saved, spec):
  if saved is None:
    out, stack, lse = qk_attention(stack, v, bias, fparams, iparams, layer, spec)
    # SavedAttention's [B, H, L] (Mosaic's come as [B, H, L, 1]; its backward takes either)
    return out, stack, tuple(x.reshape(x.shape[:3]) for x in lse)
  out, stack = qk_attention_replay(
    stack, v, bias, fparams, iparams, layer, saved.out, (saved.m, saved.log_l), spec
  )
  return out, stack, (saved.m, saved.log_l)


# up_fn(params_l, x, (stack, saved), index, key, aux) -> (y, (stack', saved')): one layer going
# up; down_fn(params_l, x, stack, saved, index, key, aux) -> (y, stack'): the same layer re-run
# going down, reading its slot of `saved` (None on the einsum path, which saves nothing).
LayerFn = Any


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def qk_stack(
  up_fn: LayerFn,
  down_fn: LayerFn,
  params_N: Any,
  x_BxLxD: jax.Array,
  stack0: jax.Array,
  saved0: Optional[SavedAttention],
  keys_N: Optional[jax.Array],
  aux: Any,
) -> jax.Array:
  """The output of N layers carrying the stacked queries and keys (module docstring)."""
  carry0 = (stack0, saved0)
  return recomputed_scores.scan_up(up_fn, params_N, x_BxLxD, carry0, keys_N, aux)[0]


def _stack_fwd(up_fn, down_fn, params_N, x, stack0, saved0, keys_N, aux):
  del down_fn
  y, (xs_N, (stack, saved)) = recomputed_scores.scan_up(
    up_fn, params_N, x, (stack0, saved0), keys_N, aux
  )
  return y, ((params_N, xs_N, stack, keys_N, aux), saved)


def _stack_bwd(up_fn, down_fn, residuals, g_y):
  del up_fn
  residuals, saved = residuals

  def layer_down(params_l, x_l, stack, index, key, aux, g_x, g_stack):
    # Re-run on the FINAL stack: layer l reads slots 0..l, which hold what they held when it
    # ran going up, and writes slot l with the same values. The stack it returns is handed
    # down (equal to the one it got), so the one it got dies and slot l is written in place.
    # `saved` is a constant of the re-run: its attention output comes from slot l, no
    # forward kernel runs.
    (_, stack_out), vjp = jax.vjp(
      lambda p, x, s, c: down_fn(p, x, s, saved, index, key, c), params_l, x_l, stack, aux
    )
    g_params, g_x_prev, g_stack_prev, g_aux = vjp((g_x, g_stack))
    return g_params, g_x_prev, g_stack_prev, stack_out, g_aux

  g_params_N, g_x0, g_stack0, g_keys, g_aux = recomputed_scores.scan_down(
    layer_down, residuals, g_y
  )
  return g_params_N, g_x0, g_stack0, None, g_keys, g_aux  # saved0: zeros, no gradient


qk_stack.defvjp(_stack_fwd, _stack_bwd)

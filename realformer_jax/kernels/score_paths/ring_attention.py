"""Ring attention: self-attention over a sequence split across devices (the `sequence` mesh axis).

Each of the n devices of the ring holds L/n consecutive positions: its queries (and, for
residual attention, its query rows of whatever the layers carry) stay home; the keys, values
and the keys' padding bias travel round the ring (`lax.ppermute` to the next device, n - 1
hops), so that after n steps every query block has met every key block. Per step each device
attends its queries to the block it holds, in sub-blocks of at most SUB_BLOCK_BYTES of float32
scores, and merges the partial results by their running log-sum-exp (online softmax: max m,
denominator l, unnormalised output o), so no device ever holds a [L/n, L] probability matrix.
The send of the next block is issued before the step's compute, which does not depend on it:
the collective overlaps the matmuls.

What the queries meet is one function of (the local side, a key sub-block), `logits` of
RingSpec, so the three ways of carrying residual attention share this op:

  post / pre          local = q [B, Lq, H, K], moving = k: logits = q k^T
  carried scores      the same, plus `block_in`, the device's rows [B, H, Lq, L] of the
                      carried float32 sum (acc_{l-1}); the op returns its rows of acc_l.
                      Nothing of the sum crosses devices.
  residual_carry=qk   local = the query stack [N, B, Lq, H, K] (layers above l zeroed), moving
                      = the key stack [N, B, Lk, H, K]: logits = sum_i q_i k_i^T, the sum
                      rebuilt per block (qk_reference.py's identity); the key stack travels.

and then, per block, acc = scale * logits (+ block_in), z = acc / divisor + bias: the einsum
path's formula (model/attention.py), its dropout mask keyed by the GLOBAL row and column, so a
sharded run drops exactly what one device drops (dropout_bits.keep_mask's stream).

The backward (a custom VJP) saves the inputs, the output and the rows' log-sum-exp (kept by every
remat policy), and runs the ring again, backward only: the key / value / bias blocks travel with
their gradient accumulators, each device adds its queries' share (dV = P^T dO, dS = P (dP - D), and
the VJP of `logits` for the local side and the key block), and after n hops each accumulator is
home. The bias and score scale get their true gradients (the bias's travels with its block; the
scale's is summed by shard_map's transpose); the running-mean divisor none (a layer count, as on the
einsum path). Where the forward's per-block op is a fused qk block kernel (RingSpec.block_kernel)
the backward's is too: its `block_backward` takes the whole block (the dS kernel from the rows'
global statistics and D, then the matmuls over the slots <= l) in place of the sub-blocks.

The qk carry's layers that qk_carry.qk_stack re-runs going down take the output and row
statistics that the layers going up returned (qk_carry.SavedAttention) through
`ring_attention_replay`, whose forward runs no ring: one forward ring per layer and step.

`sequence_shards()` says whether the traced program runs on a mesh whose `sequence` axis (the
mesh axes the logical rules give 'length') has more than one device; `sequence_attention` is
the shard_map around the op that score_path.RingPath / RingQKPath attend with.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels import backends
from realformer_jax.kernels.dropout.dropout_bits import (
  DRAWS_PER_GENERATOR,
  attention_row,
  draw,
  hash_words,
  keep_threshold,
  realised_keep_prob,
  select_draw,
)
from realformer_jax.kernels.plumbing.fused import SAVED_FOR_BACKWARD
from realformer_jax.kernels.plumbing.select import SUM_BYTES_PER_ELEMENT
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.kernels.plumbing.tile_math import LOG2E

# Largest float32 [B, H, Lq, bk] score sub-block a device forms at once: the key block is
# attended in sub-blocks of bk columns, the largest divisor of its length that fits (BERT-Base,
# L = 1,048,576 on 8 devices: Lq = 131,072, 12 heads, bk = 256).
SUB_BLOCK_BYTES = 2**31

# The name scope of the ring's ops (HLO metadata op_name): aot/ring_overlap.py finds the
# ring's block compute by it, to set the ring's communication against it.
SCOPE = 'ring_attention'

# The attention implementations a sequence axis can run with the einsum formula as the ring's
# per-block op; a backend whose qk kernels have a `block_forward` (and `block_backward`) also
# serves residual_carry='qk' (block_backend).
RING_IMPLS = ('auto', 'xla')


class SequenceShards(NamedTuple):
  """The mesh axes the length is split over, and how many devices that makes."""

  axes: tuple[str, ...]
  size: int


def _as_tuple(axes) -> tuple[str, ...]:
  return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def mesh_axes(logical: str) -> tuple[str, ...]:
  """Mesh axes the active logical rules give `logical` (none outside rules)."""
  return _as_tuple(nn.logical_to_mesh_axes((logical,))[0])


def axes_size(mesh, axes: tuple[str, ...]) -> int:
  return int(np.prod([mesh.shape[a] for a in axes], dtype=int))


def sequence_shards() -> Optional[SequenceShards]:
  """The sequence split of the program being traced (the active mesh and logical rules), or
  None when the length is on one device (no mesh, or its axes of 'length' have size 1)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return None
  axes = mesh_axes('length')
  size = axes_size(mesh, axes)
  return SequenceShards(axes, size) if size > 1 else None


def block_backend(config: ModelConfig) -> Optional[str]:
  """The fused backend whose qk block kernel attends each block of the ring's forward (the
  backend attention_impl names, residual_carry='qk'), or None: the einsum formula."""
  backend = backends.for_impl(config.attention_impl)
  qk = config.use_residual_attention and config.residual_carry == 'qk'
  if backend is None or not backend.fused or not qk:
    return None
  return backend.name if hasattr(backend.qk_kernels(), 'block_forward') else None


def block_op(config: ModelConfig) -> str:
  """The ring's per-block op in words, for the run's log."""
  backend = block_backend(config)
  if backend is None:
    return 'the einsum formula (forward and backward)'
  return f'the {backend} qk block kernels (forward and backward)'


class RingLayout(NamedTuple):
  """The sizes of a run's ring that config validation knows (train/config.py)."""

  shards: int  # devices in the ring
  length: int  # global sequence length
  length_field: str  # the config field that sets it (named in a refusal)
  batch: int  # sequences of the smallest microbatch, all devices: the dropout hash's rows
  batch_field: str  # the config field that sets it
  local_heads: int  # heads on one device
  mesh_shape: Any = None


# The ring's dropout hash counts rows (b H + h) L + q in uint32 (dropout_bits.attention_row):
# B H L at or above this wraps, and distinct rows would draw the same mask.
HASH_ROWS = 2**32


def sub_block_columns(batch: int, heads: int, rows: int, cols: int, sub_block_bytes: int) -> int:
  """Columns of one score sub-block: the largest divisor of `cols` whose float32
  [batch, heads, rows, bk] fits sub_block_bytes (at least 1)."""
  limit = max(sub_block_bytes // (4 * batch * heads * rows), 1)
  return max(d for d in range(1, min(cols, limit) + 1) if cols % d == 0)


def check_config(config: ModelConfig, layout: RingLayout, budget: tuple[int, str]) -> None:
  """Refuses, in one line, what a ring of `layout.shards` devices cannot run: a named fused
  kernel (the per-block op is the einsum formula); a device's block of positions whose only
  divisor under the sub-block limit is 1 (1-column sub-blocks: a loop of L/n matmuls of one
  column per block); more dropout hash rows than 32 bits count; the scores carry where one
  device's row block of the sum outgrows `budget` (one device's memory: bytes, where the
  figure came from). Called once, where the config is validated (train/config.py:
  check_sequence_layout), never again while a model is traced: there a split sequence simply
  takes the ring."""
  shards = layout.shards
  if shards <= 1:
    return
  where = '' if layout.mesh_shape is None else f' (mesh.shape={layout.mesh_shape})'
  if config.attention_impl not in RING_IMPLS and block_backend(config) is None:
    raise ConfigError(
      f'model.attention_impl={config.attention_impl!r}: a sequence axis of {shards} devices'
      f'{where} runs ring attention, whose per-block op is the einsum path; use '
      "'auto' or 'xla', or mesh.shape with sequence 1 (with residual_carry='qk' also "
      "'pallas_triton': its qk block kernel)"
    )
  chunk = layout.length // shards
  if chunk > 1:
    cols = sub_block_columns(1, layout.local_heads, chunk, chunk, SUB_BLOCK_BYTES)
    if cols == 1:
      widest = max(SUB_BLOCK_BYTES // (4 * layout.local_heads * chunk), 1)
      raise ConfigError(
        f'{layout.length_field}={layout.length}: each of the {shards} devices of the ring'
        f'{where} holds {chunk} positions, which no sub-block width from 2 to {widest} '
        'divides: ring attention would attend 1-column sub-blocks; use a length whose share '
        'per device has a small divisor (e.g. a multiple of 128 per device)'
      )
  per_hash = DRAWS_PER_GENERATOR[config.dropout_generator]
  if block_backend(config) and config.attention_dropout_rate > 0 and chunk % per_hash:
    raise ConfigError(
      f'{layout.length_field}={layout.length}: each of the {shards} devices of the ring'
      f'{where} holds {chunk} positions, not whole {config.dropout_generator} hash words '
      f'({per_hash} columns) for the {block_backend(config)} qk block kernel; use a multiple '
      f'of {per_hash * shards}'
    )
  rows = layout.batch * config.num_heads * layout.length
  if config.attention_dropout_rate > 0 and rows >= HASH_ROWS:
    raise ConfigError(
      f'{layout.batch_field}: a microbatch of {layout.batch} sequences x {config.num_heads} '
      f'heads x {layout.length} positions = {rows} attention rows, at or above 2**32: the '
      "ring's dropout hash counts rows in 32 bits and would repeat masks; use microbatches "
      f'of at most {(HASH_ROWS - 1) // (config.num_heads * layout.length)} sequences'
    )
  if config.use_residual_attention and config.residual_carry == 'scores':
    needed = SUM_BYTES_PER_ELEMENT * layout.local_heads * chunk * layout.length
    budget, source = budget
    if needed > budget:
      raise ConfigError(
        f"model.residual_carry='scores': each device of the ring{where} holds its row block "
        f'of the carried sum, [{layout.local_heads}, {chunk}, {layout.length}] float32 = '
        f'{needed / 1e12:.3g} TB ({needed} bytes) per layer for one sequence, over its '
        f'budget of {budget} bytes ({source}); '
        "use residual_carry='qk' or 'auto'"
      )


# ---- The op, per device (inside shard_map). ----


@dataclasses.dataclass(frozen=True)
class RingSpec:
  """What the ring op needs to know statically."""

  axes: tuple[str, ...]  # the mesh axes of the ring
  size: int  # devices in the ring
  logits: Callable[[Any, Any], jax.Array]  # (local, key sub-block) -> float32 [B, H, Lq, bk]
  heads: int  # global head count (the dropout mask's rows)
  length: int  # global sequence length
  threshold: int  # dropout: keep an element when its 8-bit draw is < threshold; 0: none
  generator: str  # the dropout hash (model.dropout_generator), as dropout_bits.keep_mask's
  dtype: Any  # the compute dtype (P V in it, as the einsum path)
  carry_out: bool  # return the block rows of acc = scale * logits (+ block_in)
  sub_block_bytes: int  # SUB_BLOCK_BYTES, read when traced
  # The per-block op: None, the einsum formula in sub-blocks; else a fused backend's qk block
  # kernels (`block_forward` and `block_backward` of its qk kernels) with this spec
  # (residual_carry='qk' only: local / moving are the query and key stacks, iparams[4] the
  # layer), forward and backward.
  block_kernel: Optional[KernelSpec] = None

  @property
  def block_op(self) -> str:
    """The per-block op, as a run's log names it."""
    if self.block_kernel is None:
      return 'einsum'
    return f'{self.block_kernel.backend} qk block kernel'

  @property
  def keep(self) -> float:
    return realised_keep_prob(self.threshold / 2**8)

  def sub_block(self, batch: int, heads: int, rows: int, cols: int) -> int:
    return sub_block_columns(batch, heads, rows, cols, self.sub_block_bytes)


def pair_logits(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array) -> jax.Array:
  """q k^T, float32 [B, H, Lq, Lk] (post / pre / the carried sum)."""
  return jnp.einsum('bqhk,bvhk->bhqv', q_BxLxHxK, k_BxLxHxK, preferred_element_type=jnp.float32)


def stack_logits(q_NxBxLxHxK: jax.Array, k_NxBxLxHxK: jax.Array) -> jax.Array:
  """sum_i q_i k_i^T over the stacked layers, float32 [B, H, Lq, Lk] (residual_carry='qk')."""
  return jnp.einsum(
    'nbqhk,nbvhk->bhqv', q_NxBxLxHxK, k_NxBxLxHxK, preferred_element_type=jnp.float32
  )


def _keep_block(iparams, threshold, shape, row0, col0, heads, length, generator) -> jax.Array:
  """keep_mask(key, keep, [B_all, H_all, L, L], generator) of the block whose first element
  is (b0, h0, row0, col0): b0, h0 in iparams[2:], the key words in iparams[:2]."""
  batch, local_heads, rows, cols = shape
  k1, k2, b0, h0 = (iparams[i] for i in range(4))
  iota = lambda axis, n: lax.broadcasted_iota(jnp.uint32, (batch, local_heads, rows, n), axis)
  row = lambda n: attention_row(b0 + iota(0, n), h0 + iota(1, n), row0 + iota(2, n), heads, length)
  t = np.uint32(threshold)
  per_hash = DRAWS_PER_GENERATOR[generator]  # a power of two: 8 (threefry) or 16 (philox)
  if cols % per_hash == 0:  # col0 too (a multiple of the block's columns): whole words
    words = cols // per_hash
    word = col0 // np.uint32(per_hash) + iota(3, words)
    ys = hash_words(generator, k1, k2, row(words), word)
    draws = jnp.stack([draw(y, lane) < t for y in ys for lane in range(4)], axis=-1)
    return draws.reshape(shape)
  col = col0 + iota(3, cols)  # any alignment: one hash per element, its own byte
  ys = hash_words(generator, k1, k2, row(cols), col // np.uint32(per_hash))
  return select_draw(ys, col & np.uint32(per_hash - 1)) < t


def _drop(x, spec: RingSpec, iparams, row0, col0):
  if not spec.threshold:
    return x
  mask = _keep_block(
    iparams, spec.threshold, x.shape, row0, col0, spec.heads, spec.length, spec.generator
  )
  return jnp.where(mask, x / jnp.asarray(spec.keep, x.dtype), jnp.zeros_like(x))


def _cols(x, start, size, axis):
  return lax.dynamic_slice_in_dim(x, start, size, axis)


def _chunk_cols(chunk, start, size):
  """Columns [start, start + size) of a travelling block: (keys [.., L, H, K], v, bias)."""
  moving, v, bias = chunk
  return (
    jax.tree.map(lambda x: _cols(x, start, size, x.ndim - 3), moving),
    _cols(v, start, size, 1),
    _cols(bias, start, size, 3),
  )


def merge_block(state, out_b, stats_b):
  """The ring's running (m, l, o) [B, H, Lq], [B, H, Lq], float32 [B, Lq, H, K] (o unnormalised)
  with one block attended by a fused kernel: its normalised output [B, Lq, H, K] and its rows'
  statistics (m, log l) in the kernel's base 2 (tile_math.py). A block's l scales its output
  back to the block's unnormalised sum (dropout is inside the output: it does not touch l)."""
  m, l, o = state
  m_b = stats_b[0] / LOG2E
  l_b = jnp.exp2(stats_b[1])
  m_new = jnp.maximum(m, m_b)
  alpha, beta = jnp.exp(m - m_new), jnp.exp(m_b - m_new)
  rows = lambda x: jnp.swapaxes(x, 1, 2)[..., None]  # [B, H, Lq] -> [B, Lq, H, 1]
  o = o * rows(alpha) + out_b.astype(jnp.float32) * rows(beta * l_b)
  return m_new, alpha * l + beta * l_b, o


def _ring_pass(spec: RingSpec, chunk):
  perm = [(s, (s + 1) % spec.size) for s in range(spec.size)]
  return lax.ppermute(chunk, spec.axes, perm)


def _block_origin(spec: RingSpec, step, chunk_len):
  """(this device's first query row, the first key column of the block held at `step`)."""
  me = lax.axis_index(spec.axes)
  owner = (me - step) % spec.size  # the block has travelled `step` hops from its owner
  return (me * chunk_len).astype(jnp.uint32), (owner * chunk_len).astype(jnp.int32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def ring_attention(spec: RingSpec, local, moving, v, bias, scale, divisor, block_in, iparams):
  """(context [B, Lq, H, K] in spec.dtype, this device's rows [B, H, Lq, L] of acc or None, the
  rows' statistics (m, log l), float32 [B, H, Lq] each: lse = m + log l).

  local / moving: the queries' and the keys' side (module docstring); v [B, Lk, H, K]; bias [B, 1,
  1, Lk] the travelling block's padding bias; scale [B, 1, 1, 1]; divisor a scalar or None;
  block_in [B, H, Lq, L] or None; iparams uint32 [5] (dropout key words, the shard's first batch
  row and head, the qk layer read by a fused block op). The statistics are returned for
  qk_carry.SavedAttention, which hands them to ring_attention_replay; no gradient flows into
  them."""
  return _forward(spec, local, moving, v, bias, scale, divisor, block_in, iparams)


def _block_kernels(spec: RingSpec, scale, divisor, iparams):
  """(the fused backend's qk kernels, fparams [B, 2] = (scale, 1 / divisor), the layer int32
  [1], origin(step, chunk_len): the block's global first row and column, int32 [2])."""
  inv_div = jnp.ones_like(scale[:, 0, 0, 0]) if divisor is None else 1 / divisor
  fparams = jnp.stack([scale[:, 0, 0, 0], jnp.broadcast_to(inv_div, scale.shape[:1])], axis=1)

  def origin(step, chunk_len):
    row0, col0 = _block_origin(spec, step, chunk_len)
    return jnp.stack([row0.astype(jnp.int32), col0])

  kernels = backends.get(spec.block_kernel.backend).qk_kernels()
  return kernels, fparams, iparams[4:5].astype(jnp.int32), origin


def _fused_block(spec: RingSpec, local, scale, divisor, iparams):
  """attend_block through the fused block kernel: the whole block in one call, merged into
  the running statistics (merge_block)."""
  kernels, fparams, layer, block_origin = _block_kernels(spec, scale, divisor, iparams)

  def attend_block(step, chunk, state):
    moving, v, bias = chunk
    origin = block_origin(step, v.shape[1])
    out_b, stats_b = kernels.block_forward(
      local, moving, v, bias[:, 0, 0, :], fparams, iparams[:4], layer, origin, spec.length,
      spec.block_kernel,
    )  # fmt: skip
    m, l, o, acc_rows = state
    return (*merge_block((m, l, o), out_b, stats_b), acc_rows)

  return attend_block


def _forward(spec, local, moving, v, bias, scale, divisor, block_in, iparams):
  batch, chunk_len, local_heads, head_dim = v.shape
  bk = spec.sub_block(batch, local_heads, chunk_len, chunk_len)
  shape = (batch, local_heads, chunk_len)
  m = jnp.full(shape, -jnp.inf, jnp.float32)
  state = (
    m,
    jnp.zeros(shape, jnp.float32),
    jnp.zeros(v.shape, jnp.float32),
    jnp.zeros(shape + (spec.length,), jnp.float32) if spec.carry_out else None,
  )

  def attend_block(step, chunk, state):
    row0, col0 = _block_origin(spec, step, chunk_len)

    def sub(s, state):
      m, l, o, acc_rows = state
      k_s, v_s, bias_s = _chunk_cols(chunk, s * bk, bk)
      col = col0 + s * bk
      acc = scale * spec.logits(local, k_s)
      if block_in is not None:
        acc = acc + _cols(block_in, col, bk, 3)
      if acc_rows is not None:
        acc_rows = lax.dynamic_update_slice_in_dim(acc_rows, acc, col, 3)
      z = (acc if divisor is None else acc / divisor) + bias_s
      m_new = jnp.maximum(m, jnp.max(z, axis=-1))
      alpha = jnp.exp(m - m_new)
      p = jnp.exp(z - m_new[..., None])
      p_c = _drop(p.astype(spec.dtype), spec, iparams, row0, col.astype(jnp.uint32))
      pv = jnp.einsum(
        'bhqv,bvhk->bqhk', p_c, v_s.astype(spec.dtype), preferred_element_type=jnp.float32
      )
      o = o * jnp.swapaxes(alpha, 1, 2)[..., None] + pv
      return m_new, alpha * l + jnp.sum(p, axis=-1), o, acc_rows

    return lax.fori_loop(0, chunk_len // bk, sub, state)

  if spec.block_kernel is not None:
    assert block_in is None and not spec.carry_out, 'the fused block op carries no sum'
    attend_block = _fused_block(spec, local, scale, divisor, iparams)

  def step(t, carry):
    chunk, state = carry
    following = _ring_pass(spec, chunk)  # independent of this step's compute: overlaps it
    return following, attend_block(t, chunk, state)

  chunk = (moving, v, bias)
  chunk, state = lax.fori_loop(0, spec.size - 1, step, (chunk, state))
  m, l, o, acc_rows = attend_block(spec.size - 1, chunk, state)
  out = (o / jnp.swapaxes(l, 1, 2)[..., None]).astype(spec.dtype)
  return out, acc_rows, (m, jnp.log(l))


def _lse(stats):
  m, log_l = stats
  return m + log_l


def _ring_fwd(spec, local, moving, v, bias, scale, divisor, block_in, iparams):
  out, block_out, stats = _forward(spec, local, moving, v, bias, scale, divisor, block_in, iparams)
  # Kept by every remat policy (model/encoder.py), as the fused kernels' output and statistics.
  # The pair (m, log l), not their sum: the fused backward converts it to its base 2 exactly
  # where m is an all-padding row's ~-1e9 (tile_math.py).
  out, saved_stats = checkpoint_name((out, stats), SAVED_FOR_BACKWARD)
  residuals = (local, moving, v, bias, scale, divisor, block_in, iparams, out, saved_stats)
  return (out, block_out, stats), residuals


def _zeros_f32(tree):
  return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)


def _add_cols(total, part, start, axis):
  return lax.dynamic_update_slice_in_dim(
    total, _cols(total, start, part.shape[axis], axis) + part, start, axis
  )


def _fused_block_grads(spec: RingSpec, local, scale, divisor, iparams, g_out_c, stats, delta):
  """block_grads through the fused block kernels' backward: the whole block in one call (its
  dS kernel and matmuls), from the rows' global statistics and delta."""
  kernels, fparams, layer, block_origin = _block_kernels(spec, scale, divisor, iparams)

  def block_grads(step, chunk, grads, home):
    moving, v, bias = chunk
    (g_moving, g_v, g_bias), (g_local, g_scale, g_block_in) = grads, home
    g_local, g_moving, g_v, g_bias_BxL, g_scale_B = kernels.block_backward(
      local, moving, v, g_out_c, stats, delta, bias[:, 0, 0, :], fparams, iparams[:4], layer,
      block_origin(step, v.shape[1]), spec.length,
      (g_local, g_moving, g_v, g_bias[:, 0, 0, :], g_scale[:, 0, 0, 0]), spec.block_kernel,
    )  # fmt: skip
    grads = (g_moving, g_v, g_bias_BxL[:, None, None, :])
    return grads, (g_local, g_scale_B[:, None, None, None], g_block_in)

  return block_grads


def _ring_bwd(spec, residuals, cotangents):
  local, moving, v, bias, scale, divisor, block_in, iparams, out, stats = residuals
  g_out, g_rows = cotangents[:2]  # the statistics' cotangent is ignored (ring_attention)
  batch, chunk_len, local_heads, _ = v.shape
  bk = spec.sub_block(batch, local_heads, chunk_len, chunk_len)
  g_out_c = g_out.astype(spec.dtype)
  delta = jnp.einsum('bqhk,bqhk->bhq', g_out.astype(jnp.float32), out.astype(jnp.float32))
  lse = _lse(stats)
  if spec.carry_out and g_rows is None:
    g_rows = jnp.zeros(lse.shape + (spec.length,), jnp.float32)
  home = (
    _zeros_f32(local),
    jnp.zeros_like(scale),
    None if block_in is None else jnp.zeros(block_in.shape, jnp.float32),
  )

  def block_grads(step, chunk, grads, home):
    row0, col0 = _block_origin(spec, step, chunk_len)

    def sub(s, carry):
      grads, (g_local, g_scale, g_block_in) = carry
      start = s * bk
      k_s, v_s, bias_s = _chunk_cols(chunk, start, bk)
      col = col0 + start
      block_in_s = None if block_in is None else _cols(block_in, col, bk, 3)

      def scores(local, k_s, scale, block_in_s):
        acc = scale * spec.logits(local, k_s)
        return acc if block_in_s is None else acc + block_in_s

      acc, scores_vjp = jax.vjp(scores, local, k_s, scale, block_in_s)
      z = (acc if divisor is None else acc / divisor) + bias_s
      p = jnp.exp(z - lse[..., None])
      col_u = col.astype(jnp.uint32)
      p_c = _drop(p.astype(spec.dtype), spec, iparams, row0, col_u)
      g_v = jnp.einsum('bhqv,bqhk->bvhk', p_c, g_out_c, preferred_element_type=jnp.float32)
      g_p = jnp.einsum(
        'bqhk,bvhk->bhqv', g_out_c, v_s.astype(spec.dtype), preferred_element_type=jnp.float32
      )
      g_z = p * (_drop(g_p, spec, iparams, row0, col_u) - delta[..., None])
      g_bias = jnp.sum(g_z, axis=(1, 2), keepdims=True)
      g_acc = g_z if divisor is None else g_z / divisor
      if g_rows is not None:
        g_acc = g_acc + _cols(g_rows, col, bk, 3)
      d_local, d_k, d_scale, d_block_in = scores_vjp(g_acc)
      g_moving, g_v_all, g_bias_all = grads
      grads = (
        jax.tree.map(lambda t, d: _add_cols(t, d, start, t.ndim - 3), g_moving, d_k),
        _add_cols(g_v_all, g_v, start, 1),
        _add_cols(g_bias_all, g_bias, start, 3),
      )
      g_local = jax.tree.map(jnp.add, g_local, d_local)
      if g_block_in is not None:
        g_block_in = lax.dynamic_update_slice_in_dim(g_block_in, d_block_in, col, 3)
      return grads, (g_local, g_scale + d_scale, g_block_in)

    return lax.fori_loop(0, chunk_len // bk, sub, (grads, home))

  if spec.block_kernel is not None:
    assert block_in is None and g_rows is None, 'the fused block op carries no sum'
    block_grads = _fused_block_grads(spec, local, scale, divisor, iparams, g_out_c, stats, delta)

  def step(t, carry):
    chunk, grads, home = carry
    following = _ring_pass(spec, chunk)
    grads, home = block_grads(t, chunk, grads, home)
    return following, _ring_pass(spec, grads), home  # each gradient travels with its block

  chunk = (moving, v, bias)
  grads = _zeros_f32(chunk)
  chunk, grads, home = lax.fori_loop(0, spec.size - 1, step, (chunk, grads, home))
  grads, (g_local, g_scale, g_block_in) = block_grads(spec.size - 1, chunk, grads, home)
  g_moving, g_v, g_bias = _ring_pass(spec, grads)  # the last hop brings them home
  cast = lambda g, x: g.astype(x.dtype)
  return (
    jax.tree.map(cast, g_local, local),
    jax.tree.map(cast, g_moving, moving),
    cast(g_v, v),
    cast(g_bias, bias),
    cast(g_scale, scale),
    None if divisor is None else jnp.zeros_like(divisor),  # a layer count: constant
    None if block_in is None else cast(g_block_in, block_in),
    None,
  )


ring_attention.defvjp(_ring_fwd, _ring_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def ring_attention_replay(spec, local, moving, v, bias, scale, divisor, block_in, iparams, saved):
  """ring_attention for a layer that qk_carry.qk_stack re-runs going down: `saved` = (out,
  (m, log l)) is what ring_attention returned for these inputs going up, so no forward ring
  runs (no block travels); the backward is ring_attention's from them. No carried sum (the
  qk carry's layers return none); `saved` gets no cotangent: a constant of the re-run."""
  del local, moving, v, bias, scale, divisor, block_in, iparams
  assert not spec.carry_out
  out, stats = saved
  return out, None, stats


def _replay_fwd(spec, local, moving, v, bias, scale, divisor, block_in, iparams, saved):
  out, stats = saved
  residuals = (local, moving, v, bias, scale, divisor, block_in, iparams, out, stats)
  return (out, None, stats), residuals


def _replay_bwd(spec, residuals, cotangents):
  return (*_ring_bwd(spec, residuals, cotangents), None)


ring_attention_replay.defvjp(_replay_fwd, _replay_bwd)


# ---- Around the op: the shard_map over the whole mesh. ----


def sequence_attention(*args, **kwargs) -> tuple[jax.Array, Optional[jax.Array]]:
  """sequence_attention_saving's (context, acc), for a caller that keeps no statistics."""
  return sequence_attention_saving(*args, **kwargs)[:2]


def _fitted_block_kernel(spec: KernelSpec, layers: int, chunk: int, head_dim: int) -> KernelSpec:
  """`spec` with the tiles its backend gives the one-device qk kernels (`fit_blocks`: on a GPU
  its row of tiles.py) for a block of `chunk` x `chunk`: every block of the ring is one device's
  queries against one device's keys. The tiles stay whole dropout hash words: check_config
  refuses a share per device that is not, and the table's tiles are multiples of any word."""
  fit_blocks = getattr(backends.get(spec.backend).qk_kernels(), 'fit_blocks', None)
  return spec if fit_blocks is None else fit_blocks(spec, layers, chunk, head_dim)


def sequence_attention_saving(
  shards: SequenceShards,
  logits: Callable[[Any, Any], jax.Array],
  local,
  moving,
  v_BxLxHxK: jax.Array,
  block_in: Optional[jax.Array],
  bias_Bx1x1xL: jax.Array,
  scale: jax.Array,
  divisor: Optional[jax.Array],
  dropout_key: Optional[jax.Array],
  keep_prob: float,
  dtype,
  carry_out: bool,
  generator: str = 'threefry',
  saved: Optional[tuple[jax.Array, tuple[jax.Array, jax.Array]]] = None,
  block_kernel: Optional[KernelSpec] = None,
  layer: Optional[jax.Array] = None,
) -> tuple[jax.Array, Optional[jax.Array], tuple[jax.Array, jax.Array]]:
  """(context [B, L, H, K], acc [B, H, L, L] float32 or None, the rows' statistics (m, log l)
  [B, H, L] float32) of ring attention over the `shards` of the active mesh, the global arrays
  in and out (the einsum path's signature, with the local and moving sides made by the caller:
  `local` / `moving` leaves have the layout [..., B, L, H, K]). Batch and heads are split as the
  logical rules split 'batch' and 'heads'. With `saved` (this layer's (context, statistics) as
  it returned them going up) no forward ring runs: ring_attention_replay. With `block_kernel`
  (residual_carry='qk': local / moving the query and key stacks [N, B, L, H, K], `layer` the
  int32 scalar whose slots <= it are summed) each block's forward is that fused kernel
  (RingSpec.block_kernel), its dropout and heads taken from this call."""
  mesh = jax.sharding.get_abstract_mesh()
  batch, length, heads, _ = v_BxLxHxK.shape
  batch_axes = mesh_axes('batch') or None
  head_axes = mesh_axes('heads') or None
  seq = shards.axes
  local_batch = batch // axes_size(mesh, _as_tuple(batch_axes))
  local_heads = heads // axes_size(mesh, _as_tuple(head_axes))
  rows = lambda x: P(*(None,) * (x.ndim - 4), batch_axes, seq, head_axes, None)
  scores_spec = P(batch_axes, head_axes, seq, None)
  if dropout_key is not None and batch * heads * length >= HASH_ROWS:  # check_config refuses it
    raise ValueError(f'ring attention: {batch} x {heads} x {length} dropout rows wrap 32 bits')
  spec = RingSpec(
    axes=seq,
    size=shards.size,
    logits=logits,
    heads=heads,
    length=length,
    threshold=0 if dropout_key is None else keep_threshold(keep_prob),
    generator=generator,
    dtype=dtype,
    carry_out=carry_out,
    sub_block_bytes=SUB_BLOCK_BYTES,
    block_kernel=None
    if block_kernel is None
    else _fitted_block_kernel(
      dataclasses.replace(
        block_kernel,
        keep_threshold=0 if dropout_key is None else keep_threshold(keep_prob),
        heads_total=heads,
        generator=generator,
      ),
      local.shape[0],
      length // shards.size,
      v_BxLxHxK.shape[-1],
    ),
  )
  words = (
    jnp.zeros((2,), jnp.uint32)
    if dropout_key is None
    else jax.random.bits(dropout_key, (2,), jnp.uint32)  # as dropout_bits.keep_mask
  )
  scale_B = jnp.broadcast_to(jnp.reshape(scale, (-1,)), (batch,)).astype(jnp.float32)
  layer_word = jnp.zeros((1,), jnp.uint32) if layer is None else jnp.reshape(layer, (1,))
  args = {
    'layer': layer_word.astype(jnp.uint32),
    'local': local,
    'moving': moving,
    'v': v_BxLxHxK,
    'bias': bias_Bx1x1xL.astype(jnp.float32),
    'scale': scale_B,
    'words': words,
  }
  specs = {
    'layer': P(),
    'local': jax.tree.map(rows, local),
    'moving': jax.tree.map(rows, moving),
    'v': rows(v_BxLxHxK),
    'bias': P(batch_axes, None, None, seq),
    'scale': P(batch_axes),
    'words': P(),
  }
  if divisor is not None:
    args['divisor'], specs['divisor'] = jnp.asarray(divisor, jnp.float32), P()
  if block_in is not None:
    args['block_in'], specs['block_in'] = block_in, scores_spec
  stats_spec = P(batch_axes, head_axes, seq)
  if saved is not None:
    args['saved'], specs['saved'] = saved, (rows(v_BxLxHxK), (stats_spec, stats_spec))

  def per_shard(args):
    offset = lambda axes, n: (
      jnp.zeros((), jnp.uint32)
      if axes is None
      else lax.axis_index(axes).astype(jnp.uint32) * np.uint32(n)
    )
    iparams = jnp.concatenate(
      [
        args['words'],
        jnp.stack([offset(batch_axes, local_batch), offset(head_axes, local_heads)]),
        args['layer'],
      ]
    )
    inputs = (
      args['local'],
      args['moving'],
      args['v'],
      args['bias'],
      args['scale'][:, None, None, None],
      args.get('divisor'),
      args.get('block_in'),
      iparams,
    )
    if 'saved' in args:
      return ring_attention_replay(spec, *inputs, args['saved'])
    return ring_attention(spec, *inputs)

  out_specs = (rows(v_BxLxHxK), scores_spec if carry_out else None, (stats_spec, stats_spec))
  with jax.named_scope(SCOPE):
    return jax.shard_map(
      per_shard, mesh=mesh, in_specs=(specs,), out_specs=out_specs, check_vma=False
    )(args)

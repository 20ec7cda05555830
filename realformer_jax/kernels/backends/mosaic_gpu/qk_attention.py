"""Residual attention from the stacked queries and keys (residual_carry='qk'): the Hopper
forward and dS kernel; the rest of the backward is Triton's.

forward   grid (H, L / block_q, B), attention.py's forward with each score tile rebuilt from
          the stack: for each key block, every layer i <= l (l read from the `layer` operand: one
          kernel serves every layer of a rolled scan) copies its q_i and k_i tiles into shared
          memory (two slots: layer i + 1's copies fly while layer i multiplies) and wgmma adds
          q_i k_i^T into ONE float32 accumulator, scaled once after the last layer (exact where
          the scale is a power of two: BERT's 1/8; issue 57). Then the online softmax, dropout
          and P V of attention.py. Writes the output and the row statistics; no dropout mask.
dS        grid (H, columns / block, B), Triton's dS kernel (kernels/backends/triton/
          qk_attention.py) with the tile transposed as attention.py's dK dV kernel (keys as
          rows: dV += drop(P)^T dO from registers) and the program's own key stack RESIDENT:
          its keys of layers 0 .. l are copied into shared memory once, before the query loop,
          and only the q_i tiles stream (two slots, as the forward's), so a layer step loads
          one [rows, K] tile instead of two (issue 64 item 7: 8 KB instead of 16 at 64 x 64
          bfloat16). Writes dS^T (the GEMMs read it transposed) and dV. It runs where the
          stack fits one block's shared memory (`resident_bytes` <= SHARED_MEMORY: up to 22
          layers at K = 64, so not BERT-Large's 24) and it is asked for (`resident_keys()`:
          opt-in, estimated slower than Triton's today), else Triton's dS kernel does.
GEMMs     Triton's backward around it (`triton_qk.backward(..., score_gradient=)`: its column
          panels, slot buckets and XLA matmuls), which reads exactly what this forward writes
          ((m, log l) [B, H, L] natural, no mask: the dS kernel draws it again with the same
          hash).
Not yet: two consumer warpgroups ping-ponging softmax against wgmma (FlashAttention-3's
schedule); each query tile here waits for its copies and products in turn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.pallas.mosaic_gpu.core import SMEM_ALIGNMENT  # 1024: each buffer's start
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from realformer_jax.kernels.backends.mosaic_gpu import SHARED_MEMORY
from realformer_jax.kernels.backends.mosaic_gpu.attention import (
  SCALARS,
  Ops,
  _check,
  _named,
  _params,
  _program,
  _row_stats,
  drop,
  keep,
  padded_scalars,
  row_stats_smem,
  scalar_smem,
  softmax_update,
  store_forward,
)
from realformer_jax.kernels.plumbing import tile_math as tm
from realformer_jax.kernels.plumbing.spec import KernelSpec


def summed_products(ops: Ops, used, start, operands, shape):
  """sum_{i < used} a_i b_i^T, float32, of two-slot streamed layers: start(i) issues layer i's
  copies into slot i % 2, operands(i, slot) waits for them and returns the (a_i, b_i) shared
  memory tiles. wgmma adds every layer into ONE accumulator (module docstring), layer i + 1's
  copies issued once layer i - 1's product is done with its slot."""
  start(0)
  if ops.interpret:

    def add(i, acc):
      @pl.when(i + 1 < used)
      def _():
        start(i + 1)

      a, b = operands(i, lax.rem(i, 2))
      return acc + ops.mma(a, b, transpose_b=True)

    return lax.fori_loop(0, used, add, jnp.zeros(shape, jnp.float32))

  def run(acc_ref):
    @pl.loop(0, used)
    def _(i):
      a, b = operands(i, lax.rem(i, 2))
      plgpu.wgmma(acc_ref, a, plgpu.transpose_ref(b, (1, 0)))
      plgpu.wgmma_wait(1)  # layer i - 1's product is done: its slot may be refilled

      @pl.when(i + 1 < used)
      def _():
        start(i + 1)

    plgpu.wgmma_wait(0)
    return acc_ref[...]

  return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def _forward_kernel(
  stack_ref, v_ref, bias_ref, f_ref, i_ref, n_ref, o_ref, m_ref, log_l_ref, q_s, k_s, v_s,
  bias_s, f_s, i_s, n_s, m_s, l_s, bars, *, spec: KernelSpec, ops: Ops, layers: int, batch: int,
):  # fmt: skip
  h, qi, b, scale, inv_div, words = _program('q', f_ref, i_ref, f_s, i_s, bars)
  seq_len = v_ref.shape[1]
  block_q, block_k = spec.block_q, spec.block_k
  q0 = qi * block_q
  plgpu.copy_gmem_to_smem(n_ref, n_s, bars.at[2])
  plgpu.barrier_wait(bars.at[2])
  used = n_s[0] + 1  # layers 0 .. l
  rows = (ops.iota((block_q, block_k), 0) + q0).astype(jnp.uint32)
  cols0 = ops.iota((block_q, block_k), 1).astype(jnp.uint32)

  def copy_layer(i, k0):
    slot = lax.rem(i, 2)
    queries = stack_ref.at[i * batch + b, pl.ds(q0, block_q), h]  # part 0: the queries
    keys = stack_ref.at[(layers + i) * batch + b, pl.ds(k0, block_k), h]  # part 1: the keys
    plgpu.copy_gmem_to_smem(queries, q_s.at[slot], bars.at[3 + slot])
    plgpu.copy_gmem_to_smem(keys, k_s.at[slot], bars.at[5 + slot])

  def operands(i, slot):
    del i
    plgpu.barrier_wait(bars.at[3 + slot])
    plgpu.barrier_wait(bars.at[5 + slot])
    return q_s.at[slot], k_s.at[slot]

  def summed(k0):
    """sum_{i < used} q_i k_i^T of this tile, float32, unscaled."""
    start = lambda i: copy_layer(i, k0)  # noqa: E731
    return summed_products(ops, used, start, operands, (block_q, block_k))

  def body(j, carry):
    acc, m, l = carry
    k0 = j * block_k
    plgpu.copy_gmem_to_smem(v_ref.at[b, pl.ds(k0, block_k), h], v_s, bars.at[7])
    plgpu.copy_gmem_to_smem(bias_ref.at[b, pl.ds(k0, block_k)], bias_s, bars.at[8])
    plgpu.barrier_wait(bars.at[8])
    z = summed(k0) * scale * inv_div + lax.broadcast_in_dim(
      ops.vector(bias_s, along=1), (block_q, block_k), [1]
    )
    p, alpha, m_new, l = softmax_update(z, m, l)
    kept = keep(spec, words, b, h, seq_len, rows, cols0 + k0.astype(jnp.uint32))
    plgpu.barrier_wait(bars.at[7])
    pv = ops.mma(drop(p, kept, spec.keep_prob).astype(v_s.dtype), v_s)
    return acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv, m_new, l

  head_dim = v_s.shape[1]
  init = ops.softmax_state(block_q, head_dim)
  acc, m, l = lax.fori_loop(0, seq_len // block_k, body, init)
  store_forward(acc, m, l, (q_s.at[0], m_s, l_s), (o_ref, m_ref, log_l_ref), b, h, q0, block_q)


def forward(stack, v, bias, fparams, iparams, layer, spec: KernelSpec):
  """(out [B, L, H, K], lse = (m, log l) [B, H, L] float32 each, None: no stored dropout mask).
  stack: [2, N, B, L, H, K]; layer: int32 [1]."""
  parts, layers, batch, seq_len, heads, head_dim = stack.shape
  _check(spec, v)
  ops = Ops(spec.interpret)
  # [2 N B, L, H, K]: a layer's (part, i, b) slice is one leading index (TMA copies take at
  # most five dimensions).
  flat = stack.astype(v.dtype).reshape(parts * layers * batch, seq_len, heads, head_dim)
  f, i = padded_scalars(fparams, iparams)
  n = jnp.pad(layer.astype(jnp.int32).reshape(1), (0, SCALARS - 1))
  stats = jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32)
  out, m, log_l = _named('mosaic_gpu_qk_attention_fwd')(
    functools.partial(_forward_kernel, spec=spec, ops=ops, layers=layers, batch=batch),
    out_type=(jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), v.dtype), stats, stats),
    grid=(heads, seq_len // spec.block_q, batch),
    grid_names=('heads', 'q', 'batch'),
    scratch_types=[
      ops.tile(spec.block_q, head_dim, v.dtype, slots=2),
      ops.tile(spec.block_k, head_dim, v.dtype, slots=2),
      ops.tile(spec.block_k, head_dim, v.dtype),
      plgpu.SMEM((spec.block_k,), jnp.float32),
      *scalar_smem(),
      plgpu.SMEM((SCALARS,), jnp.int32),
      *row_stats_smem(spec.block_q),
      plgpu.Barrier(num_barriers=9),
    ],
    interpret=_params(spec),
  )(flat, v, bias.astype(jnp.float32), f, i, n)
  return out, (m, log_l), None


def _score_gradient_scratch(ops: Ops, layers: int, head_dim: int, dtype, spec: KernelSpec):
  """The dS kernel's shared memory: the resident key stack (a [block, K] tile per layer of
  the stack: `layers` slots, the most any layer uses), two query slots, the v, dO and dS^T
  tiles, the row vectors (m, log l, delta; the keys' bias), scalars and barriers."""
  block, rows = spec.block_bwd, spec.backward_rows
  vector = lambda size: plgpu.SMEM((size,), jnp.float32)  # noqa: E731
  return [
    ops.tile(block, head_dim, dtype, slots=layers),  # the resident keys
    ops.tile(rows, head_dim, dtype, slots=2),
    ops.tile(block, head_dim, dtype),
    ops.tile(rows, head_dim, dtype),
    ops.tile(block, rows, dtype),
    vector(rows),
    vector(rows),
    vector(rows),
    vector(block),
    *scalar_smem(),
    plgpu.SMEM((SCALARS,), jnp.int32),
    plgpu.Barrier(num_barriers=12),
  ]


def resident_bytes(layers: int, head_dim: int, spec: KernelSpec, dtype=jnp.bfloat16) -> int:
  """Bytes of shared memory the compiled dS kernel allocates: each buffer starts on Mosaic
  GPU's SMEM_ALIGNMENT, a barrier is one 8-byte mbarrier."""
  total = 0
  for buffer in _score_gradient_scratch(Ops(False), layers, head_dim, dtype, spec):
    if isinstance(buffer, plgpu.Barrier):
      size = 8 * math.prod(np.atleast_1d(buffer.num_barriers))
    else:
      size = math.prod(buffer.shape) * jnp.dtype(buffer.dtype).itemsize
    total += -(-size // SMEM_ALIGNMENT) * SMEM_ALIGNMENT
  return total


def _score_gradient_kernel(
  stack_ref, v_ref, do_ref, m_ref, log_l_ref, delta_ref, bias_ref, f_ref, i_ref, n_ref,
  ds_ref, dv_ref, k_res, q_s, v_s, do_s, ds_s, m_s, l_s, d_s, bias_s, f_s, i_s, n_s, bars, *,
  spec: KernelSpec, ops: Ops, layers: int, batch: int,
):  # fmt: skip
  """Program (h, jk, b): key rows col0 + jk * block of (b, h), the tile transposed (keys as
  rows, as attention.py's dK dV kernel). Its keys of layers 0 .. l are copied into shared
  memory ONCE and stay there while the program walks every query tile: only q_i streams
  (issue 64 item 7). Writes dS^T of its columns and their dV."""
  h, jk, b, scale, inv_div, words = _program('k', f_ref, i_ref, f_s, i_s, bars)
  seq_len, block, rows = v_ref.shape[1], spec.block_bwd, spec.backward_rows
  plgpu.copy_gmem_to_smem(n_ref, n_s, bars.at[2])
  plgpu.barrier_wait(bars.at[2])
  used, k0 = n_s[0] + 1, n_s[1] + jk * block  # layers 0 .. l; the global first key
  plgpu.copy_gmem_to_smem(v_ref.at[b, pl.ds(k0, block), h], v_s, bars.at[4])
  plgpu.copy_gmem_to_smem(bias_ref.at[b, pl.ds(k0, block)], bias_s, bars.at[5])

  def resident(i, carry):
    keys = stack_ref.at[(layers + i) * batch + b, pl.ds(k0, block), h]  # part 1: the keys
    plgpu.copy_gmem_to_smem(keys, k_res.at[i], bars.at[3])
    plgpu.barrier_wait(bars.at[3])
    return carry

  lax.fori_loop(0, used, resident, jnp.int32(0))
  plgpu.barrier_wait(bars.at[4])
  plgpu.barrier_wait(bars.at[5])
  bias_keys = lax.broadcast_in_dim(ops.vector(bias_s, along=0), (block, rows), [0])
  keys = (ops.iota((block, rows), 0) + k0).astype(jnp.uint32)
  queries0 = ops.iota((block, rows), 1).astype(jnp.uint32)

  def body(j, dv):
    q0 = j * rows

    def start(i):
      queries = stack_ref.at[i * batch + b, pl.ds(q0, rows), h]  # part 0: the queries
      plgpu.copy_gmem_to_smem(queries, q_s.at[lax.rem(i, 2)], bars.at[6 + lax.rem(i, 2)])

    def operands(i, slot):
      plgpu.barrier_wait(bars.at[6 + slot])
      return k_res.at[i], q_s.at[slot]

    plgpu.copy_gmem_to_smem(do_ref.at[b, pl.ds(q0, rows), h], do_s, bars.at[8])
    _row_stats((m_ref, log_l_ref, delta_ref), (m_s, l_s, d_s), bars, 9, b, h, q0, rows)
    z_t = summed_products(ops, used, start, operands, (block, rows)) * scale * inv_div
    column = lambda smem: lax.broadcast_in_dim(ops.vector(smem, along=1), z_t.shape, [1])  # noqa: E731
    p_t = jnp.exp(z_t + bias_keys - column(m_s) - column(l_s))  # (z - m) first: padding ~-1e9
    kept = keep(spec, words, b, h, seq_len, queries0 + q0.astype(jnp.uint32), keys)
    plgpu.barrier_wait(bars.at[8])
    dv = dv + ops.mma(drop(p_t, kept, spec.keep_prob).astype(do_s.dtype), do_s)
    dp_t = drop(ops.mma(v_s, do_s, transpose_b=True), kept, spec.keep_prob)
    ds_s[...] = (p_t * (dp_t - column(d_s)) * (scale * inv_div)).astype(ds_s.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(ds_s, ds_ref.at[b, h, pl.ds(jk * block, block), pl.ds(q0, rows)])
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # ds_s is free for the next tile
    return dv

  head_dim = v_s.shape[1]
  dv = lax.fori_loop(0, seq_len // rows, body, ops.full((block, head_dim), 0.0))
  v_s[...] = dv.astype(v_s.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(v_s, dv_ref.at[b, pl.ds(jk * block, block), h])
  plgpu.wait_smem_to_gmem(0)


def score_gradient(stack, v, do, lse, delta, bias, fparams, iparams, layer, col0, columns, spec):
  """The Hopper dS kernel with Triton's _score_gradient's signature and results (dS [B, H, L,
  columns] and dV [B, columns, H, K] in v's dtype, of key columns col0 .. col0 + columns);
  lse natural (this forward's)."""
  parts, layers, batch, seq_len, heads, head_dim = stack.shape
  ops = Ops(spec.interpret)
  block = spec.block_bwd
  flat = stack.astype(v.dtype).reshape(parts * layers * batch, seq_len, heads, head_dim)
  f, i = padded_scalars(fparams, iparams)
  n = jnp.pad(jnp.concatenate([layer, col0]).astype(jnp.int32), (0, SCALARS - 2))
  m, log_l = lse
  ds_t, dv = _named('mosaic_gpu_qk_attention_ds')(
    functools.partial(_score_gradient_kernel, spec=spec, ops=ops, layers=layers, batch=batch),
    out_type=(
      jax.ShapeDtypeStruct((batch, heads, columns, seq_len), v.dtype),
      jax.ShapeDtypeStruct((batch, columns, heads, head_dim), v.dtype),
    ),
    grid=(heads, columns // block, batch),
    grid_names=('heads', 'k', 'batch'),
    scratch_types=_score_gradient_scratch(ops, layers, head_dim, v.dtype, spec),
    interpret=_params(spec),
  )(flat, v, do.astype(v.dtype), m, log_l, delta, bias.astype(jnp.float32), f, i, n)
  # dS^T -> dS: XLA folds the swap into the GEMMs' contraction (no copy of the panel)
  return jnp.swapaxes(ds_t, 2, 3), dv


# The Hopper dS kernel is opt-in (`resident_keys`): by the estimate (issue 64 item 7,
# docs/performance.md) it is slower than Triton's dS kernel today, 4 x 1.69 s against 4 x
# 1.20 s for BERT-Base qk at 65,536 on an H200 (its Threefry hash is drawn per element where
# Triton shares one among eight), so the backend's backward keeps Triton's until a GPU says
# otherwise; the tests and the sm_90a compile check run the kernel inside `resident_keys()`.
_resident_keys = False


@contextlib.contextmanager
def resident_keys() -> Iterator[None]:
  """Backwards traced inside take the Hopper dS kernel where the key stack fits."""
  global _resident_keys
  before, _resident_keys = _resident_keys, True
  try:
    yield
  finally:
    _resident_keys = before


def backward(
  stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec: KernelSpec
):
  """Triton's backward (its panels and GEMMs) around the Hopper dS kernel where asked
  (`resident_keys`) and the key stack fits shared memory (resident_bytes), else Triton's
  whole, on its tile table's tiles."""
  from realformer_jax.kernels import backends  # pylint: disable=import-outside-toplevel

  triton_qk = backends.get('triton').qk_kernels()  # its record's module, as the plan's would be
  _, layers, _, seq_len, _, head_dim = stack.shape
  if _resident_keys and resident_bytes(layers, head_dim, spec, v.dtype) <= SHARED_MEMORY:
    return triton_qk.backward(
      stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec,
      score_gradient=score_gradient,
    )  # fmt: skip
  triton_spec = triton_qk.fit_blocks(
    dataclasses.replace(spec, backend='triton'), layers, seq_len, head_dim
  )
  # The Triton kernels' statistics are base 2 (tile_math.py); this forward's are natural.
  return triton_qk.backward(
    stack, v, do, tm.to_base2(lse), delta, bias, fparams, iparams, layer, bits, g_stack, triton_spec
  )

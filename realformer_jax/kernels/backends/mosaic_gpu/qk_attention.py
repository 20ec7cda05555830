"""Residual attention from the stacked queries and keys (residual_carry='qk'): the Hopper
forward, and the Triton backward.

forward   grid (H, L / block_q, B), attention.py's forward with each score tile rebuilt from
          the stack: for each key block, every layer i <= l (l read from the `layer` operand: one
          kernel serves every layer of a rolled scan) copies its q_i and k_i tiles into shared
          memory (two slots: layer i + 1's copies fly while layer i multiplies) and wgmma adds
          q_i k_i^T into ONE float32 accumulator, scaled once after the last layer (exact where
          the scale is a power of two: BERT's 1/8; issue 57). Then the online softmax, dropout
          and P V of attention.py. Writes the output and the row statistics; no dropout mask.
backward  Triton's (kernels/backends/triton/qk_attention.py: the dS kernel and XLA's GEMMs),
          which reads exactly what this forward writes ((m, log l) [B, H, L], no mask: it draws
          it again with the same hash). The Hopper dS kernel is not written yet.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from realformer_jax.kernels.backends.mosaic_gpu.attention import (
  SCALARS,
  Ops,
  _check,
  _named,
  _params,
  _scalars,
  drop,
  keep,
  padded_scalars,
  softmax_update,
)
from realformer_jax.kernels.plumbing import tile_math as tm
from realformer_jax.kernels.plumbing.spec import KernelSpec


def _forward_kernel(
  stack_ref, v_ref, bias_ref, f_ref, i_ref, n_ref, o_ref, m_ref, log_l_ref, q_s, k_s, v_s,
  bias_s, f_s, i_s, n_s, m_s, l_s, bars, *, spec: KernelSpec, ops: Ops, layers: int, batch: int,
):  # fmt: skip
  h, qi, b = lax.axis_index('heads'), lax.axis_index('q'), lax.axis_index('batch')
  seq_len = v_ref.shape[1]
  block_q, block_k = spec.block_q, spec.block_k
  q0 = qi * block_q
  scale, inv_div, words = _scalars(f_ref, i_ref, f_s, i_s, bars, b)
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

  def summed(k0):
    """sum_{i < used} q_i k_i^T of this tile, float32, unscaled."""
    copy_layer(0, k0)
    if ops.interpret:

      def add(i, acc):
        @pl.when(i + 1 < used)
        def _():
          copy_layer(i + 1, k0)

        slot = lax.rem(i, 2)
        plgpu.barrier_wait(bars.at[3 + slot])
        plgpu.barrier_wait(bars.at[5 + slot])
        return acc + ops.mma(q_s.at[slot], k_s.at[slot], transpose_b=True)

      return lax.fori_loop(0, used, add, jnp.zeros((block_q, block_k), jnp.float32))

    def run(acc_ref):
      @pl.loop(0, used)
      def _(i):
        slot = lax.rem(i, 2)
        plgpu.barrier_wait(bars.at[3 + slot])
        plgpu.barrier_wait(bars.at[5 + slot])
        plgpu.wgmma(acc_ref, q_s.at[slot], plgpu.transpose_ref(k_s.at[slot], (1, 0)))
        plgpu.wgmma_wait(1)  # layer i - 1's product is done: its slot may be refilled

        @pl.when(i + 1 < used)
        def _():
          copy_layer(i + 1, k0)

      plgpu.wgmma_wait(0)
      return acc_ref[...]

    return pl.run_scoped(run, plgpu.ACC((block_q, block_k), jnp.float32))

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
  out_s = q_s.at[0]
  out_s[...] = (acc / lax.broadcast_in_dim(l, acc.shape, [0])).astype(out_s.dtype)
  m_s[...] = m
  l_s[...] = jnp.log(l)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_s, o_ref.at[b, pl.ds(q0, block_q), h])
  plgpu.copy_smem_to_gmem(m_s, m_ref.at[b, h, pl.ds(q0, block_q)])
  plgpu.copy_smem_to_gmem(l_s, log_l_ref.at[b, h, pl.ds(q0, block_q)])
  plgpu.wait_smem_to_gmem(0)


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
      plgpu.SMEM((SCALARS,), jnp.float32),
      plgpu.SMEM((SCALARS,), jnp.uint32),
      plgpu.SMEM((SCALARS,), jnp.int32),
      plgpu.SMEM((spec.block_q,), jnp.float32),
      plgpu.SMEM((spec.block_q,), jnp.float32),
      plgpu.Barrier(num_barriers=9),
    ],
    interpret=_params(spec),
  )(flat, v, bias.astype(jnp.float32), f, i, n)
  return out, (m, log_l), None


def backward(
  stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec: KernelSpec
):
  """Triton's backward (module docstring), on the Triton tile table's tiles for this device."""
  from realformer_jax.kernels import backends  # pylint: disable=import-outside-toplevel

  triton_qk = backends.get('triton').qk_kernels()  # its record's module, as the plan's would be
  _, layers, _, seq_len, _, head_dim = stack.shape
  triton_spec = triton_qk.fit_blocks(
    dataclasses.replace(spec, backend='triton'), layers, seq_len, head_dim
  )
  # The Triton kernels' statistics are base 2 (tile_math.py); this forward's are natural.
  return triton_qk.backward(
    stack, v, do, tm.to_base2(lse), delta, bias, fparams, iparams, layer, bits, g_stack, triton_spec
  )

"""Fused attention kernels for NVIDIA GPUs (Pallas on Triton).

forward   grid (query blocks, B, H). A program holds its query tile and walks the key blocks:
          s = scale q k^T; with residual attention it reads the acc_{l-1} tile, writes
          acc_l = acc_{l-1} + s, and feeds z = acc_l * inv_div + bias to an online softmax;
          dropout (the einsum path's mask, dropout_tiles.py) and P V happen in registers.
          Writes the output and the row log-sum-exp; probabilities never reach HBM.
backward  grid (key blocks, B, H). A program holds its key / value tile and walks the query
          blocks, recomputing p = exp(z - lse) and the mask, accumulating dK and dV. With
          residual attention it reads acc_l and the carried gradient g_l, writes
          g_{l-1} = g_l + dz * inv_div (and, when asked, acc_{l-1} = acc_l - s, so the layer
          below needs no saved sum); dQ = scale g_{l-1} K is then one matmul outside the
          kernel. Without it a second loop of the same program computes the dQ tile of the
          query block with its own index (so query and key blocks are the same size there).
HBM traffic per score element: forward 4 B read + 4 B write with residual attention, else 0;
backward 4 + 4 read, 4 written (+4 when rebuilding acc_{l-1}), + 4 read by the dQ kernel.
q, k and v are read straight from the fused projection's [B, L, 3, H, K] output, and the
gradient is written into one [B, L, 3, H, K] array, so no slices or concatenations surround the
kernels.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from realformer_jax.kernels import tile_math as tm
from realformer_jax.kernels.dropout_tiles import keep_tile_joined
from realformer_jax.kernels.spec import KernelSpec


def _keep(spec: KernelSpec, i_ref, b, h, seq_len, q0, k0, shape):
  if not spec.dropout:
    return None
  row0 = ((i_ref[2] + b.astype(jnp.uint32)) * spec.heads_total + i_ref[3]
          + h.astype(jnp.uint32)) * seq_len + q0.astype(jnp.uint32)
  return keep_tile_joined(i_ref[0], i_ref[1], row0, k0, shape, spec.keep_threshold)


def _forward_kernel(q_ref, k_ref, v_ref, acc_in_ref, bias_ref, f_ref, i_ref, o_ref, lse_ref,
                    acc_out_ref, *, spec: KernelSpec):
  block_q, head_dim = q_ref.shape
  seq_len = k_ref.shape[0]
  block_k = spec.block_k
  iq, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  q = q_ref[...]
  scale, inv_div = f_ref[0], f_ref[1]

  def body(j, state):
    ks = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
    if spec.sum_given:
      acc = acc_in_ref[:, ks]
    else:
      acc = tm.scores(q, k_ref[ks, :], scale)
      if spec.carry_in:
        acc = acc_in_ref[:, ks] + acc
      if spec.carry_out:
        acc_out_ref[:, ks] = acc
    z = tm.softmax_input(acc, inv_div, bias_ref[ks][None, :])
    keep = _keep(spec, i_ref, b, h, seq_len, iq * block_q, j * block_k, (block_q, block_k))
    return tm.online_softmax_step(state, z, v_ref[ks, :], keep, spec.keep_prob)

  state = lax.fori_loop(0, seq_len // block_k, body, tm.initial_state(block_q, head_dim))
  out, lse = tm.finish(state)
  o_ref[...] = out.astype(o_ref.dtype)
  lse_ref[...] = lse[:, 0]


def _qkv_spec(rows: int, part: int, row_block, head_dim: int) -> pl.BlockSpec:
  """Rows of q (part 0), k (1) or v (2) of one (batch, head) in a [B, L, 3, H, K] array;
  `row_block(first program id)` is the block index along L."""
  return pl.BlockSpec((None, rows, None, None, head_dim),
                      lambda i, b, h: (b, row_block(i), part, h, 0))


def forward(qkv, acc_in, bias, fparams, iparams, spec: KernelSpec):
  """(out [B, L, H, K], lse [B, H, L] float32, acc_out [B, H, L, L] float32 or None; None
  with `spec.sum_given`, whose acc_in is already acc_l)."""
  batch, seq_len, _, heads, head_dim = qkv.shape
  block_q, block_k = spec.block_q, spec.block_k
  grid = (seq_len // block_q, batch, heads)
  whole = lambda i: 0
  acc_spec = pl.BlockSpec((None, None, block_q, seq_len), lambda i, b, h: (b, h, i, 0))
  in_specs = [_qkv_spec(block_q, 0, lambda i: i, head_dim),
              _qkv_spec(seq_len, 1, whole, head_dim), _qkv_spec(seq_len, 2, whole, head_dim),
              acc_spec if spec.carry_in else None,
              pl.BlockSpec((None, seq_len), lambda i, b, h: (b, 0)),
              pl.BlockSpec((None, 2), lambda i, b, h: (b, 0)),
              pl.BlockSpec((4,), lambda i, b, h: (0,))]
  out_shape = [jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), qkv.dtype),
               jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32)]
  out_specs = [pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, i, h, 0)),
               pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i))]
  if spec.carry_out and not spec.sum_given:
    out_shape.append(jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len), jnp.float32))
    out_specs.append(acc_spec)
  else:
    out_shape.append(None)
    out_specs.append(None)
  out, lse, acc_out = pl.pallas_call(
      functools.partial(_forward_kernel, spec=spec), grid=grid, in_specs=in_specs,
      out_specs=out_specs, out_shape=out_shape, interpret=spec.interpret,
      compiler_params=plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2),
      # acc_l overwrites acc_{l-1} tile by tile (each program reads its rows before writing
      # them), so a loop carrying the sum needs no copy; XLA copies if acc_{l-1} is still used.
      input_output_aliases={3: 2} if spec.carry_in and not spec.sum_given else {},
      metadata=_flops_metadata(batch, heads, seq_len, head_dim,
                               passes=1 if spec.sum_given else 2),
      name='realformer_attention_fwd' if spec.carry_out else 'flash_attention_fwd',
  )(qkv, qkv, qkv, acc_in if spec.carry_in else None, bias, fparams, iparams)
  return out, lse, acc_out


def _backward_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, acc_ref, g_acc_ref,
                     bias_ref, f_ref, i_ref, dqkv_ref, g_acc_in_ref, acc_in_ref,
                     *, spec: KernelSpec, rebuild: bool):
  seq_len, head_dim = q_ref.shape
  block = spec.block_bwd
  jk, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  scale, inv_div = f_ref[0], f_ref[1]
  ks = pl.ds(pl.multiple_of(jk * block, block), block)
  k, v = k_ref[ks, :], v_ref[ks, :]
  bias_row = bias_ref[ks][None, :]

  def tile(i, k, v, bias_row, k0, acc=None, g_acc=None):
    qs = pl.ds(pl.multiple_of(i * block, block), block)
    q, do = q_ref[qs, :], do_ref[qs, :]
    s = tm.scores(q, k, scale)
    z = tm.softmax_input(s if acc is None else acc, inv_div, bias_row)
    keep = _keep(spec, i_ref, b, h, seq_len, i * block, k0, (block, block))
    p_dropped, dz = tm.score_gradient(z, lse_ref[qs][:, None], delta_ref[qs][:, None], do, v,
                                      keep, spec.keep_prob)
    g = dz * inv_div if g_acc is None else g_acc + dz * inv_div
    return q, do, s, p_dropped, g

  def dkv_body(i, carry):
    dk, dv = carry
    qs = pl.ds(pl.multiple_of(i * block, block), block)
    acc = acc_ref[qs, :] if spec.carry_out else None
    g_acc = g_acc_ref[qs, :] if spec.carry_out else None
    q, do, s, p_dropped, g = tile(i, k, v, bias_row, jk * block, acc, g_acc)
    if spec.carry_out:
      g_acc_in_ref[qs, :] = g
      if rebuild:
        acc_in_ref[qs, :] = acc - s
    dv = dv + tm.t_dot(p_dropped, do)
    dk = dk + tm.t_dot((g * scale).astype(q.dtype), q)
    return dk, dv

  zeros = jnp.zeros((block, head_dim), jnp.float32)
  dk, dv = lax.fori_loop(0, seq_len // block, dkv_body, (zeros, zeros))
  dqkv_ref[:, 1, :] = dk.astype(dqkv_ref.dtype)
  dqkv_ref[:, 2, :] = dv.astype(dqkv_ref.dtype)
  if spec.carry_out:
    return  # dQ: query_gradient, from the carried gradient this kernel wrote

  iq = jk  # second loop: the query block with this program's index, over every key block

  def dq_body(j, dq):
    js = pl.ds(pl.multiple_of(j * block, block), block)
    kj = k_ref[js, :]
    *_, g = tile(iq, kj, v_ref[js, :], bias_ref[js][None, :], j * block)
    return dq + tm.dot((g * scale).astype(kj.dtype), kj)

  dq = lax.fori_loop(0, seq_len // block, dq_body, jnp.zeros((block, head_dim), jnp.float32))
  dqkv_ref[:, 0, :] = dq.astype(dqkv_ref.dtype)


def backward(qkv, do, lse, delta, acc, g_acc, bias, fparams, iparams, spec: KernelSpec,
             rebuild: bool = False):
  """(dqkv [B, L, 3, H, K], g_acc_in or None, acc_in or None); see the module docstring.
  With residual attention dqkv holds dK and dV only: query_gradient adds dQ in place."""
  batch, seq_len, _, heads, head_dim = qkv.shape
  block = spec.block_bwd
  grid = (seq_len // block, batch, heads)
  whole = lambda j: 0
  seq_spec = pl.BlockSpec((None, seq_len, None, head_dim), lambda j, b, h: (b, 0, h, 0))
  stat_spec = pl.BlockSpec((None, None, seq_len), lambda j, b, h: (b, h, 0))
  column_spec = pl.BlockSpec((None, None, seq_len, block), lambda j, b, h: (b, h, 0, j))
  carry = spec.carry_out
  in_specs = [_qkv_spec(seq_len, part, whole, head_dim) for part in range(3)] + [
              seq_spec, stat_spec, stat_spec,
              column_spec if carry else None, column_spec if carry else None,
              pl.BlockSpec((None, seq_len), lambda j, b, h: (b, 0)),
              pl.BlockSpec((None, 2), lambda j, b, h: (b, 0)),
              pl.BlockSpec((4,), lambda j, b, h: (0,))]
  scores_shape = jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len), jnp.float32)
  out_shape = [jax.ShapeDtypeStruct(qkv.shape, qkv.dtype),
               scores_shape if carry else None, scores_shape if carry and rebuild else None]
  # Program j writes rows j of dK and dV and (without residual attention) of dQ.
  out_specs = [pl.BlockSpec((None, block, 3, None, head_dim),
                            lambda j, b, h: (b, j, 0, h, 0)),
               column_spec if carry else None, column_spec if carry and rebuild else None]
  return pl.pallas_call(
      functools.partial(_backward_kernel, spec=spec, rebuild=rebuild), grid=grid,
      in_specs=in_specs, out_specs=out_specs, out_shape=out_shape, interpret=spec.interpret,
      compiler_params=plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2),
      # In place, column strip by column strip: g_{l-1} over g_l, acc_{l-1} over acc_l.
      input_output_aliases=({7: 1, 6: 2} if rebuild else {7: 1}) if carry else {},
      metadata=_flops_metadata(batch, heads, seq_len, head_dim, passes=4 if carry else 7),
      name='realformer_attention_bwd' if carry else 'flash_attention_bwd',
  )(qkv, qkv, qkv, do, lse, delta, acc if carry else None, g_acc if carry else None, bias,
    fparams, iparams)


def _dq_kernel(g_ref, k_ref, f_ref, _, dq_ref, *, spec: KernelSpec):
  block_q, head_dim = dq_ref.shape
  seq_len = k_ref.shape[0]
  block_k = spec.block_k
  scale = f_ref[0]

  def body(j, dq):
    ks = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
    k = k_ref[ks, :]
    return dq + tm.dot((g_ref[:, ks] * scale).astype(k.dtype), k)

  dq = lax.fori_loop(0, seq_len // block_k, body, jnp.zeros((block_q, head_dim), jnp.float32))
  dq_ref[...] = dq.astype(dq_ref.dtype)


def query_gradient(g, qkv, fparams, dqkv, spec: KernelSpec):
  """dqkv with its dQ part = scale g K, from the float32 score gradient g [B, H, L, L], read
  once (an XLA matmul would first write a bfloat16 copy of g); written into dqkv in place."""
  batch, seq_len, _, heads, head_dim = qkv.shape
  block_q = spec.block_q
  dq_spec = pl.BlockSpec((None, block_q, None, None, head_dim),
                         lambda i, b, h: (b, i, 0, h, 0))
  return pl.pallas_call(
      functools.partial(_dq_kernel, spec=spec), grid=(seq_len // block_q, batch, heads),
      in_specs=[pl.BlockSpec((None, None, block_q, seq_len), lambda i, b, h: (b, h, i, 0)),
                _qkv_spec(seq_len, 1, lambda i: 0, head_dim),
                pl.BlockSpec((None, 2), lambda i, b, h: (b, 0)), dq_spec],
      out_specs=dq_spec, out_shape=jax.ShapeDtypeStruct(dqkv.shape, dqkv.dtype),
      input_output_aliases={3: 0}, interpret=spec.interpret,
      compiler_params=plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2),
      metadata=_flops_metadata(batch, heads, seq_len, head_dim, passes=1),
      name='realformer_attention_dq',
  )(g, qkv, fparams, dqkv)


def _flops_metadata(batch, heads, seq_len, head_dim, passes: int) -> dict:
  """Matmul FLOPs of the kernel (`passes` [L, L] x [L, K] products per (b, h)), in the
  custom call's backend config: XLA's GPU cost model does not see inside a Triton kernel, so
  the roofline estimator reads them from here."""
  return {'flops': str(2 * passes * batch * heads * seq_len * seq_len * head_dim)}

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
backward 4 + 4 read, 4 written (+4 when rebuilding acc_{l-1}), + 4 read by the dQ matmul.
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


def forward(q, k, v, acc_in, bias, fparams, iparams, spec: KernelSpec):
  """(out [B, L, H, K], lse [B, H, L] float32, acc_out [B, H, L, L] float32 or None)."""
  batch, seq_len, heads, head_dim = q.shape
  block_q, block_k = spec.block_q, spec.block_k
  grid = (seq_len // block_q, batch, heads)
  row_spec = pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, i, h, 0))
  seq_spec = pl.BlockSpec((None, seq_len, None, head_dim), lambda i, b, h: (b, 0, h, 0))
  acc_spec = pl.BlockSpec((None, None, block_q, seq_len), lambda i, b, h: (b, h, i, 0))
  in_specs = [row_spec, seq_spec, seq_spec, acc_spec if spec.carry_in else None,
              pl.BlockSpec((None, seq_len), lambda i, b, h: (b, 0)),
              pl.BlockSpec((None, 2), lambda i, b, h: (b, 0)),
              pl.BlockSpec((4,), lambda i, b, h: (0,))]
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32)]
  out_specs = [row_spec, pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i))]
  if spec.carry_out:
    out_shape.append(jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len), jnp.float32))
    out_specs.append(acc_spec)
  else:
    out_shape.append(None)
    out_specs.append(None)
  out, lse, acc_out = pl.pallas_call(
      functools.partial(_forward_kernel, spec=spec), grid=grid, in_specs=in_specs,
      out_specs=out_specs, out_shape=out_shape, interpret=spec.interpret,
      compiler_params=plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2),
      metadata=_flops_metadata(batch, heads, seq_len, head_dim, passes=2),
      name='realformer_attention_fwd' if spec.carry_out else 'flash_attention_fwd',
  )(q, k, v, acc_in if spec.carry_in else None, bias, fparams, iparams)
  return out, lse, acc_out


def _backward_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, acc_ref, g_acc_ref,
                     bias_ref, f_ref, i_ref, dq_ref, dk_ref, dv_ref, g_acc_in_ref, acc_in_ref,
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
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)
  if spec.carry_out:
    return

  iq = jk  # second loop: the query block with this program's index, over every key block

  def dq_body(j, dq):
    js = pl.ds(pl.multiple_of(j * block, block), block)
    kj = k_ref[js, :]
    *_, g = tile(iq, kj, v_ref[js, :], bias_ref[js][None, :], j * block)
    return dq + tm.dot((g * scale).astype(kj.dtype), kj)

  dq = lax.fori_loop(0, seq_len // block, dq_body, jnp.zeros((block, head_dim), jnp.float32))
  dq_ref[...] = dq.astype(dq_ref.dtype)


def backward(q, k, v, do, lse, delta, acc, g_acc, bias, fparams, iparams, spec: KernelSpec,
             rebuild: bool = False):
  """(dq or None, dk, dv, g_acc_in or None, acc_in or None); see the module docstring."""
  batch, seq_len, heads, head_dim = q.shape
  block = spec.block_bwd
  grid = (seq_len // block, batch, heads)
  seq_spec = pl.BlockSpec((None, seq_len, None, head_dim), lambda j, b, h: (b, 0, h, 0))
  row_spec = pl.BlockSpec((None, block, None, head_dim), lambda j, b, h: (b, j, h, 0))
  stat_spec = pl.BlockSpec((None, None, seq_len), lambda j, b, h: (b, h, 0))
  column_spec = pl.BlockSpec((None, None, seq_len, block), lambda j, b, h: (b, h, 0, j))
  carry = spec.carry_out
  in_specs = [seq_spec, seq_spec, seq_spec, seq_spec, stat_spec, stat_spec,
              column_spec if carry else None, column_spec if carry else None,
              pl.BlockSpec((None, seq_len), lambda j, b, h: (b, 0)),
              pl.BlockSpec((None, 2), lambda j, b, h: (b, 0)),
              pl.BlockSpec((4,), lambda j, b, h: (0,))]
  scores_shape = jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len), jnp.float32)
  out_shape = [None if carry else jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
               scores_shape if carry else None, scores_shape if carry and rebuild else None]
  out_specs = [None if carry else row_spec, row_spec, row_spec,
               column_spec if carry else None, column_spec if carry and rebuild else None]
  return pl.pallas_call(
      functools.partial(_backward_kernel, spec=spec, rebuild=rebuild), grid=grid,
      in_specs=in_specs, out_specs=out_specs, out_shape=out_shape, interpret=spec.interpret,
      compiler_params=plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2),
      metadata=_flops_metadata(batch, heads, seq_len, head_dim, passes=4 if carry else 7),
      name='realformer_attention_bwd' if carry else 'flash_attention_bwd',
  )(q, k, v, do, lse, delta, acc if carry else None, g_acc if carry else None, bias, fparams,
    iparams)


def _flops_metadata(batch, heads, seq_len, head_dim, passes: int) -> dict:
  """Matmul FLOPs of the kernel (`passes` [L, L] x [L, K] products per (b, h)), in the
  custom call's backend config: XLA's GPU cost model does not see inside a Triton kernel, so
  the roofline estimator reads them from here."""
  return {'flops': str(2 * passes * batch * heads * seq_len * seq_len * head_dim)}

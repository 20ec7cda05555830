"""Residual attention from the stacked queries and keys (residual_carry='qk'): Triton kernels.

The same attention as the residual kernels of attention.py beside this file, but the carried sum
is never read or written: each score tile is rebuilt in registers from the queries and keys of
layers 0..l (qk_reference.py, tile_math.summed_scores), l a traced scalar read by the kernel, so
one kernel serves every layer of a rolled nn.scan.

forward   grid (query blocks, B, H): for each key block, acc = sum_{i<=l} scale q_i k_i^T
          (l + 1 tile products), then the online softmax, dropout and P V of
          attention.py beside this file. Writes the output and the row statistics; not the dropout
          mask (that kernel's one bit per score element would be the one [L, L]-sized
          buffer of this carry: the backward draws the mask again, as the Mosaic kernels
          do, for ~32 integer ops per score element).
backward  grid (key blocks, B, H): a program owns key rows jk of every layer and walks the
          query blocks: rebuilds acc, p, dz, dV += p^T dO, and for every layer i <= l adds
          ds K_i into dQ_i (atomic adds: programs of other key blocks share the rows) and
          ds^T Q_i into dK_i (its own rows: read, add, write), ds = dz inv_div scale. The
          gradient of the whole float32 stack [2, N, B, L, H, K] is updated in place over the
          cotangent it is given (the layers above's contributions).
Matmuls per score element of layer l: forward (l + 1) + 1, backward 3 (l + 1) + 2, i.e.
(4 + 2l) K and (10 + 6l) K FLOPs against 4 K and 10 K for the carried-sum kernels. The
stated cost (`_cost_metadata`) is per call site and a rolled scan's one call site runs every
layer, so it counts the mean layer of the stack, l + 1 = (N + 1) / 2.
The stack holds float32 values of tensors computed in the compute dtype (exact); tiles are
cast back to it for the matmuls, as the carried-sum kernels multiply q and k in it.
Not yet tuned on a GPU (these kernels have run in interpret mode and compiled deviceless
only). Where they may fall short of compute-bound: each layer's q / k tile is re-read per tile
product (float32: twice the bytes of a 16-bit stack), and the backward's per-layer dK_i
read-add-write and dQ_i atomic adds move ~16 K / block bytes per score element and layer
through L2 (~16 FLOPs per byte at 64-wide tiles). The stated bytes count HBM traffic only,
as triton_attention.py's do.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from realformer_jax.kernels import tile_math as tm
from realformer_jax.kernels.backends.triton.attention import (
  HASH_OPS_PER_ELEMENT,
  _compiler_params,
  _cost_metadata,
  _draw_keep,
)
from realformer_jax.kernels.spec import KernelSpec


def _stack_spec(layers: int, seq_len: int, head_dim: int) -> pl.BlockSpec:
  """One (batch, head)'s queries and keys of every layer, [2, N, L, K] (grid (_, b, h))."""
  return pl.BlockSpec(
    (2, layers, None, seq_len, None, head_dim), lambda _, b, h: (0, 0, b, 0, h, 0)
  )


def _rows_spec(seq_len: int, head_dim: int) -> pl.BlockSpec:
  return pl.BlockSpec((None, seq_len, None, head_dim), lambda _, b, h: (b, 0, h, 0))


def _tile_scores(stack_ref, layers, qs, ks, scale, dtype, shape):
  return tm.summed_scores(
    lambda i: stack_ref[0, i, qs, :].astype(dtype),
    lambda i: stack_ref[1, i, ks, :].astype(dtype),
    layers,
    scale,
    shape,
  )


def _forward_kernel(
  stack_ref, v_ref, bias_ref, f_ref, i_ref, l_ref, o_ref, m_ref, log_l_ref, *, spec
):
  _, _, seq_len, head_dim = stack_ref.shape
  block_q, block_k = spec.block_q, spec.block_k
  iq, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  qs = pl.ds(pl.multiple_of(iq * block_q, block_q), block_q)
  scale, inv_div = f_ref[0], f_ref[1]
  layers = l_ref[0] + 1
  dtype = v_ref.dtype

  def body(j, state):
    ks = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
    acc = _tile_scores(stack_ref, layers, qs, ks, scale, dtype, (block_q, block_k))
    z = tm.softmax_input(acc, inv_div, bias_ref[ks][None, :])
    keep = None
    if spec.dropout:
      keep = _draw_keep(spec, i_ref, b, h, seq_len, iq * block_q, j * block_k, (block_q, block_k))
    return tm.online_softmax_step(state, z, v_ref[ks, :], keep, spec.keep_prob)

  state = lax.fori_loop(0, seq_len // block_k, body, tm.initial_state(block_q, head_dim))
  out, (m, log_l) = tm.finish(state)
  o_ref[...] = out.astype(o_ref.dtype)
  m_ref[...] = m[:, 0]
  log_l_ref[...] = log_l[:, 0]


def _stated_cost(spec, stack, forward: bool) -> dict:
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  elements = batch * heads * seq_len * seq_len
  mean_layers = (layers + 1) / 2  # the mean l + 1 over the stack (module docstring)
  rows = batch * seq_len * heads * head_dim * 2  # one [B, L, H, K] array in 16 bits
  if forward:
    return _cost_metadata(
      elements,
      head_dim,
      seq_len,
      passes=mean_layers + 1,
      score_bytes=0,
      row_bytes=2 * mean_layers * 2 * rows + 2 * rows,  # float32 q, k of l + 1 layers; v, out
      float_ops=8 + mean_layers + 2 * spec.dropout,
      exps=1,
      int_ops=HASH_OPS_PER_ELEMENT + 2 if spec.dropout else 0,
    )
  return _cost_metadata(
    elements,
    head_dim,
    seq_len,
    passes=3 * mean_layers + 2,
    score_bytes=0,
    # q, k of l + 1 layers (float32) read, their float32 gradients read and written; v, dO
    # in, dV out
    row_bytes=6 * mean_layers * 2 * rows + 3 * rows,
    float_ops=14 + mean_layers + 4 * spec.dropout,
    exps=1,
    int_ops=HASH_OPS_PER_ELEMENT + 2 if spec.dropout else 0,
  )


def forward(stack, v, bias, fparams, iparams, layer, spec: KernelSpec):
  """(out [B, L, H, K], lse = (m, log l) [B, H, L] float32 each, None: no stored dropout
  mask). stack: float32 [2, N, B, L, H, K]; layer: int32 [1]."""
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  block_q = spec.block_q
  in_specs = [
    _stack_spec(layers, seq_len, head_dim),
    _rows_spec(seq_len, head_dim),
    pl.BlockSpec((None, seq_len), lambda i, b, h: (b, 0)),
    pl.BlockSpec((None, 2), lambda i, b, h: (b, 0)),
    pl.BlockSpec((4,), lambda i, b, h: (0,)),
    pl.BlockSpec((1,), lambda i, b, h: (0,)),
  ]
  out_shape = [
    jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), v.dtype),
    jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32),
    jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32),
  ]
  out_specs = [
    pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, i, h, 0)),
    pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i)),
    pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i)),
  ]
  out, m, log_l = pl.pallas_call(
    functools.partial(_forward_kernel, spec=spec),
    grid=(seq_len // block_q, batch, heads),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    interpret=spec.interpret,
    compiler_params=_compiler_params(head_dim),
    metadata=_stated_cost(spec, stack, forward=True),
    name='realformer_qk_attention_fwd',
  )(stack, v, bias, fparams, iparams, layer)
  return out, (m, log_l), None


def _backward_kernel(
  stack_ref,
  v_ref,
  do_ref,
  m_ref,
  log_l_ref,
  delta_ref,
  bias_ref,
  f_ref,
  i_ref,
  l_ref,
  _,
  dv_ref,
  g_ref,
  *,
  spec: KernelSpec,
):
  _, _, seq_len, head_dim = stack_ref.shape
  block = spec.block_bwd
  jk, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  scale, inv_div = f_ref[0], f_ref[1]
  layers = l_ref[0] + 1
  dtype = v_ref.dtype
  ks = pl.ds(pl.multiple_of(jk * block, block), block)
  v, bias_row = v_ref[ks, :], bias_ref[ks][None, :]

  def q_body(i, dv):
    qs = pl.ds(pl.multiple_of(i * block, block), block)
    do = do_ref[qs, :]
    acc = _tile_scores(stack_ref, layers, qs, ks, scale, dtype, (block, block))
    z = tm.softmax_input(acc, inv_div, bias_row)
    keep = None
    if spec.dropout:
      keep = _draw_keep(spec, i_ref, b, h, seq_len, i * block, jk * block, (block, block))
    p_dropped, dz = tm.score_gradient(
      z,
      (m_ref[qs][:, None], log_l_ref[qs][:, None]),
      delta_ref[qs][:, None],
      do,
      v,
      keep,
      spec.keep_prob,
    )
    ds = (dz * inv_div * scale).astype(dtype)  # d (q_i k_i^T), the same for every layer

    def layer_body(n, carry):
      q_n = stack_ref[0, n, qs, :].astype(dtype)
      k_n = stack_ref[1, n, ks, :].astype(dtype)
      plgpu.atomic_add(g_ref, (jnp.int32(0), n, qs, slice(None)), tm.dot(ds, k_n))
      g_ref[1, n, ks, :] = g_ref[1, n, ks, :] + tm.t_dot(ds, q_n)
      return carry

    lax.fori_loop(0, layers, layer_body, None)
    return dv + tm.t_dot(p_dropped, do)

  dv = lax.fori_loop(0, seq_len // block, q_body, jnp.zeros((block, head_dim), jnp.float32))
  dv_ref[...] = dv.astype(dv_ref.dtype)


def backward(
  stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec: KernelSpec
):
  """(dV [B, L, H, K], g_stack + this layer's gradient of every stacked q_i, k_i, i <= l:
  float32 [2, N, B, L, H, K], in place over `g_stack`). The dropout mask is drawn again from
  `iparams`' key words (`bits` is None from this module's forward)."""
  del bits
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  block = spec.block_bwd
  stat_spec = pl.BlockSpec((None, None, seq_len), lambda j, b, h: (b, h, 0))
  stack_spec = _stack_spec(layers, seq_len, head_dim)
  in_specs = [
    stack_spec,
    _rows_spec(seq_len, head_dim),
    _rows_spec(seq_len, head_dim),
    stat_spec,
    stat_spec,
    stat_spec,
    pl.BlockSpec((None, seq_len), lambda j, b, h: (b, 0)),
    pl.BlockSpec((None, 2), lambda j, b, h: (b, 0)),
    pl.BlockSpec((4,), lambda j, b, h: (0,)),
    pl.BlockSpec((1,), lambda j, b, h: (0,)),
    stack_spec,
  ]
  out_shape = [
    jax.ShapeDtypeStruct(v.shape, v.dtype),
    jax.ShapeDtypeStruct(stack.shape, jnp.float32),
  ]
  out_specs = [
    pl.BlockSpec((None, block, None, head_dim), lambda j, b, h: (b, j, h, 0)),
    stack_spec,
  ]
  g_input = 10
  return pl.pallas_call(
    functools.partial(_backward_kernel, spec=spec),
    grid=(seq_len // block, batch, heads),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    interpret=spec.interpret,
    compiler_params=_compiler_params(head_dim),
    input_output_aliases={g_input: 1},
    metadata=_stated_cost(spec, stack, forward=False),
    name='realformer_qk_attention_bwd',
  )(stack, v, do, *lse, delta, bias, fparams, iparams, layer, g_stack.astype(jnp.float32))

"""Fused attention kernels for TPUs (Pallas on Mosaic).

The same computation as triton_attention.py (see its docstring and tile_math.py), moved the
TPU way: every tile is a grid step whose inputs the pipeline brings into VMEM, running state
lives in VMEM scratch across the innermost ("arbitrary") grid axis, and q, k, v are laid out
[B, H, L, K] so that a tile's last two dimensions are (rows, head_dim).

forward   grid (B, H, query blocks, key blocks): online softmax across key blocks; with
          residual attention each step reads the acc_{l-1} tile and writes the acc_l tile.
dkv       grid (B, H, key blocks, query blocks): dK, dV accumulate across query blocks; with
          residual attention each step reads acc_l and g_l tiles and writes g_{l-1} (and
          acc_{l-1} when rebuilding); dQ is then one matmul outside (fused.py).
dq        grid (B, H, query blocks, key blocks), without residual attention only.

Dropout uses `keep_tile_selected` (one hash per element: Mosaic cannot lower the joined
layout), the same mask as the einsum path. Row statistics are stored [B, H, L, 1].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from realformer_jax.kernels.dropout.dropout_bits import attention_row, mulhi_limbs
from realformer_jax.kernels.dropout.dropout_tiles import keep_tile_selected
from realformer_jax.kernels.plumbing import tile_math as tm
from realformer_jax.kernels.plumbing.spec import KernelSpec

_SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)


def _keep(spec: KernelSpec, i_ref, b, h, seq_len, q0, k0, shape):
  if not spec.dropout:
    return None
  words = [i_ref[n].astype(jnp.uint32) for n in range(4)]
  batch, head = words[2] + b.astype(jnp.uint32), words[3] + h.astype(jnp.uint32)
  row0 = attention_row(batch, head, q0.astype(jnp.uint32), spec.heads_total, seq_len)
  # philox's multiply high words from 16-bit limbs: Mosaic lowers no 32 x 32 -> 64-bit product
  return keep_tile_selected(
    words[0], words[1], row0, k0, shape, spec.keep_threshold, spec.generator, mulhi_limbs
  )


def _heads_major(x):
  return jnp.swapaxes(x, 1, 2)  # [B, L, H, K] <-> [B, H, L, K]


def _split_heads_major(qkv):
  """[B, L, 3, H, K] -> q, k, v each [B, H, L, K] (Mosaic tiles want (rows, K) last)."""
  return tuple(jnp.transpose(qkv[:, :, part], (0, 2, 1, 3)) for part in range(3))


def _cost(spec, batch, heads, seq_len, head_dim, passes, score_tensors, itemsize):
  """Matmul FLOPs, exps and HBM bytes of a kernel, for XLA's TPU cost model."""
  elements = batch * heads * seq_len * seq_len
  rows = batch * heads * seq_len * head_dim * itemsize
  blocks = max(seq_len // spec.block_q, 1)
  return pl.CostEstimate(
    flops=2 * passes * elements * head_dim,
    transcendentals=elements,
    bytes_accessed=4 * score_tensors * elements + (2 + 2 * blocks) * rows,
  )


def _compiler_params():
  return pltpu.CompilerParams(dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary'))


def _forward_kernel(
  f_ref,
  i_ref,
  q_ref,
  k_ref,
  v_ref,
  acc_in_ref,
  bias_ref,
  o_ref,
  lse_m_ref,
  lse_log_l_ref,
  acc_out_ref,
  m_scratch,
  l_scratch,
  o_scratch,
  *,
  spec: KernelSpec,
  seq_len: int,
):
  b, h, i, j = (pl.program_id(n) for n in range(4))
  block_q, block_k = spec.block_q, spec.block_k

  @pl.when(j == 0)
  def _start():
    m, l, o = tm.initial_state(*o_scratch.shape)
    m_scratch[...], l_scratch[...], o_scratch[...] = m, l, o

  if spec.sum_given:
    acc = acc_in_ref[...]
  else:
    acc = tm.scores(q_ref[...], k_ref[...], f_ref[b, 0])
    if spec.carry_in:
      acc = acc_in_ref[...] + acc
    if spec.carry_out:
      acc_out_ref[...] = acc
  z = tm.softmax_input(acc, f_ref[b, 1], bias_ref[...])
  keep = _keep(spec, i_ref, b, h, seq_len, i * block_q, j * block_k, (block_q, block_k))
  m, l, o = tm.online_softmax_step(
    (m_scratch[...], l_scratch[...], o_scratch[...]), z, v_ref[...], keep, spec.keep_prob
  )
  m_scratch[...], l_scratch[...], o_scratch[...] = m, l, o

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    out, (lse_m, lse_log_l) = tm.finish((m, l, o))
    o_ref[...] = out.astype(o_ref.dtype)
    lse_m_ref[...] = lse_m
    lse_log_l_ref[...] = lse_log_l


def forward(qkv, acc_in, bias, fparams, iparams, spec: KernelSpec):
  """(out [B, L, H, K], lse = (m, log l) [B, H, L, 1] float32 each, acc_out [B, H, L, L]
  float32 or None)."""
  batch, seq_len, _, heads, head_dim = qkv.shape
  qh, kh, vh = _split_heads_major(qkv)
  block_q, block_k = spec.block_q, spec.block_k
  grid = (batch, heads, seq_len // block_q, seq_len // block_k)
  q_spec = pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i, j: (b, h, i, 0))
  kv_spec = pl.BlockSpec((None, None, block_k, head_dim), lambda b, h, i, j: (b, h, j, 0))
  acc_spec = pl.BlockSpec((None, None, block_q, block_k), lambda b, h, i, j: (b, h, i, j))
  stat_spec = pl.BlockSpec((None, None, block_q, 1), lambda b, h, i, j: (b, h, i, 0))
  writes_sum = spec.carry_out and not spec.sum_given
  in_specs = [
    _SMEM,
    _SMEM,
    q_spec,
    kv_spec,
    kv_spec,
    acc_spec if spec.carry_in else None,
    pl.BlockSpec((None, 1, block_k), lambda b, h, i, j: (b, 0, j)),
  ]
  scores_shape = jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len), jnp.float32)
  out_shape = [
    jax.ShapeDtypeStruct((batch, heads, seq_len, head_dim), qkv.dtype),
    jax.ShapeDtypeStruct((batch, heads, seq_len, 1), jnp.float32),
    jax.ShapeDtypeStruct((batch, heads, seq_len, 1), jnp.float32),
    scores_shape if writes_sum else None,
  ]
  out_specs = [q_spec, stat_spec, stat_spec, acc_spec if writes_sum else None]
  scratch = [
    pltpu.VMEM((block_q, 1), jnp.float32),
    pltpu.VMEM((block_q, 1), jnp.float32),
    pltpu.VMEM((block_q, head_dim), jnp.float32),
  ]
  out, lse_m, lse_log_l, acc_out = pl.pallas_call(
    functools.partial(_forward_kernel, spec=spec, seq_len=seq_len),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=grid,
      in_specs=in_specs,
      out_specs=out_specs,
      scratch_shapes=scratch,
    ),
    out_shape=out_shape,
    compiler_params=_compiler_params(),
    interpret=spec.interpret,
    input_output_aliases={5: 3} if writes_sum and spec.carry_in else {},  # in place
    cost_estimate=_cost(
      spec,
      batch,
      heads,
      seq_len,
      head_dim,
      1 if spec.sum_given else 2,
      int(spec.carry_in) + int(writes_sum),
      qkv.dtype.itemsize,
    ),
    name='realformer_attention_fwd' if spec.carry_out else 'flash_attention_fwd',
  )(fparams, _int_words(iparams), qh, kh, vh, acc_in if spec.carry_in else None, bias[:, None, :])
  # The backward draws the mask again: no bits.
  return _heads_major(out), (lse_m, lse_log_l), acc_out, None


def _int_words(iparams):
  return jax.lax.bitcast_convert_type(iparams, jnp.int32)  # SMEM holds 32-bit signed words


def _dkv_kernel(
  f_ref,
  i_ref,
  q_ref,
  k_ref,
  v_ref,
  do_ref,
  lse_m_ref,
  lse_log_l_ref,
  delta_ref,
  acc_ref,
  g_acc_ref,
  bias_ref,
  dk_ref,
  dv_ref,
  g_acc_in_ref,
  acc_in_ref,
  dk_scratch,
  dv_scratch,
  *,
  spec: KernelSpec,
  seq_len: int,
  rebuild: bool,
):
  b, h, j, i = (pl.program_id(n) for n in range(4))
  block = spec.block_bwd

  @pl.when(i == 0)
  def _start():
    dk_scratch[...] = jnp.zeros_like(dk_scratch)
    dv_scratch[...] = jnp.zeros_like(dv_scratch)

  scale, inv_div = f_ref[b, 0], f_ref[b, 1]
  q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
  s = tm.scores(q, k, scale)
  acc = acc_ref[...] if spec.carry_out else s
  z = tm.softmax_input(acc, inv_div, bias_ref[...])
  keep = _keep(spec, i_ref, b, h, seq_len, i * block, j * block, (block, block))
  lse = (lse_m_ref[...], lse_log_l_ref[...])
  p_dropped, dz = tm.score_gradient(z, lse, delta_ref[...], do, v, keep, spec.keep_prob)
  g = dz * inv_div
  if spec.carry_out:
    g = g_acc_ref[...] + g
    g_acc_in_ref[...] = g
    if rebuild:
      acc_in_ref[...] = acc - s
  dv_scratch[...] += tm.t_dot(p_dropped, do)
  dk_scratch[...] += tm.t_dot((g * scale).astype(q.dtype), q)

  @pl.when(i == pl.num_programs(3) - 1)
  def _finish():
    dk_ref[...] = dk_scratch[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_scratch[...].astype(dv_ref.dtype)


def _dq_kernel(
  f_ref,
  i_ref,
  q_ref,
  k_ref,
  v_ref,
  do_ref,
  lse_m_ref,
  lse_log_l_ref,
  delta_ref,
  bias_ref,
  dq_ref,
  dq_scratch,
  *,
  spec: KernelSpec,
  seq_len: int,
):
  b, h, i, j = (pl.program_id(n) for n in range(4))
  block = spec.block_bwd

  @pl.when(j == 0)
  def _start():
    dq_scratch[...] = jnp.zeros_like(dq_scratch)

  scale, inv_div = f_ref[b, 0], f_ref[b, 1]
  q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
  z = tm.softmax_input(tm.scores(q, k, scale), inv_div, bias_ref[...])
  keep = _keep(spec, i_ref, b, h, seq_len, i * block, j * block, (block, block))
  lse = (lse_m_ref[...], lse_log_l_ref[...])
  _, dz = tm.score_gradient(z, lse, delta_ref[...], do, v, keep, spec.keep_prob)
  dq_scratch[...] += tm.dot((dz * inv_div * scale).astype(k.dtype), k)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    dq_ref[...] = dq_scratch[...].astype(dq_ref.dtype)


def backward(
  qkv,
  do,
  lse,
  delta,
  acc,
  g_acc,
  bias,
  fparams,
  iparams,
  bits,
  spec: KernelSpec,
  rebuild: bool = False,
):
  """(dqkv [B, L, 3, H, K], g_acc_in or None, acc_in or None), like the Triton backward.
  `lse` is (m, log l), [B, H, L, 1] each (this module's forward), `delta` [B, H, L]. No
  atomics on a TPU: dQ comes from a second kernel, which reads the carried gradient the first
  one wrote (residual attention) or recomputes p (without)."""
  del bits  # None: Mosaic cannot pack bits along lanes; the mask is drawn again
  batch, seq_len, _, heads, head_dim = qkv.shape
  block = spec.block_bwd
  n = seq_len // block
  carry = spec.carry_out
  qh, kh, vh = _split_heads_major(qkv)
  doh = _heads_major(do)
  dtype = qkv.dtype
  delta = delta[..., None]
  words = _int_words(iparams)
  bias3 = bias[:, None, :]

  # dK, dV (and the carried gradient): grid (B, H, key block j, query block i).
  row_q = pl.BlockSpec((None, None, block, head_dim), lambda b, h, j, i: (b, h, i, 0))
  row_k = pl.BlockSpec((None, None, block, head_dim), lambda b, h, j, i: (b, h, j, 0))
  stat_q = pl.BlockSpec((None, None, block, 1), lambda b, h, j, i: (b, h, i, 0))
  tile = pl.BlockSpec((None, None, block, block), lambda b, h, j, i: (b, h, i, j))
  scores_shape = jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len), jnp.float32)
  dk, dv, g_acc_in, acc_in = pl.pallas_call(
    functools.partial(_dkv_kernel, spec=spec, seq_len=seq_len, rebuild=rebuild),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=(batch, heads, n, n),
      in_specs=[
        _SMEM,
        _SMEM,
        row_q,
        row_k,
        row_k,
        row_q,
        stat_q,
        stat_q,
        stat_q,
        tile if carry else None,
        tile if carry else None,
        pl.BlockSpec((None, 1, block), lambda b, h, j, i: (b, 0, j)),
      ],
      out_specs=[row_k, row_k, tile if carry else None, tile if carry and rebuild else None],
      scratch_shapes=[pltpu.VMEM((block, head_dim), jnp.float32)] * 2,
    ),
    out_shape=[
      jax.ShapeDtypeStruct(kh.shape, dtype),
      jax.ShapeDtypeStruct(vh.shape, dtype),
      scores_shape if carry else None,
      scores_shape if carry and rebuild else None,
    ],
    compiler_params=_compiler_params(),
    interpret=spec.interpret,
    input_output_aliases=({10: 2, 9: 3} if rebuild else {10: 2}) if carry else {},
    cost_estimate=_cost(
      spec, batch, heads, seq_len, head_dim, 4, (3 + int(rebuild)) if carry else 0, dtype.itemsize
    ),
    name='realformer_attention_dkv' if carry else 'flash_attention_dkv',
  )(
    fparams,
    words,
    qh,
    kh,
    vh,
    doh,
    *lse,
    delta,
    acc if carry else None,
    g_acc if carry else None,
    bias3,
  )
  dq = jnp.zeros_like(qh)
  if not carry:
    row_i = pl.BlockSpec((None, None, block, head_dim), lambda b, h, i, j: (b, h, i, 0))
    row_j = pl.BlockSpec((None, None, block, head_dim), lambda b, h, i, j: (b, h, j, 0))
    stat_i = pl.BlockSpec((None, None, block, 1), lambda b, h, i, j: (b, h, i, 0))
    dq = pl.pallas_call(
      functools.partial(_dq_kernel, spec=spec, seq_len=seq_len),
      grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0,
        grid=(batch, heads, n, n),
        in_specs=[
          _SMEM,
          _SMEM,
          row_i,
          row_j,
          row_j,
          row_i,
          stat_i,
          stat_i,
          stat_i,
          pl.BlockSpec((None, 1, block), lambda b, h, i, j: (b, 0, j)),
        ],
        out_specs=row_i,
        scratch_shapes=[pltpu.VMEM((block, head_dim), jnp.float32)],
      ),
      out_shape=jax.ShapeDtypeStruct(qh.shape, dtype),
      compiler_params=_compiler_params(),
      interpret=spec.interpret,
      cost_estimate=_cost(spec, batch, heads, seq_len, head_dim, 3, 0, dtype.itemsize),
      name='flash_attention_dq',
    )(fparams, words, qh, kh, vh, doh, *lse, delta, bias3)
  dqkv = jnp.stack([jnp.transpose(x, (0, 2, 1, 3)) for x in (dq, dk, dv)], axis=2)
  if carry:  # dQ = scale d acc_{l-1} K from the gradient just written
    dqkv = query_gradient(g_acc_in, qkv, fparams, dqkv, spec)
  return dqkv, g_acc_in, acc_in


def _query_gradient_kernel(f_ref, g_ref, k_ref, dq_ref, dq_scratch):
  b, j = pl.program_id(0), pl.program_id(3)

  @pl.when(j == 0)
  def _start():
    dq_scratch[...] = jnp.zeros_like(dq_scratch)

  k = k_ref[...]
  dq_scratch[...] += tm.dot((g_ref[...] * f_ref[b, 0]).astype(k.dtype), k)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    dq_ref[...] = dq_scratch[...].astype(dq_ref.dtype)


def query_gradient(g, qkv, fparams, dqkv, spec: KernelSpec):
  """dqkv with its dQ part = scale g K, from the float32 score gradient g [B, H, L, L]."""
  batch, seq_len, _, heads, head_dim = qkv.shape
  block_q, block_k = spec.block_q, spec.block_k
  kh = _split_heads_major(qkv)[1]
  dq = pl.pallas_call(
    _query_gradient_kernel,
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=(batch, heads, seq_len // block_q, seq_len // block_k),
      in_specs=[
        _SMEM,
        pl.BlockSpec((None, None, block_q, block_k), lambda b, h, i, j: (b, h, i, j)),
        pl.BlockSpec((None, None, block_k, head_dim), lambda b, h, i, j: (b, h, j, 0)),
      ],
      out_specs=pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i, j: (b, h, i, 0)),
      scratch_shapes=[pltpu.VMEM((block_q, head_dim), jnp.float32)],
    ),
    out_shape=jax.ShapeDtypeStruct(kh.shape, qkv.dtype),
    compiler_params=_compiler_params(),
    interpret=spec.interpret,
    cost_estimate=_cost(spec, batch, heads, seq_len, head_dim, 1, 1, qkv.dtype.itemsize),
    name='realformer_attention_dq',
  )(fparams, g, kh)
  return dqkv.at[:, :, 0].set(_heads_major(dq))

"""Residual attention from the stacked queries and keys (residual_carry='qk'): Mosaic (TPU).

The computation of backends/triton/qk_attention.py (see its docstring and qk_reference.py),
moved the TPU way (attention.py beside this file): grid steps whose blocks the pipeline brings
into VMEM, running state in VMEM scratch across the innermost ("arbitrary") axis, and a
heads-major layout: the op transposes the stack to [2, N, B, H, L, K] on the way in and the
gradients back on the way out (O(N L) traffic per layer, small next to the (l + 1)-fold score
work at the lengths this carry is for). A step's block holds a tile of every layer's queries
(keys); the layer bound l is a scalar in SMEM, so slots above it are brought in but never
multiplied. Those blocks are N times a carried-sum kernel's, so the tiles shrink with depth
(`fit_blocks`); checked by deviceless v5e compiles of 12, 24 and 36 layers at L = 4,096.

forward   grid (B, H, query blocks, key blocks): acc = sum_{i<=l} scale q_i k_i^T, then the
          online softmax, dropout (keep_tile_selected, drawn again in the backward) and P V.
dkv       grid (B, H, key blocks, query blocks): dV and every layer's dK_i (scratch [N, rows,
          K]) accumulate across query blocks.
dq        grid (B, H, query blocks, key blocks): every layer's dQ_i across key blocks (no
          atomics on a TPU: a second kernel rebuilds the tile).
Matmuls per score element of layer l: forward (l + 1) + 1; backward 4 (l + 1) + 3 (both
kernels rebuild the tile and dO V^T), i.e. (14 + 8l) K FLOPs where the Triton backward has
(10 + 6l) K. Stated costs count the stack's mean layer, l + 1 = (N + 1) / 2.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from realformer_jax.kernels.backends.mosaic.attention import _SMEM, _heads_major, _int_words, _keep
from realformer_jax.kernels.plumbing import tile_math as tm
from realformer_jax.kernels.plumbing.spec import KernelSpec

# VMEM: a block of every layer's rows is N times a carried-sum kernel's, so the tiles shrink
# with depth to stay within this share of the default 16 MiB scoped limit; where the smallest
# (128 rows) still does not fit, the kernels ask for a higher limit (v4: 32 MiB of VMEM, later
# chips 95-128 MiB).
VMEM_BUDGET = 12 * 2**20
_VMEM_SLACK = 8 * 2**20  # the small blocks (v, dO, statistics, bias) and Mosaic's own


def _row_bytes(layers: int, head_dim: int) -> int:
  # K padded to 128 lanes; 4 bytes: a float32 stack, or a 16-bit one's tiles widened to
  # float32 (8, 128) layouts and the float32 gradient scratch
  return layers * (-(-head_dim // 128) * 128) * 4


def vmem_need(layers: int, head_dim: int, block_q: int, block_k: int, block_bwd: int) -> int:
  """Bytes of the stacked-layer blocks ([N, rows, K] each), double-buffered: forward q and k;
  backward q, k and the gradient out, plus one scratch."""
  row = _row_bytes(layers, head_dim)
  return max(2 * row * (block_q + block_k), 7 * row * block_bwd)


def _halved(block: int) -> int:
  return block // 2 if block % 256 == 0 else block  # stays a multiple of 128 dividing L


def fit_blocks(spec: KernelSpec, layers: int, seq_len: int, head_dim: int) -> KernelSpec:
  """`spec` with tiles halved (down to 128) until the stacked blocks fit VMEM_BUDGET;
  interpret mode keeps its tiles."""
  del seq_len  # the plan's tiles divide it, and so do their halves
  if spec.interpret:
    return spec
  row = _row_bytes(layers, head_dim)
  block_q, block_k, block_bwd = spec.block_q, spec.block_k, spec.block_bwd
  while 2 * row * (block_q + block_k) > VMEM_BUDGET:
    if _halved(block_k) != block_k and (block_k >= block_q or _halved(block_q) == block_q):
      block_k = _halved(block_k)
    elif _halved(block_q) != block_q:
      block_q = _halved(block_q)
    else:
      break
  while 7 * row * block_bwd > VMEM_BUDGET and _halved(block_bwd) != block_bwd:
    block_bwd = _halved(block_bwd)
  return dataclasses.replace(spec, block_q=block_q, block_k=block_k, block_bwd=block_bwd)


def vmem_limit(spec: KernelSpec, layers: int, head_dim: int) -> Optional[int]:
  need = vmem_need(layers, head_dim, spec.block_q, spec.block_k, spec.block_bwd)
  return None if need <= VMEM_BUDGET else need + _VMEM_SLACK


def _compiler_params(spec: KernelSpec, layers: int, head_dim: int):
  return pltpu.CompilerParams(
    dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary'),
    vmem_limit_bytes=vmem_limit(spec, layers, head_dim),
  )


def _stack_heads_major(stack):
  return jnp.transpose(stack, (0, 1, 2, 4, 3, 5))  # [2, N, B, L, H, K] <-> [2, N, B, H, L, K]


def _part_spec(part: int, layers: int, rows: int, head_dim: int, index_of_rows) -> pl.BlockSpec:
  """Rows of every layer's queries (part 0) or keys (part 1): a [N, rows, K] block."""
  return pl.BlockSpec(
    (None, layers, None, None, rows, head_dim),
    lambda b, h, x, y: (part, 0, b, h, index_of_rows(x, y), 0),
  )


def _cost(stack, passes: float, itemsize: int) -> pl.CostEstimate:
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  elements = batch * heads * seq_len * seq_len
  rows = batch * heads * seq_len * head_dim
  return pl.CostEstimate(
    flops=int(2 * passes * elements * head_dim),
    transcendentals=elements,
    bytes_accessed=int(stack.dtype.itemsize * 2 * layers * rows + 4 * itemsize * rows),
  )


def _tile_scores(q_ref, k_ref, layers, scale, dtype):
  return tm.summed_scores(
    lambda n: q_ref[n].astype(dtype),
    lambda n: k_ref[n].astype(dtype),
    layers,
    scale,
    (q_ref.shape[1], k_ref.shape[1]),
  )


def _forward_kernel(
  f_ref,
  i_ref,
  l_ref,
  q_ref,
  k_ref,
  v_ref,
  bias_ref,
  o_ref,
  lse_m_ref,
  lse_log_l_ref,
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

  acc = _tile_scores(q_ref, k_ref, l_ref[0] + 1, f_ref[b, 0], v_ref.dtype)
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


def forward(stack, v, bias, fparams, iparams, layer, spec: KernelSpec):
  """(out [B, L, H, K], lse = (m, log l) [B, H, L, 1] float32 each, None: no stored mask)."""
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  block_q, block_k = spec.block_q, spec.block_k
  row_q = pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i, j: (b, h, i, 0))
  stat_spec = pl.BlockSpec((None, None, block_q, 1), lambda b, h, i, j: (b, h, i, 0))
  out, lse_m, lse_log_l = pl.pallas_call(
    functools.partial(_forward_kernel, spec=spec, seq_len=seq_len),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=(batch, heads, seq_len // block_q, seq_len // block_k),
      in_specs=[
        _SMEM,
        _SMEM,
        _SMEM,
        _part_spec(0, layers, block_q, head_dim, lambda i, j: i),
        _part_spec(1, layers, block_k, head_dim, lambda i, j: j),
        pl.BlockSpec((None, None, block_k, head_dim), lambda b, h, i, j: (b, h, j, 0)),
        pl.BlockSpec((None, 1, block_k), lambda b, h, i, j: (b, 0, j)),
      ],
      out_specs=[row_q, stat_spec, stat_spec],
      scratch_shapes=[
        pltpu.VMEM((block_q, 1), jnp.float32),
        pltpu.VMEM((block_q, 1), jnp.float32),
        pltpu.VMEM((block_q, head_dim), jnp.float32),
      ],
    ),
    out_shape=[
      jax.ShapeDtypeStruct((batch, heads, seq_len, head_dim), v.dtype),
      jax.ShapeDtypeStruct((batch, heads, seq_len, 1), jnp.float32),
      jax.ShapeDtypeStruct((batch, heads, seq_len, 1), jnp.float32),
    ],
    compiler_params=_compiler_params(spec, layers, head_dim),
    interpret=spec.interpret,
    cost_estimate=_cost(stack, (layers + 1) / 2 + 1, v.dtype.itemsize),
    name='realformer_qk_attention_fwd',
  )(
    fparams,
    _int_words(iparams),
    layer,
    _stack_heads_major(stack),
    _stack_heads_major(stack),
    _heads_major(v),
    bias[:, None, :],
  )
  return _heads_major(out), (lse_m, lse_log_l), None


def _score_gradient(f_ref, i_ref, l_ref, q_ref, k_ref, v_ref, do_ref, stats, bias_ref, spec, ij):
  """(p dropped, ds = d (q_i k_i^T)) of one tile: the same for every layer i."""
  b, h = pl.program_id(0), pl.program_id(1)
  i, j = ij
  block = spec.block_bwd
  dtype = v_ref.dtype
  scale, inv_div = f_ref[b, 0], f_ref[b, 1]
  acc = _tile_scores(q_ref, k_ref, l_ref[0] + 1, scale, dtype)
  z = tm.softmax_input(acc, inv_div, bias_ref[...])
  keep = _keep(spec, i_ref, b, h, stats[3], i * block, j * block, (block, block))
  lse = (stats[0][...], stats[1][...])
  p_dropped, dz = tm.score_gradient(
    z, lse, stats[2][...], do_ref[...], v_ref[...], keep, spec.keep_prob
  )
  return p_dropped, (dz * inv_div * scale).astype(dtype)


def _dkv_kernel(
  f_ref,
  i_ref,
  l_ref,
  q_ref,
  k_ref,
  v_ref,
  do_ref,
  lse_m_ref,
  lse_log_l_ref,
  delta_ref,
  bias_ref,
  dk_ref,
  dv_ref,
  dk_scratch,
  dv_scratch,
  *,
  spec: KernelSpec,
  seq_len: int,
):
  j, i = pl.program_id(2), pl.program_id(3)
  dtype = v_ref.dtype

  @pl.when(i == 0)
  def _start():
    dk_scratch[...] = jnp.zeros_like(dk_scratch)
    dv_scratch[...] = jnp.zeros_like(dv_scratch)

  stats = (lse_m_ref, lse_log_l_ref, delta_ref, seq_len)
  p_dropped, ds = _score_gradient(
    f_ref, i_ref, l_ref, q_ref, k_ref, v_ref, do_ref, stats, bias_ref, spec, (i, j)
  )
  dv_scratch[...] += tm.t_dot(p_dropped, do_ref[...])

  def layer_body(n, carry):
    dk_scratch[n] = dk_scratch[n] + tm.t_dot(ds, q_ref[n].astype(dtype))
    return carry

  jax.lax.fori_loop(0, l_ref[0] + 1, layer_body, None)

  @pl.when(i == pl.num_programs(3) - 1)
  def _finish():
    dk_ref[...] = dk_scratch[...]
    dv_ref[...] = dv_scratch[...].astype(dv_ref.dtype)


def _dq_kernel(
  f_ref,
  i_ref,
  l_ref,
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
  i, j = pl.program_id(2), pl.program_id(3)
  dtype = v_ref.dtype

  @pl.when(j == 0)
  def _start():
    dq_scratch[...] = jnp.zeros_like(dq_scratch)

  stats = (lse_m_ref, lse_log_l_ref, delta_ref, seq_len)
  _, ds = _score_gradient(
    f_ref, i_ref, l_ref, q_ref, k_ref, v_ref, do_ref, stats, bias_ref, spec, (i, j)
  )

  def layer_body(n, carry):
    dq_scratch[n] = dq_scratch[n] + tm.dot(ds, k_ref[n].astype(dtype))
    return carry

  jax.lax.fori_loop(0, l_ref[0] + 1, layer_body, None)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    dq_ref[...] = dq_scratch[...]


def backward(
  stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec: KernelSpec
):
  """(dV [B, L, H, K], g_stack + this layer's gradient of every stacked q_i, k_i, i <= l),
  in g_stack's dtype. The dropout mask is drawn again from `iparams`' key words
  (`bits` is None from this module's forward)."""
  del bits
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  # as forward returns them, or [B, H, L] (qk_carry.SavedAttention): one layout here
  lse = tuple(x.reshape(batch, heads, seq_len, 1) for x in lse)
  block = spec.block_bwd
  n = seq_len // block
  stack_h = _stack_heads_major(stack)
  vh, doh = _heads_major(v), _heads_major(do)
  words = _int_words(iparams)
  bias3 = bias[:, None, :]
  delta = delta[..., None]
  grads_shape = jax.ShapeDtypeStruct((layers, batch, heads, seq_len, head_dim), jnp.float32)
  grads_spec = pl.BlockSpec(
    (layers, None, None, block, head_dim), lambda b, h, x, y: (0, b, h, x, 0)
  )

  def rows(of):  # [B, H, L, K]-shaped inputs, rows picked by grid axis x (own) or y (other)
    return pl.BlockSpec((None, None, block, head_dim), lambda b, h, x, y: (b, h, of(x, y), 0))

  def stat(of):
    return pl.BlockSpec((None, None, block, 1), lambda b, h, x, y: (b, h, of(x, y), 0))

  own, other = (lambda x, y: x), (lambda x, y: y)
  bias_spec = lambda of: pl.BlockSpec((None, 1, block), lambda b, h, x, y: (b, 0, of(x, y)))

  # dK_i, dV: grid (B, H, key block x, query block y).
  dk, dv = pl.pallas_call(
    functools.partial(_dkv_kernel, spec=spec, seq_len=seq_len),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=(batch, heads, n, n),
      in_specs=[
        _SMEM,
        _SMEM,
        _SMEM,
        _part_spec(0, layers, block, head_dim, other),
        _part_spec(1, layers, block, head_dim, own),
        rows(own),
        rows(other),
        stat(other),
        stat(other),
        stat(other),
        bias_spec(own),
      ],
      out_specs=[grads_spec, rows(own)],
      scratch_shapes=[
        pltpu.VMEM((layers, block, head_dim), jnp.float32),
        pltpu.VMEM((block, head_dim), jnp.float32),
      ],
    ),
    out_shape=[grads_shape, jax.ShapeDtypeStruct(vh.shape, v.dtype)],
    compiler_params=_compiler_params(spec, layers, head_dim),
    interpret=spec.interpret,
    cost_estimate=_cost(stack, 2 * (layers + 1) / 2 + 2, v.dtype.itemsize),
    name='realformer_qk_attention_dkv',
  )(fparams, words, layer, stack_h, stack_h, vh, doh, *lse, delta, bias3)

  # dQ_i: grid (B, H, query block x, key block y).
  dq = pl.pallas_call(
    functools.partial(_dq_kernel, spec=spec, seq_len=seq_len),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=0,
      grid=(batch, heads, n, n),
      in_specs=[
        _SMEM,
        _SMEM,
        _SMEM,
        _part_spec(0, layers, block, head_dim, own),
        _part_spec(1, layers, block, head_dim, other),
        rows(other),
        rows(own),
        stat(own),
        stat(own),
        stat(own),
        bias_spec(other),
      ],
      out_specs=grads_spec,
      scratch_shapes=[pltpu.VMEM((layers, block, head_dim), jnp.float32)],
    ),
    out_shape=grads_shape,
    compiler_params=_compiler_params(spec, layers, head_dim),
    interpret=spec.interpret,
    cost_estimate=_cost(stack, 2 * (layers + 1) / 2 + 1, v.dtype.itemsize),
    name='realformer_qk_attention_dq',
  )(fparams, words, layer, stack_h, stack_h, vh, doh, *lse, delta, bias3)
  grads = _stack_heads_major(jnp.stack([dq, dk]))  # [2, N, B, H, L, K] -> [2, N, B, L, H, K]
  return _heads_major(dv), (g_stack.astype(jnp.float32) + grads).astype(g_stack.dtype)

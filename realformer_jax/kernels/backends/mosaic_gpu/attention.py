"""Fused attention kernels for Hopper GPUs (Pallas on Mosaic GPU): post / pre attention.

The same computation as the Triton kernels beside this folder (tile_math.py's notation:
s = scale Q K^T, z = s inv_div + bias, p = softmax(z), dropout keeps with keep_prob and divides
by it), moved the Hopper way: each program copies its tiles from HBM into shared memory with
TMA (`copy_gmem_to_smem`, completion on an mbarrier), and the tensor cores multiply them with
wgmma (`plgpu.wgmma`, one warpgroup: 128 threads, 64 rows a tile). Scores, probabilities and
their gradients live in registers in the wgmma accumulator's layout; only the output, the row
statistics and the gradients reach HBM.

forward   grid (H, L / block_q, B): walks the key blocks, online softmax, P V.
          Writes out [B, L, H, K] and the row statistics (m, log l) [B, H, L] float32; no
          dropout mask (the backward draws it again: `bits` None).
dkv       grid (H, L / block_bwd, B): a program owns a key block and walks the query blocks
          with the tile transposed (keys as rows): dV += drop(P)^T dO, dK += dS^T Q.
dq        grid (H, L / block_bwd, B): a program owns a query block: dQ += dS K.
Dropout draws the einsum path's mask bit for bit (`keep`: the Threefry-2x32 of each element's
global position, one hash per element as kernels/dropout_tiles.keep_tile_selected), so
switching backends does not change a run.

Not yet: warp specialisation (a producer warpgroup issuing TMA ahead while two consumer
warpgroups multiply, FlashAttention-3's scheme; jax's ops/gpu/attention_mgpu.py): each step
here waits for its copies. What these kernels take is decided by their record (the folder's
`__init__.py`): 16-bit compute, lengths a multiple of 64, no carried sum. Their speed has not
been measured on a device.

Interpret mode (`spec.interpret`: CPU tests) runs the same kernels in Mosaic GPU's interpreter,
which lacks three things, each replaced by its plain equivalent there: layout casts (a no-op),
wgmma (a float32 `dot_general` of the same tiles) and swizzled shared memory (plain tiles).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from realformer_jax.kernels.dropout.dropout_bits import (
  DRAWS_PER_HASH,
  attention_row,
  select_draw,
  threefry2x32,
)
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.kernels.plumbing.tile_math import drop

# Scalars travel through shared memory; a TMA copy moves a multiple of 128 bytes (one
# warpgroup's 4-byte lanes), so fparams' two floats and iparams' four words are padded to 32.
SCALARS = 32
_LANE_SHIFT = int(DRAWS_PER_HASH).bit_length() - 1  # column -> hash word: a shift by 3


@dataclasses.dataclass(frozen=True)
class Ops:
  """What differs between a compiled kernel and Mosaic GPU's interpreter (module docstring)."""

  interpret: bool

  def cast(self, x, layout):
    return x if self.interpret else plgpu.layout_cast(x, layout)

  def full(self, shape, value):
    layout = plgpu.Layout.WGMMA if len(shape) == 2 else plgpu.Layout.WGMMA.reduce(1)
    return self.cast(jnp.full(shape, value, jnp.float32), layout)

  def softmax_state(self, rows: int, head_dim: int):
    """(output accumulator, running max m, running sum l) of an online softmax."""
    return (self.full((rows, head_dim), 0.0), self.full((rows,), -jnp.inf), self.full((rows,), 0.0))

  def iota(self, shape, dim):
    if self.interpret:
      return lax.broadcasted_iota(jnp.int32, shape, dim)
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)

  def vector(self, smem, along: int):
    """A [n] float32 vector from shared memory, laid out to broadcast along rows (along=0: one
    value a row) or columns (along=1) of a wgmma tile."""
    if self.interpret:
      return smem[...]
    return plgpu.load(smem, (), layout=plgpu.Layout.WGMMA.reduce(1 - along))

  def mma(self, a, b_ref, transpose_b: bool = False):
    """a [m, k] (registers or shared memory) times b [k, n] (or b^T with transpose_b), float32."""
    rows = a.shape[0]
    cols = b_ref.shape[0] if transpose_b else b_ref.shape[1]
    if self.interpret:
      a = a if isinstance(a, jax.Array) else a[...]
      dims = (((1,), (1 if transpose_b else 0,)), ((), ()))
      return lax.dot_general(a, b_ref[...], dims, preferred_element_type=jnp.float32)

    def run(acc_ref):
      plgpu.wgmma(acc_ref, a, plgpu.transpose_ref(b_ref, (1, 0)) if transpose_b else b_ref)
      return acc_ref[...]

    return pl.run_scoped(run, plgpu.ACC((rows, cols), jnp.float32))

  def tile(self, rows: int, cols: int, dtype, slots: int = 0):
    """Shared memory for a [rows, cols] tile of 16-bit values ([slots, rows, cols]: several),
    128-byte swizzled (wgmma's operand layout) when compiled."""
    shape = (slots, rows, cols) if slots else (rows, cols)
    if self.interpret:
      return plgpu.SMEM(shape, dtype)
    swizzle = 128
    per_row = swizzle // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(
      shape,
      dtype,
      transforms=(plgpu.TilingTransform((8, per_row)), plgpu.SwizzleTransform(swizzle)),
    )


def keep(spec: KernelSpec, words, b, h, seq_len: int, rows, cols):
  """The einsum path's keep mask at global query rows `rows` and key columns `cols` (uint32
  arrays of one (b, h) slice): byte col % 8 of Threefry-2x32(key; (b H + h) L + row, col // 8)
  < threshold (kernels/dropout_bits.keep_mask); None without dropout."""
  if not spec.dropout:
    return None
  k1, k2, b_off, h_off = words
  batch, head = b_off + b.astype(jnp.uint32), h_off + h.astype(jnp.uint32)
  row = attention_row(batch, head, rows, spec.heads_total, seq_len)
  ys = threefry2x32(k1, k2, row, cols >> np.uint32(_LANE_SHIFT))
  return select_draw(ys, cols & np.uint32(DRAWS_PER_HASH - 1)) < np.uint32(spec.keep_threshold)


def softmax_update(z, m, l):
  """One key block of the online softmax on wgmma's layout (row statistics are vectors, so
  each is broadcast back along the keys): (p, alpha, m_new, l_new)."""
  m_new = jnp.maximum(m, z.max(axis=1))
  alpha = jnp.exp(m - m_new)
  p = jnp.exp(z - lax.broadcast_in_dim(m_new, z.shape, [0]))
  return p, alpha, m_new, l * alpha + p.sum(axis=1)


def padded_scalars(fparams, iparams):
  """fparams [B, 2] -> [B, 32] float32, iparams [4] -> [32] uint32 (SCALARS)."""
  f = jnp.pad(fparams.astype(jnp.float32), [(0, 0), (0, SCALARS - fparams.shape[1])])
  i = jnp.pad(iparams.astype(jnp.uint32), [(0, SCALARS - iparams.shape[0])])
  return f, i


def _named(name: str):
  """plgpu.kernel under a named scope: the kernel's name in the HLO's op names (the
  estimator's and the profiler's split read it) and in its machine code (the PTX entry
  `<name>_mosaic_gpu_kernel`, which MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=DIR writes in a
  deviceless compile: the SASS route of aot/sass.py reads it)."""

  def kernel(body, **kwargs):
    call = plgpu.kernel(body, kernel_name=name, **kwargs)

    def run(*args):
      with jax.named_scope(name):
        return call(*args)

    return run

  return kernel


def _params(spec: KernelSpec):
  return InterpretParams() if spec.interpret else None


def InterpretParams():  # pylint: disable=invalid-name
  # Mosaic GPU's interpreter is not exported by jax.experimental yet (jax 0.10.2).
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # pylint: disable=import-outside-toplevel

  return InterpretGPUParams()


def _scalars(f_ref, i_ref, f_smem, i_smem, bars, b):
  """(score scale, 1 / running-mean divisor, the four dropout words) of sequence b; barriers
  0 and 1."""
  plgpu.copy_gmem_to_smem(f_ref.at[b], f_smem, bars.at[0])
  plgpu.copy_gmem_to_smem(i_ref, i_smem, bars.at[1])
  plgpu.barrier_wait(bars.at[0])
  plgpu.barrier_wait(bars.at[1])
  words = tuple(i_smem[n] for n in range(4))
  return f_smem[0], f_smem[1], words


def copy_key_block(refs, smem, bars, first: int, b, h, k0, block: int) -> None:
  """Starts the copies of the keys, values and bias (refs: qkv, bias) of key rows k0 .. k0 +
  block into shared memory (smem: k, v, bias) on barriers first, first + 1, first + 2."""
  qkv_ref, bias_ref = refs
  k_s, v_s, bias_s = smem
  plgpu.copy_gmem_to_smem(qkv_ref.at[b, pl.ds(k0, block), 1, h], k_s, bars.at[first])
  plgpu.copy_gmem_to_smem(qkv_ref.at[b, pl.ds(k0, block), 2, h], v_s, bars.at[first + 1])
  plgpu.copy_gmem_to_smem(bias_ref.at[b, pl.ds(k0, block)], bias_s, bars.at[first + 2])


def key_block_scores(ops: Ops, q_s, refs, smem, bars, first: int, b, h, k0, shape):
  """z = scale inv_div Q K^T + bias of the tile of `shape` (rows, keys) at key row k0, after
  `copy_key_block` (smem: k, v, bias, then the scalars scale, inv_div) waited for the keys
  and the bias; the caller waits on barrier first + 1 before it reads the values."""
  k_s, v_s, bias_s, scale, inv_div = smem
  copy_key_block(refs, (k_s, v_s, bias_s), bars, first, b, h, k0, shape[1])
  plgpu.barrier_wait(bars.at[first])
  plgpu.barrier_wait(bars.at[first + 2])
  return ops.mma(q_s, k_s, transpose_b=True) * scale * inv_div + lax.broadcast_in_dim(
    ops.vector(bias_s, along=1), shape, [1]
  )


def scalar_smem() -> list:
  """Shared memory of one sequence's fparams row and of iparams (padded_scalars)."""
  return [plgpu.SMEM((SCALARS,), jnp.float32), plgpu.SMEM((SCALARS,), jnp.uint32)]


def row_stats_smem(block_q: int) -> list:
  """Shared memory of a forward tile's row statistics m, l (store_forward)."""
  return [plgpu.SMEM((block_q,), jnp.float32), plgpu.SMEM((block_q,), jnp.float32)]


def store_forward(acc, m, l, smem, refs, b, h, q0, block_q: int) -> None:
  """Writes a forward tile's output acc / l and row statistics (m, log l) through shared
  memory (smem: out, m, l tiles) to refs (out, m, log l) at query rows q0 .. q0 + block_q."""
  out_s, m_s, l_s = smem
  o_ref, m_ref, log_l_ref = refs
  out_s[...] = (acc / lax.broadcast_in_dim(l, acc.shape, [0])).astype(out_s.dtype)
  m_s[...] = m
  l_s[...] = jnp.log(l)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_s, o_ref.at[b, pl.ds(q0, block_q), h])
  plgpu.copy_smem_to_gmem(m_s, m_ref.at[b, h, pl.ds(q0, block_q)])
  plgpu.copy_smem_to_gmem(l_s, log_l_ref.at[b, h, pl.ds(q0, block_q)])
  plgpu.wait_smem_to_gmem(0)


def _program(axis: str, f_ref, i_ref, f_smem, i_smem, bars):
  """(head, block index along `axis`, sequence b, score scale, 1 / divisor, dropout words) of
  this program of grid (heads, axis, batch); barriers 0 and 1 (_scalars)."""
  h, index, b = lax.axis_index('heads'), lax.axis_index(axis), lax.axis_index('batch')
  return (h, index, b, *_scalars(f_ref, i_ref, f_smem, i_smem, bars, b))


def _forward_kernel(
  qkv_ref, bias_ref, f_ref, i_ref, o_ref, m_ref, log_l_ref, q_s, k_s, v_s, bias_s, f_s, i_s,
  m_s, l_s, bars, *, spec: KernelSpec, ops: Ops,
):  # fmt: skip
  h, qi, b, scale, inv_div, words = _program('q', f_ref, i_ref, f_s, i_s, bars)
  seq_len = qkv_ref.shape[1]
  block_q, block_k = spec.block_q, spec.block_k
  q0 = qi * block_q
  plgpu.copy_gmem_to_smem(qkv_ref.at[b, pl.ds(q0, block_q), 0, h], q_s, bars.at[2])
  plgpu.barrier_wait(bars.at[2])
  rows = (ops.iota((block_q, block_k), 0) + q0).astype(jnp.uint32)
  cols0 = ops.iota((block_q, block_k), 1).astype(jnp.uint32)
  keys, tiles = (qkv_ref, bias_ref), (k_s, v_s, bias_s, scale, inv_div)

  def body(j, carry):
    acc, m, l = carry
    k0 = j * block_k
    z = key_block_scores(ops, q_s, keys, tiles, bars, 3, b, h, k0, (block_q, block_k))
    p, alpha, m_new, l = softmax_update(z, m, l)
    kept = keep(spec, words, b, h, seq_len, rows, cols0 + k0.astype(jnp.uint32))
    plgpu.barrier_wait(bars.at[4])
    pv = ops.mma(drop(p, kept, spec.keep_prob).astype(v_s.dtype), v_s)
    acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv
    return acc, m_new, l

  head_dim = q_s.shape[1]
  init = ops.softmax_state(block_q, head_dim)
  acc, m, l = lax.fori_loop(0, seq_len // block_k, body, init)
  store_forward(acc, m, l, (q_s, m_s, l_s), (o_ref, m_ref, log_l_ref), b, h, q0, block_q)


def _check(spec: KernelSpec, qkv) -> None:
  if spec.carry_in or spec.carry_out:
    raise ValueError('mosaic_gpu kernels carry no residual sum (its record: residual=False)')
  if qkv.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f'mosaic_gpu kernels take bfloat16 or float16, not {qkv.dtype}')


def forward(qkv, acc_in, bias, fparams, iparams, spec: KernelSpec):
  """(out [B, L, H, K], lse = (m, log l) [B, H, L] float32 each, None: no carried sum, None:
  no stored dropout mask)."""
  del acc_in
  _check(spec, qkv)
  batch, seq_len, _, heads, head_dim = qkv.shape
  ops = Ops(spec.interpret)
  f, i = padded_scalars(fparams, iparams)
  stats = jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32)
  out, m, log_l = _named('mosaic_gpu_attention_fwd')(
    functools.partial(_forward_kernel, spec=spec, ops=ops),
    out_type=(jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), qkv.dtype), stats, stats),
    grid=(heads, seq_len // spec.block_q, batch),
    grid_names=('heads', 'q', 'batch'),
    scratch_types=[
      ops.tile(spec.block_q, head_dim, qkv.dtype),
      ops.tile(spec.block_k, head_dim, qkv.dtype),
      ops.tile(spec.block_k, head_dim, qkv.dtype),
      plgpu.SMEM((spec.block_k,), jnp.float32),
      *scalar_smem(),
      *row_stats_smem(spec.block_q),
      plgpu.Barrier(num_barriers=6),
    ],
    interpret=_params(spec),
  )(qkv, bias.astype(jnp.float32), f, i)
  return out, (m, log_l), None, None


def _row_stats(refs, smems, bars, first, b, h, r0, rows):
  """m, log l and delta of rows r0 .. r0 + rows of (b, h), on barriers first, first + 1, ..."""
  for n, (ref, smem) in enumerate(zip(refs, smems)):
    plgpu.copy_gmem_to_smem(ref.at[b, h, pl.ds(r0, rows)], smem, bars.at[first + n])
  for n in range(len(refs)):
    plgpu.barrier_wait(bars.at[first + n])


def _dkv_kernel(
  qkv_ref, do_ref, m_ref, log_l_ref, delta_ref, bias_ref, f_ref, i_ref, dk_ref, dv_ref,
  k_s, v_s, q_s, do_s, m_s, l_s, d_s, bias_s, f_s, i_s, bars, *, spec: KernelSpec, ops: Ops,
):  # fmt: skip
  """A key block's dK, dV: the tile transposed, keys as rows and queries as columns."""
  h, ki, b, scale, inv_div, words = _program('k', f_ref, i_ref, f_s, i_s, bars)
  seq_len, block = qkv_ref.shape[1], spec.block_bwd
  k0 = ki * block
  copy_key_block((qkv_ref, bias_ref), (k_s, v_s, bias_s), bars, 2, b, h, k0, block)
  for n in (2, 3, 4):
    plgpu.barrier_wait(bars.at[n])
  bias_keys = lax.broadcast_in_dim(ops.vector(bias_s, along=0), (block, block), [0])
  keys = (ops.iota((block, block), 0) + k0).astype(jnp.uint32)
  queries0 = ops.iota((block, block), 1).astype(jnp.uint32)

  def body(j, carry):
    dk, dv = carry
    q0 = j * block
    plgpu.copy_gmem_to_smem(qkv_ref.at[b, pl.ds(q0, block), 0, h], q_s, bars.at[5])
    plgpu.copy_gmem_to_smem(do_ref.at[b, pl.ds(q0, block), h], do_s, bars.at[6])
    _row_stats((m_ref, log_l_ref, delta_ref), (m_s, l_s, d_s), bars, 7, b, h, q0, block)
    plgpu.barrier_wait(bars.at[5])
    z_t = ops.mma(k_s, q_s, transpose_b=True) * scale * inv_div + bias_keys
    column = lambda smem: lax.broadcast_in_dim(ops.vector(smem, along=1), z_t.shape, [1])  # noqa: E731
    p_t = jnp.exp(z_t - column(m_s) - column(l_s))  # (z - m) first: padding rows' m ~ -1e9
    kept = keep(spec, words, b, h, seq_len, queries0 + q0.astype(jnp.uint32), keys)
    plgpu.barrier_wait(bars.at[6])
    dv = dv + ops.mma(drop(p_t, kept, spec.keep_prob).astype(do_s.dtype), do_s)
    dp_t = drop(ops.mma(v_s, do_s, transpose_b=True), kept, spec.keep_prob)
    ds_t = p_t * (dp_t - column(d_s)) * (scale * inv_div)
    dk = dk + ops.mma(ds_t.astype(q_s.dtype), q_s)
    return dk, dv

  head_dim = k_s.shape[1]
  zeros = ops.full((block, head_dim), 0.0)
  dk, dv = lax.fori_loop(0, seq_len // block, body, (zeros, zeros))
  k_s[...] = dk.astype(k_s.dtype)
  v_s[...] = dv.astype(v_s.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(k_s, dk_ref.at[b, pl.ds(k0, block), h])
  plgpu.copy_smem_to_gmem(v_s, dv_ref.at[b, pl.ds(k0, block), h])
  plgpu.wait_smem_to_gmem(0)


def _dq_kernel(
  qkv_ref, do_ref, m_ref, log_l_ref, delta_ref, bias_ref, f_ref, i_ref, dq_ref,
  q_s, do_s, k_s, v_s, m_s, l_s, d_s, bias_s, f_s, i_s, bars, *, spec: KernelSpec, ops: Ops,
):  # fmt: skip
  h, qi, b, scale, inv_div, words = _program('q', f_ref, i_ref, f_s, i_s, bars)
  seq_len, block = qkv_ref.shape[1], spec.block_bwd
  q0 = qi * block
  plgpu.copy_gmem_to_smem(qkv_ref.at[b, pl.ds(q0, block), 0, h], q_s, bars.at[2])
  plgpu.copy_gmem_to_smem(do_ref.at[b, pl.ds(q0, block), h], do_s, bars.at[3])
  _row_stats((m_ref, log_l_ref, delta_ref), (m_s, l_s, d_s), bars, 4, b, h, q0, block)
  for n in (2, 3):
    plgpu.barrier_wait(bars.at[n])
  row = lambda smem: lax.broadcast_in_dim(ops.vector(smem, along=0), (block, block), [0])  # noqa: E731
  m, log_l, delta = row(m_s), row(l_s), row(d_s)
  queries = (ops.iota((block, block), 0) + q0).astype(jnp.uint32)
  keys0 = ops.iota((block, block), 1).astype(jnp.uint32)

  keys, tiles = (qkv_ref, bias_ref), (k_s, v_s, bias_s, scale, inv_div)

  def body(j, dq):
    k0 = j * block
    z = key_block_scores(ops, q_s, keys, tiles, bars, 7, b, h, k0, (block, block))
    p = jnp.exp(z - m - log_l)
    kept = keep(spec, words, b, h, seq_len, queries, keys0 + k0.astype(jnp.uint32))
    plgpu.barrier_wait(bars.at[8])
    dp = drop(ops.mma(do_s, v_s, transpose_b=True), kept, spec.keep_prob)
    ds = p * (dp - delta) * (scale * inv_div)
    return dq + ops.mma(ds.astype(k_s.dtype), k_s)

  head_dim = q_s.shape[1]
  dq = lax.fori_loop(0, seq_len // block, body, ops.full((block, head_dim), 0.0))
  q_s[...] = dq.astype(q_s.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(q_s, dq_ref.at[b, pl.ds(q0, block), h])
  plgpu.wait_smem_to_gmem(0)


def backward(
  qkv, g_out, lse, delta, acc, g_acc, bias, fparams, iparams, bits, spec: KernelSpec,
  rebuild: bool = False,
):  # fmt: skip
  """(dqkv [B, L, 3, H, K], None, None): the dropout mask drawn again (bits is always None)."""
  del acc, g_acc, bits, rebuild
  _check(spec, qkv)
  batch, seq_len, _, heads, head_dim = qkv.shape
  ops = Ops(spec.interpret)
  f, i = padded_scalars(fparams, iparams)
  m, log_l = (x.reshape(batch, heads, seq_len).astype(jnp.float32) for x in lse)
  delta = delta.reshape(batch, heads, seq_len).astype(jnp.float32)
  block = spec.block_bwd
  tile = functools.partial(ops.tile, block, head_dim, qkv.dtype)
  vectors = [plgpu.SMEM((block,), jnp.float32) for _ in range(4)]  # m, log l, delta, bias
  rows = jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), qkv.dtype)
  args = (qkv, g_out.astype(qkv.dtype), m, log_l, delta, bias.astype(jnp.float32), f, i)
  grid = (heads, seq_len // block, batch)
  # Both backward kernels stage four tiles, the row vectors and scalars, and ten barriers.
  scratch = lambda: [
    tile(),
    tile(),
    tile(),
    tile(),
    *vectors,
    *scalar_smem(),
    plgpu.Barrier(num_barriers=10),
  ]
  dk, dv = _named('mosaic_gpu_attention_dkv')(
    functools.partial(_dkv_kernel, spec=spec, ops=ops),
    out_type=(rows, rows),
    grid=grid,
    grid_names=('heads', 'k', 'batch'),
    scratch_types=scratch(),
    interpret=_params(spec),
  )(*args)
  dq = _named('mosaic_gpu_attention_dq')(
    functools.partial(_dq_kernel, spec=spec, ops=ops),
    out_type=rows,
    grid=grid,
    grid_names=('heads', 'q', 'batch'),
    scratch_types=scratch(),
    interpret=_params(spec),
  )(*args)
  return jnp.stack([dq, dk, dv], axis=2), None, None


def fit_blocks(spec: KernelSpec, seq_len: int) -> KernelSpec:
  """The plan's tiles (the record's tile rule) are the kernels' own."""
  del seq_len
  return spec

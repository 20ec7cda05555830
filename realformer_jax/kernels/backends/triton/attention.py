"""Fused attention kernels for NVIDIA GPUs (Pallas on Triton).

forward   grid (query blocks, B, H). A program holds its query tile and walks the key blocks:
          s = scale q k^T; with residual attention it reads the acc_{l-1} tile, writes
          acc_l = acc_{l-1} + s, and feeds z = acc_l * inv_div + bias to an online softmax;
          dropout (the einsum path's mask, dropout_tiles.py) and P V happen in registers.
          Writes the output, the row log-sum-exp (as m and log l: tile_math.py) and, with
          dropout, the mask it drew at one bit per element (1/32 of a float32 score): hashing
          it again would cost the backward ~18 integer ops per element
          (HASH_OPS_PER_ELEMENT). Probabilities never reach HBM. A rematerialised layer's
          forward (`spec.for_remat`) stores its mask only where the remat policy keeps it
          (`spec.keeps_mask`: select.py's memory rule, model.remat_dropout_masks); else the
          backward draws it.
backward  grid (key blocks, B, H). A program holds its key / value tile and walks the query
          blocks, recomputing p = exp(z - m - log l), reading the mask, accumulating dK and dV. With
          residual attention it reads acc_l and the carried gradient g_l and writes
          g_{l-1} = g_l + dz * inv_div (and, when asked, acc_{l-1} = acc_l - s, so the layer
          below needs no saved sum), in place. dQ = scale g_{l-1} K is then a second kernel's
          (`query_gradient`, grid (query blocks, B, H)): a program reads its rows of the
          gradient just written and walks the key blocks, one [L, L] x [L, K] product and 4
          bytes of HBM per score element, written straight into the dQ part of the gradient.
          The other way, still taken at head sizes below 64 (`reads_dq_back`: the estimate prefers
          it at some of those shapes), adds each tile's dQ share into a float32 dQ atomically in the
          loop (FlashAttention-2's scheme): K / block atomic updates per score element, one at K =
          64, what bounded the backward by the estimate (1.84 ms a layer at BERT-Large 32 x 512 on
          an H200), and the one scores-carry step measured (H200, L = 16,384) ran 1.18 s against
          0.77 s estimated, put down to those atomics' contention (docs/performance.md, issue 64).
          Without residual attention there is no gradient to read back: a second loop of the
          same program recomputes its query block's dQ instead.
          Given no mask (`bits=None`, a rematerialised layer that keeps none), each of its two
          loops draws the tiles it needs (the forward's hash, dropout_tiles.py): no separate
          pass and no [L, L]-sized buffer, the hash twice per element instead of once; or,
          with `spec.mask_pass`, `draw_mask` first draws the layer's whole mask (the hash once,
          one layer's bits in memory) and both loops read it.
HBM traffic per score element: forward 4 B read + 4 B write with residual attention, else 0;
backward 4 + 4 read, 4 written (+4 when rebuilding acc_{l-1}), and the dQ kernel's 4 read.
Matmuls: 2 [L, L] x [L, K] products forward; backward 4 with residual attention (dO V^T, dV,
dK, and Q K^T only when rebuilding acc_{l-1}) plus the dQ kernel's 1, 7 without (the dQ loop
recomputes Q K^T and dO V^T).
q, k and v are read straight from the fused projection's [B, L, 3, H, K] output (one operand:
a program's (batch, head) slice, rows and parts picked in the kernel), and the gradient is
written into one [B, L, 3, H, K] array, so no slices or concatenations surround the kernels.
Each pallas_call states its matmul FLOPs, its element-wise work (float ops, integer ops: the
dropout hash, transcendentals: exp) and the HBM bytes it moves (`_cost_metadata`): XLA's GPU
cost model cannot see inside a Triton kernel, and operand sizes alone would count a (batch,
head) slice read by many programs, or an array updated in place, as read whole.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from realformer_jax.kernels.backends.triton.tiles import device_tiles, with_device_tiles
from realformer_jax.kernels.dropout.dropout_bits import MulHi, attention_row, mulhi_limbs
from realformer_jax.kernels.dropout.dropout_tiles import keep_tile_joined, pack_bits, unpack_bits
from realformer_jax.kernels.plumbing import tile_math as tm
from realformer_jax.kernels.plumbing.spec import KernelSpec


def _draw_keep(spec: KernelSpec, i_ref, b, h, seq_len, q0, k0, shape):
  batch, head = i_ref[2] + b.astype(jnp.uint32), i_ref[3] + h.astype(jnp.uint32)
  row0 = attention_row(batch, head, q0.astype(jnp.uint32), spec.heads_total, seq_len)
  return keep_tile_joined(
    i_ref[0], i_ref[1], row0, k0, shape, spec.keep_threshold, spec.generator, _mulhi(spec)
  )


def _mulhi(spec: KernelSpec) -> MulHi:
  """How a kernel forms a multiply's high word (philox): one PTX `mul.hi.u32` compiled for an
  NVIDIA GPU (Pallas Triton has no lowering of lax.mulhi), 16-bit limbs in interpret mode
  (an XLA program, perhaps sharded: dropout_bits.mulhi_xla) and on ROCm (no PTX there). The
  same bits every way (dropout_bits.py)."""
  if spec.interpret or _on_rocm():
    return mulhi_limbs
  return _ptx_mulhi


def _on_rocm() -> bool:
  device = jax.devices()[0]
  return (
    device.platform == 'gpu'
    and 'rocm' in str(getattr(device.client, 'platform_version', '')).lower()
  )


def _ptx_mulhi(x: jax.Array, m: int) -> jax.Array:
  # Declared int32 and bitcast back: the Triton lowering holds uint32 values as signless i32,
  # and an inline asm typed uint32 would not mix with them.
  [high] = plgpu.elementwise_inline_asm(
    f'mul.hi.u32 $0, $1, {m};',
    args=[x],
    constraints='=r,r',
    pack=1,
    result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.int32)],
  )
  return lax.bitcast_convert_type(high, jnp.uint32)


def _exp2(spec: KernelSpec) -> tm.Elementwise:
  """How a kernel forms 2^x for its softmax (base 2: tile_math.py): one PTX `ex2.approx.ftz.f32`
  compiled for an NVIDIA GPU (Pallas Triton lowers jnp.exp to libdevice's `__nv_expf`, ~8 SASS
  instructions an element: a range reduction around the same ex2, and jnp.exp2 to
  `__nv_exp2f`), jnp.exp2 in interpret mode and on ROCm. ex2.approx: relative error 2^-22,
  subnormal results flushed to 0 (p < 2^-126 of the row's largest)."""
  if spec.interpret or _on_rocm():
    return jnp.exp2
  return _ptx_ex2


def _ptx_ex2(x: jax.Array) -> jax.Array:
  [y] = plgpu.elementwise_inline_asm(
    'ex2.approx.ftz.f32 $0, $1;',
    args=[x],
    constraints='=f,f',
    pack=1,
    result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)],
  )
  return y


def pack_width(spec: KernelSpec) -> int:
  """Mask bits per stored uint32 word: 32, or 16 where a tile is 16 wide."""
  return min(32, spec.block_k, spec.block_bwd, spec.backward_rows)


def fit_blocks(spec: KernelSpec, seq_len: int) -> KernelSpec:
  """`spec` with the device's forward tiles (tiles.py) for plain attention where they divide
  the sequence; a carried sum, and interpret mode, keep the plan's."""
  if spec.interpret or spec.carry_out:
    return spec
  return with_device_tiles(spec, seq_len)


def _forward_params(spec: KernelSpec, head_dim: int):
  """The table's warps and stages where the forward runs on its tiles, else the default."""
  tiles = device_tiles()
  if (spec.block_q, spec.block_k) == (tiles.block_q, tiles.block_k) and not spec.carry_out:
    return plgpu.CompilerParams(
      num_warps=max(tiles.warps, _compiler_params(head_dim).num_warps), num_stages=tiles.stages
    )
  return _compiler_params(head_dim)


def stores_mask(spec: KernelSpec) -> bool:
  """Whether the forward writes the dropout mask for the backward (a rematerialised layer's
  only where the remat policy keeps it: `keeps_mask`)."""
  return spec.dropout and (not spec.for_remat or spec.keeps_mask)


def _mask_kernel(i_ref, bits_ref, *, spec: KernelSpec, seq_len: int):
  iq, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  block_q, block_k, width = spec.block_q, spec.block_k, pack_width(spec)

  def body(j, carry):
    keep = _draw_keep(spec, i_ref, b, h, seq_len, iq * block_q, j * block_k, (block_q, block_k))
    _store_keep(bits_ref, keep, j, block_k, width)
    return carry

  lax.fori_loop(0, seq_len // block_k, body, 0)


def draw_mask(batch: int, heads: int, seq_len: int, iparams, spec: KernelSpec):
  """The dropout mask the forward would have stored, [B, H, L, L / width] uint32: the same
  hash of the same global positions and the same packing, alone (no scores): a rematerialised
  layer's backward with `spec.mask_pass`."""
  width = pack_width(spec)
  elements = batch * heads * seq_len * seq_len
  return pl.pallas_call(
    functools.partial(_mask_kernel, spec=spec, seq_len=seq_len),
    grid=(seq_len // spec.block_q, batch, heads),
    in_specs=[pl.BlockSpec((4,), lambda i, b, h: (0,))],
    out_specs=_mask_spec(spec, seq_len),
    out_shape=jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len // width), jnp.uint32),
    interpret=spec.interpret,
    compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
    metadata={
      'flops': '0',
      'bytes_accessed': str(elements // 8),
      'float_ops': '0',
      'transcendentals': '0',
      'int_ops': str(int((HASH_OPS_PER_ELEMENT[spec.generator] + 2) * elements)),  # forward's
      'l2_bytes': str(elements // 8),
      'atomics': '0',
    },
    name='attention_dropout_mask',
  )(iparams)


def _forward_kernel(
  qkv_ref,
  acc_in_ref,
  bias_ref,
  f_ref,
  i_ref,
  o_ref,
  m_ref,
  log_l_ref,
  acc_out_ref,
  bits_ref,
  *,
  spec: KernelSpec,
):
  seq_len, _, head_dim = qkv_ref.shape
  block_q, block_k = spec.block_q, spec.block_k
  width = pack_width(spec)
  iq, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  if not spec.sum_given:  # with the sum given, no Q K^T
    q = qkv_ref[pl.ds(pl.multiple_of(iq * block_q, block_q), block_q), 0, :]
  scale, inv_div2 = f_ref[0], f_ref[1] * tm.LOG2E  # z in base 2 (tile_math.py)
  exp2 = _exp2(spec)

  def body(j, state):
    ks = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
    bias_row = bias_ref[ks][None, :] * tm.LOG2E
    if spec.sum_given:
      z = tm.softmax_input(acc_in_ref[:, ks], inv_div2, bias_row)
    elif not spec.carry_out:  # the product scaled once: (scale / divisor) q k^T + bias
      z = tm.softmax_input(tm.dot_t(q, qkv_ref[ks, 1, :]), scale * inv_div2, bias_row)
    else:
      acc = tm.scores(q, qkv_ref[ks, 1, :], scale)
      if spec.carry_in:
        acc = acc_in_ref[:, ks] + acc
      acc_out_ref[:, ks] = acc
      z = tm.softmax_input(acc, inv_div2, bias_row)
    keep = None
    if spec.dropout:
      keep = _draw_keep(spec, i_ref, b, h, seq_len, iq * block_q, j * block_k, (block_q, block_k))
      if stores_mask(spec):
        _store_keep(bits_ref, keep, j, block_k, width)
    return tm.online_softmax_step(state, z, qkv_ref[ks, 2, :], keep, spec.keep_prob, exp2)

  state = lax.fori_loop(0, seq_len // block_k, body, tm.initial_state(block_q, head_dim))
  out, (m, log_l) = tm.finish(state, jnp.log2)  # base 2: the backward reads them so
  o_ref[...] = out.astype(o_ref.dtype)
  m_ref[...] = m[:, 0]
  log_l_ref[...] = log_l[:, 0]


def _store_keep(bits_ref, keep, j, block_k, width):
  """Key block j's [rows, block_k] mask, packed `width` to a word, into its columns."""
  words = pl.ds(pl.multiple_of(j * (block_k // width), block_k // width), block_k // width)
  bits_ref[:, words] = pack_bits(keep, width)


def _mask_spec(spec: KernelSpec, seq_len: int) -> pl.BlockSpec:
  """The forward's rows of the packed mask [B, H, L, L / width] (grid (query block, b, h))."""
  return pl.BlockSpec(
    (None, None, spec.block_q, seq_len // pack_width(spec)), lambda i, b, h: (b, h, i, 0)
  )


def _head_spec(seq_len: int, head_dim: int) -> pl.BlockSpec:
  """One (batch, head)'s q, k and v [L, 3, K] in a [B, L, 3, H, K] array (grid (_, b, h))."""
  return pl.BlockSpec((None, seq_len, 3, None, head_dim), lambda _, b, h: (b, 0, 0, h, 0))


def forward(qkv, acc_in, bias, fparams, iparams, spec: KernelSpec):
  """(out [B, L, H, K], lse = (m, log l) [B, H, L] float32 each in base 2 (m log2 e, log2 l:
  tile_math.py), acc_out [B, H, L, L]
  float32 or None (None with `spec.sum_given`, whose acc_in is already acc_l), the dropout
  mask [B, H, L, L / width] uint32 or None)."""
  batch, seq_len, _, heads, head_dim = qkv.shape
  block_q = spec.block_q
  width = pack_width(spec)
  writes_sum = spec.carry_out and not spec.sum_given
  acc_spec = pl.BlockSpec((None, None, block_q, seq_len), lambda i, b, h: (b, h, i, 0))
  in_specs = [
    _head_spec(seq_len, head_dim),
    acc_spec if spec.carry_in else None,
    pl.BlockSpec((None, seq_len), lambda i, b, h: (b, 0)),
    pl.BlockSpec((None, 2), lambda i, b, h: (b, 0)),
    pl.BlockSpec((4,), lambda i, b, h: (0,)),
  ]
  scores_shape = jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len), jnp.float32)
  bits_shape = jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len // width), jnp.uint32)
  stores = stores_mask(spec)
  out_shape = [
    jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), qkv.dtype),
    jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32),
    jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32),
    scores_shape if writes_sum else None,
    bits_shape if stores else None,
  ]
  out_specs = [
    pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, i, h, 0)),
    pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i)),
    pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i)),
    acc_spec if writes_sum else None,
    _mask_spec(spec, seq_len) if stores else None,
  ]
  rows = batch * seq_len * heads * head_dim * qkv.dtype.itemsize  # one [B, L, H, K] array
  elements = batch * heads * seq_len * seq_len
  out, m, log_l, acc_out, bits = pl.pallas_call(
    functools.partial(_forward_kernel, spec=spec),
    grid=(seq_len // block_q, batch, heads),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    interpret=spec.interpret,
    compiler_params=_forward_params(spec, head_dim),
    # acc_l overwrites acc_{l-1} tile by tile (each program reads its rows before writing
    # them), so a loop carrying the sum needs no copy; XLA copies if acc_{l-1} is still used.
    input_output_aliases={1: 3} if spec.carry_in and writes_sum else {},
    metadata=_cost_metadata(
      elements,
      head_dim,
      seq_len,
      passes=1 if spec.sum_given else 2,
      score_bytes=4 * (int(spec.carry_in) + int(writes_sum)) + stores / 8,
      row_bytes=(1 if spec.sum_given else 3) * rows + rows,
      float_ops=9 + int(spec.carry_in) + 2 * spec.dropout,
      exps=1,
      int_ops=HASH_OPS_PER_ELEMENT[spec.generator] + 2 if spec.dropout else 0,
      # each program reloads the k, v tiles and the bias row per key block (q: once)
      reloads=(2 * head_dim * qkv.dtype.itemsize + 4) / block_q,
      tile=block_q * spec.block_k,
    ),
    name='realformer_attention_fwd' if spec.carry_out else 'flash_attention_fwd',
  )(qkv, acc_in if spec.carry_in else None, bias, fparams, iparams)
  return out, (m, log_l), acc_out, bits


def _backward_kernel(
  qkv_ref,
  do_ref,
  m_ref,
  log_l_ref,
  delta_ref,
  acc_ref,
  g_acc_ref,
  bias_ref,
  f_ref,
  i_ref,
  column_bits_ref,
  row_bits_ref,
  _,
  dqkv_ref,
  dq_ref,
  g_acc_in_ref,
  acc_in_ref,
  *,
  spec: KernelSpec,
  rebuild: bool,
  draws: bool,
):
  seq_len, _, head_dim = qkv_ref.shape
  block, rows = spec.block_bwd, spec.backward_rows
  # grid (key block, batch, head): batch and head index the refs (and the drawn mask's rows)
  jk, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  scale, inv_div = f_ref[0], f_ref[1]
  exp2 = _exp2(spec)
  ks = pl.ds(pl.multiple_of(jk * block, block), block)
  k, v = qkv_ref[ks, 1, :], qkv_ref[ks, 2, :]
  bias_row = bias_ref[ks][None, :]

  width = pack_width(spec)

  def mask(bits_of, q0, k0, shape):
    """The keep mask of a [rows, cols] tile: drawn (`draws`) or unpacked from the bits."""
    if not spec.dropout:
      return None
    if draws:
      return _draw_keep(spec, i_ref, b, h, seq_len, q0, k0, shape)
    return unpack_bits(bits_of(), width)

  def tile(qs, k, v, bias_row, keep, acc=None, g_acc=None):
    q, do = qkv_ref[qs, 0, :], do_ref[qs, :]
    # z in base 2, as the forward's (tile_math.py); the product scaled once where no sum is
    # carried
    inv_div2, bias2 = inv_div * tm.LOG2E, bias_row * tm.LOG2E
    if acc is None:
      s = None
      z = tm.softmax_input(tm.dot_t(q, k), scale * inv_div2, bias2)
    else:
      s = tm.scores(q, k, scale) if rebuild else None  # for acc_{l-1} = acc_l - s only
      z = tm.softmax_input(acc, inv_div2, bias2)
    p_dropped, dz = tm.score_gradient(
      z,
      (m_ref[qs][:, None], log_l_ref[qs][:, None]),
      delta_ref[qs][:, None],
      do,
      v,
      keep,
      spec.keep_prob,
      exp2,
    )
    g = dz * inv_div if g_acc is None else g_acc + dz * inv_div
    return q, do, s, p_dropped, g

  def dkv_body(i, carry):
    dk, dv = carry
    qs = pl.ds(pl.multiple_of(i * rows, rows), rows)
    acc = acc_ref[qs, :] if spec.carry_out else None
    g_acc = g_acc_ref[qs, :] if spec.carry_out else None
    keep = mask(lambda: column_bits_ref[qs, :], i * rows, jk * block, (rows, block))
    q, do, s, p_dropped, g = tile(qs, k, v, bias_row, keep, acc, g_acc)
    ds = (g * scale).astype(q.dtype)
    if spec.carry_out:
      g_acc_in_ref[qs, :] = g
      if rebuild:
        acc_in_ref[qs, :] = acc - s
      if dq_ref is not None:  # the atomic path (`reads_dq_back`)
        plgpu.atomic_add(dq_ref, (qs, slice(None)), tm.dot(ds, k))
    dv = dv + tm.t_dot(p_dropped, do)
    dk = dk + tm.t_dot(ds, q)
    return dk, dv

  zeros = jnp.zeros((block, head_dim), jnp.float32)
  dk, dv = lax.fori_loop(0, seq_len // rows, dkv_body, (zeros, zeros))
  dqkv_ref[:, 1, :] = dk.astype(dqkv_ref.dtype)
  dqkv_ref[:, 2, :] = dv.astype(dqkv_ref.dtype)
  if spec.carry_out:
    return  # dQ: added atomically above, or `query_gradient`'s from the g_{l-1} just written

  # Without a carried gradient to re-read, dQ is cheapest recomputed: a second loop of the
  # same program over every key block (`rows` keys a step), for the query block with this
  # program's index (two more [L, L] x [L, K] products, no float32 dQ traffic).
  own_rows = ks

  def dq_body(j, dq):
    js = pl.ds(pl.multiple_of(j * rows, rows), rows)
    kj = qkv_ref[js, 1, :]
    words = pl.ds(pl.multiple_of(j * (rows // width), rows // width), rows // width)
    keep = mask(lambda: row_bits_ref[:, words], jk * block, j * rows, (block, rows))
    *_, g = tile(own_rows, kj, qkv_ref[js, 2, :], bias_ref[js][None, :], keep)
    return dq + tm.dot((g * scale).astype(kj.dtype), kj)

  dq = lax.fori_loop(0, seq_len // rows, dq_body, zeros)
  dqkv_ref[:, 0, :] = dq.astype(dqkv_ref.dtype)


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
  """(dqkv [B, L, 3, H, K], g_acc_in or None, acc_in or None); `bits` is the forward's mask
  (dropout only; None: `draw_mask` draws it first with `spec.mask_pass`, else the kernel's
  loops draw it again). See the module docstring."""
  batch, seq_len, _, heads, head_dim = qkv.shape
  if spec.dropout and bits is None and spec.mask_pass:
    bits = draw_mask(batch, heads, seq_len, iparams, spec)
  draws = spec.dropout and bits is None
  block = spec.block_bwd
  width = pack_width(spec)
  stat_spec = pl.BlockSpec((None, None, seq_len), lambda j, b, h: (b, h, 0))
  column_spec = pl.BlockSpec((None, None, seq_len, block), lambda j, b, h: (b, h, 0, j))
  carry = spec.carry_out
  reads = spec.dropout and not draws  # the forward's bits
  atomic = carry and not reads_dq_back(qkv.shape[-1])
  dq_spec = pl.BlockSpec((None, seq_len, None, head_dim), lambda j, b, h: (b, 0, h, 0))
  # The mask: a column strip for the dK / dV loop, a row strip for the dQ loop.
  column_bits = pl.BlockSpec((None, None, seq_len, block // width), lambda j, b, h: (b, h, 0, j))
  row_bits = pl.BlockSpec((None, None, block, seq_len // width), lambda j, b, h: (b, h, j, 0))
  in_specs = [
    _head_spec(seq_len, head_dim),
    pl.BlockSpec((None, seq_len, None, head_dim), lambda j, b, h: (b, 0, h, 0)),
    stat_spec,
    stat_spec,
    stat_spec,
    column_spec if carry else None,
    column_spec if carry else None,
    pl.BlockSpec((None, seq_len), lambda j, b, h: (b, 0)),
    pl.BlockSpec((None, 2), lambda j, b, h: (b, 0)),
    pl.BlockSpec((4,), lambda j, b, h: (0,)),
    column_bits if reads else None,
    row_bits if reads and not carry else None,
    dq_spec if atomic else None,
  ]
  scores_shape = jax.ShapeDtypeStruct((batch, heads, seq_len, seq_len), jnp.float32)
  dq_shape = jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), jnp.float32)
  out_shape = [
    jax.ShapeDtypeStruct(qkv.shape, qkv.dtype),
    dq_shape if atomic else None,
    scores_shape if carry else None,
    scores_shape if carry and rebuild else None,
  ]
  # Program j writes rows j of dK, dV (parts 1, 2) and, without residual attention, of dQ.
  out_specs = [
    pl.BlockSpec((None, block, 3, None, head_dim), lambda j, b, h: (b, j, 0, h, 0)),
    dq_spec if atomic else None,
    column_spec if carry else None,
    column_spec if carry and rebuild else None,
  ]
  # In place: column strip by column strip, g_{l-1} over g_l and acc_{l-1} over acc_l; on the
  # atomic path dQ accumulates over the zeros it is given (the last input present).
  # (Flattened inputs and outputs: the Nones are not counted.)
  aliases = {}
  if carry:
    aliases = {6: 1 + atomic, 5: 2 + atomic} if rebuild else {6: 1 + atomic}
  if atomic:
    aliases[10 + int(reads)] = 1
  dqkv, dq, g_acc_in, acc_in = pl.pallas_call(
    functools.partial(_backward_kernel, spec=spec, rebuild=rebuild, draws=draws),
    grid=(seq_len // block, batch, heads),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    interpret=spec.interpret,
    compiler_params=_backward_params(spec, head_dim),
    input_output_aliases=aliases,
    metadata=_backward_cost(spec, qkv.shape, qkv.dtype, rebuild, reads, draws, atomic),
    name='realformer_attention_bwd' if carry else 'flash_attention_bwd',
  )(
    qkv,
    do,
    *lse,
    delta,
    acc if carry else None,
    g_acc if carry else None,
    bias,
    fparams,
    iparams,
    bits if reads else None,
    bits if reads and not carry else None,
    jnp.zeros(dq_shape.shape, jnp.float32) if atomic else None,
  )
  if atomic:
    dqkv = _store_query_gradient(dq, dqkv, spec)
  elif carry:
    dqkv = query_gradient(g_acc_in, qkv, fparams, dqkv, spec)
  return dqkv, g_acc_in, acc_in


def _backward_cost(spec, shape, dtype, rebuild, reads, draws, atomic) -> dict:
  """What the backward states it costs (`_cost_metadata`), for qkv of `shape` and `dtype`;
  `atomic`: with residual attention, dQ added atomically in its loop (else `query_gradient`)."""
  batch, seq_len, _, heads, head_dim = shape
  carry, block, itemsize = spec.carry_out, spec.block_bwd, jnp.dtype(dtype).itemsize
  rows = batch * seq_len * heads * head_dim * itemsize
  return _cost_metadata(
    batch * heads * seq_len * seq_len,
    head_dim,
    seq_len,
    # with residual attention dO V^T, dV, dK, Q K^T only to rebuild acc_{l-1}, dQ only on the
    # atomic path; without, Q K^T and dO V^T in both loops, dV, dK and dQ
    passes=3 + int(rebuild) + int(atomic) if carry else 7,
    score_bytes=(4 * (3 + int(rebuild)) if carry else 0) + reads / 8,
    # q, k, v, dO in; dK, dV out; dQ: without residual attention out, on the atomic path
    # float32 zeros in and float32 out
    row_bytes=4 * rows + 2 * rows + (4 * rows if atomic else 0 if carry else rows),
    # one pass over the tiles with residual attention, two without (the dQ loop)
    float_ops=(14 + 2 * carry + rebuild + 4 * spec.dropout) * (1 if carry else 2),
    exps=1 if carry else 2,
    # per loop: unpacking the forward's bits, or drawing the mask (the forward's hash)
    int_ops=(3 if reads else HASH_OPS_PER_ELEMENT[spec.generator] + 2 if draws else 0)
    * (1 if carry else 2),
    # per step of `rows` queries: q, dO and three float32 row statistics, used against the
    # program's `block` keys; without residual attention the dQ loop's k, v tiles and bias
    # row per step of `rows` keys, used against its `block` queries
    reloads=(2 * head_dim * itemsize + 12) / block
    + (0 if carry else (2 * head_dim * itemsize + 4) / block),
    # on the atomic path each tile's [rows, K] float32 dQ share is added atomically
    atomics=head_dim / block if atomic else 0,
    tile=spec.backward_rows * block,  # both loops: rows x block, block x rows
  )


def _query_gradient_kernel(g_ref, qkv_ref, f_ref, _, dq_ref, *, spec: KernelSpec):
  # grid (query block, batch, head): the block's rows of g_{l-1}, every key block in turn
  seq_len, block_k = g_ref.shape[1], spec.block_k
  scale = f_ref[0]

  def body(j, dq):
    ks = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
    k = qkv_ref[ks, 1, :]
    # dS in the compute dtype, as the dK loop forms it from the same float32 g
    return dq + tm.dot((g_ref[:, ks] * scale).astype(k.dtype), k)

  zeros = jnp.zeros((spec.block_q, qkv_ref.shape[-1]), jnp.float32)
  dq_ref[...] = lax.fori_loop(0, seq_len // block_k, body, zeros).astype(dq_ref.dtype)


def query_gradient(g, qkv, fparams, dqkv, spec: KernelSpec):
  """dqkv with part 0 = dQ = scale g K, in place, from the float32 carried gradient g_{l-1}
  [B, H, L, L] the backward wrote (module docstring); parts 1 and 2 (dK, dV) untouched."""
  batch, seq_len, _, heads, head_dim = dqkv.shape
  block = spec.block_q
  part0 = pl.BlockSpec((None, block, None, None, head_dim), lambda i, b, h: (b, i, 0, h, 0))
  return pl.pallas_call(
    functools.partial(_query_gradient_kernel, spec=spec),
    grid=(seq_len // block, batch, heads),
    in_specs=[
      pl.BlockSpec((None, None, block, seq_len), lambda i, b, h: (b, h, i, 0)),
      _head_spec(seq_len, head_dim),
      pl.BlockSpec((None, 2), lambda i, b, h: (b, 0)),
      part0,
    ],
    out_specs=part0,
    out_shape=jax.ShapeDtypeStruct(dqkv.shape, dqkv.dtype),
    input_output_aliases={3: 0},
    interpret=spec.interpret,
    compiler_params=_compiler_params(head_dim),
    metadata=_query_gradient_cost(spec, dqkv.shape, dqkv.dtype),
    name='realformer_attention_dq',
  )(g, qkv, fparams, dqkv)


def _query_gradient_cost(spec: KernelSpec, shape, dtype) -> dict:
  batch, seq_len, _, heads, head_dim = shape
  itemsize = jnp.dtype(dtype).itemsize
  return _cost_metadata(
    batch * heads * seq_len * seq_len,
    head_dim,
    seq_len,
    passes=1,
    score_bytes=4,  # g_{l-1}, read once
    row_bytes=2 * batch * seq_len * heads * head_dim * itemsize,  # K in, dQ out
    float_ops=1,  # the scale
    exps=0,
    int_ops=0,
    reloads=head_dim * itemsize / spec.block_q,  # a program reloads the K tile per key block
    row_stats=False,
  )


def _store_kernel(dq_ref, _, dqkv_ref):
  dqkv_ref[...] = dq_ref[...].astype(dqkv_ref.dtype)


def _store_query_gradient(dq, dqkv, spec: KernelSpec):
  """dqkv with part 0 = dQ (float32 -> the compute dtype), in place: the atomic path's last
  step. A kernel, not XLA's dynamic-update-slice: XLA fused that update into the bias
  gradient's reduction as well, which kept the old dqkv alive and cost a copy of it."""
  batch, seq_len, _, heads, head_dim = dqkv.shape
  block = spec.block_q
  part0 = pl.BlockSpec((None, block, None, None, head_dim), lambda i, b, h: (b, i, 0, h, 0))
  return pl.pallas_call(
    _store_kernel,
    grid=(seq_len // block, batch, heads),
    in_specs=[pl.BlockSpec((None, block, None, head_dim), lambda i, b, h: (b, i, h, 0)), part0],
    out_specs=part0,
    out_shape=jax.ShapeDtypeStruct(dqkv.shape, dqkv.dtype),
    input_output_aliases={1: 0},
    interpret=spec.interpret,
    compiler_params=_compiler_params(head_dim),
    metadata=_store_cost(dqkv.shape, dqkv.dtype),
    name='attention_store_dq',
  )(dq, dqkv)


def _store_cost(shape, dtype) -> dict:
  rows = math.prod(shape) // 3 * jnp.dtype(dtype).itemsize
  return {  # float32 in, 16-bit out; each tile moved once
    'flops': '0',
    'bytes_accessed': str(3 * rows),
    'l2_bytes': str(3 * rows),
    'atomics': '0',
  }


_dq_path: Optional[str] = None  # `dq_path`'s, in force


@contextlib.contextmanager
def dq_path(path: str) -> Iterator[None]:
  """Carried backwards traced inside take dQ by `path`, 'read_back' or 'atomic', whatever the
  estimate says (`reads_dq_back`): the tests hold both paths to the einsum path."""
  global _dq_path
  if path not in ('read_back', 'atomic'):
    raise ValueError(f"error: dq_path={path!r}: must be 'read_back' or 'atomic'")
  before, _dq_path = _dq_path, path
  try:
    yield
  finally:
    _dq_path = before


# The smallest head size at which the carried backward reads dQ back. Distilled from the
# estimate (aot/roofline.stated_seconds on what the kernels state: the kernels sit below the
# estimator and cannot ask it): swept over B 1-32, H 1-16, L 128-16,384, bf16, H100 and H200,
# reading back is the cheaper at every shape with head size 64 or 128 (0.30-0.78x the atomic
# path), and at head sizes 16 / 32 the cheaper at some shapes only (0.76-1.48x; the atomics win
# where a grid of one or two heads leaves SMs idle); keeping the atomics there costs at most
# 1.15x the estimated best and is the path those shapes took before. tests/aot/
# test_dq_path_rule.py holds this rule to the estimator over that sweep.
READ_BACK_MIN_HEAD_DIM = 64


def reads_dq_back(head_dim: int) -> bool:
  """Whether a carried backward takes dQ from `query_gradient` (True) or adds it atomically in
  its loop (`READ_BACK_MIN_HEAD_DIM`; `dq_path` forces either). Read back: the backward without
  its atomics and dQ product, plus `query_gradient`. Atomic: the backward with them, the
  float32 dQ zeroed and `_store_query_gradient`."""
  if _dq_path is not None:
    return _dq_path == 'read_back'
  return head_dim >= READ_BACK_MIN_HEAD_DIM


def _compiler_params(head_dim: int):
  return plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2)


def _backward_params(spec: KernelSpec, head_dim: int):
  """The table's warps and stages where the backward runs on the row's backward tiles, else
  the default."""
  tiles = device_tiles()
  if not tiles.bwd_keys or (spec.block_bwd, spec.block_bwd_rows) != (
    tiles.bwd_keys,
    tiles.bwd_rows,
  ):
    return _compiler_params(head_dim)
  return plgpu.CompilerParams(
    num_warps=max(tiles.bwd_warps, _compiler_params(head_dim).num_warps),
    num_stages=tiles.bwd_stages,
  )


# Integer ops of the joined dropout hash per element, by generator. threefry: one Threefry-2x32
# (20 rounds of add, rotate = two shifts and an or, xor: 100; the key schedule and six
# injections: ~19; the counters: ~4) per eight elements (dropout_bits.DRAWS_PER_HASH), plus
# the byte pick (a shift and an and) and the comparison: 123 / 8 + 3 ~ 18. philox: one
# Philox-4x32-10 (10 rounds of 2 mul.hi, 2 mul.lo, 4 xor: 80) per sixteen elements, ~5 an
# element for the hash, but the same 18 in all: in the PTX of a deviceless sm_90a compile
# (aot/ptx.py; 128 x 128 tiles, 8 warps) the hash's own instructions are 4.0 an element
# against threefry's 8.7, yet the whole dropout of the qk forward's key loop is 22.2 against
# 22.6 (Post-LN's forward 32.9 against 33.2): the keep booleans go from the hash's layout to
# the MMA's through shared memory, and sixteen lanes move 1.5x the bytes of eight.
HASH_OPS_PER_ELEMENT = {'threefry': 18, 'philox': 18}


def _cost_metadata(
  elements: int,
  head_dim: int,
  seq_len: int,
  *,
  passes: int,
  score_bytes: float,
  row_bytes: int,
  float_ops: int,
  exps: int,
  int_ops: int,
  reloads: float = 0.0,
  atomics: float = 0.0,
  row_stats: bool = True,
  tile: int = 0,
) -> dict:
  """What a kernel costs, stated in the custom call's backend config (`serialized_metadata`,
  read by realformer_jax/aot's roofline): matmul FLOPs (`passes` [L, L] x [L, K] products per
  (batch, head)); HBM bytes: `score_bytes` per score element (float32 sums and gradients read
  or written once, mask bits) plus `row_bytes` of [B, L, H, K]-sized traffic (K and V tiles
  that several programs read come from L2: a (batch, head) slice is ~100 KB at L = 512), plus
  the row statistics (`row_stats`); and per score element the float ops (scale, sums, softmax,
  dropout, gradient arithmetic), exps and integer ops (mask hashing or unpacking) on the CUDA
  cores.
  `l2_bytes`: the HBM bytes plus every tile a program loads again, `reloads` bytes per score
  element, and 4 bytes per atomic update; `atomics`: global atomic element updates, `atomics`
  per score element (the fields the estimator reads: realformer_jax/aot/kernel_work.py).
  `tile`: the score elements a program covers per trip of its element loops (rows x columns),
  stated as `tile_elements`: what aot/sass.py divides a loop's instructions by (over the
  program's threads), not a count of exponentials, which is the compiler's to choose."""
  stats = 12 * elements // seq_len if row_stats else 0  # float32 m, log l and delta per row
  hbm = int(score_bytes * elements + row_bytes + stats)
  return {
    'flops': str(int(2 * passes * elements * head_dim)),
    'bytes_accessed': str(hbm),
    'float_ops': str(int(float_ops * elements)),
    'transcendentals': str(int(exps * elements)),
    'int_ops': str(int(int_ops * elements)),
    'l2_bytes': str(int(hbm + (reloads + 4 * atomics) * elements)),
    'atomics': str(int(atomics * elements)),
    **({'tile_elements': str(int(tile))} if tile else {}),
  }

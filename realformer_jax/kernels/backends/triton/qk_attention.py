"""Residual attention from the stacked queries and keys (residual_carry='qk'): Triton kernels.

The same attention as the residual kernels of attention.py beside this file, but the carried sum
is never read or written: each score tile is rebuilt in registers from the queries and keys of
layers 0..l (qk_reference.py, tile_math.summed_scores), l a traced scalar read by the kernel, so
one kernel serves every layer of a rolled nn.scan. The stack holds the compute dtype (bfloat16
in a bfloat16 model: the values were computed in it), so a tile product reads 16-bit tiles.

forward   grid (query blocks, B, H): for each key block, acc = scale sum_{i<=l} q_i k_i^T
          (l + 1 tile products into one MMA accumulator, scaled once after the layer loop:
          tile_math.summed_scores), then the online softmax, dropout and P V of attention.py
          beside this file. Writes the output and the row statistics (saved for the backward,
          which never runs the forward again); not the dropout mask (one bit per score
          element would be the one [L, L]-sized buffer of this carry: the backward draws the
          mask again, HASH_OPS_PER_ELEMENT integer ops per score element).
backward  two steps, no atomics and no read-modify-write of the stack's gradient in a kernel:
  dS      grid (key blocks of a column panel, B, H): a program owns key rows jk and walks
          every query block: rebuilds acc, p and dz, writes ds = dz inv_div scale (the same
          for every layer's q_i k_i^T) into a dS panel in the compute dtype, accumulates
          dV += p^T dO in registers and writes it once.
  GEMMs   XLA matmuls over every layer at once: dK_i[cols] = dS^T Q_i (all rows: complete)
          and dQ_i += dS K_i[cols] (summed over the column panels in a float32 accumulator),
          i <= l, as ONE product over the stacked features ([L, C] x [L, n K], n a static
          bucket of slots >= l + 1, `slot_buckets`; slots in (l, n) are multiplied by 0).
          The gradient stack is then updated once per panel by XLA (an add fused into the
          matmul's epilogue or a dynamic-update-slice in place).
Memory of the backward: the dS panel (`column_panels` chooses its shape: every (batch, head)
and every column where that fits DS_PANEL_BYTES, 1 GiB; else one (batch, head) at a time in
column panels sized by program count, the fewest columns whose C / block programs fill the
GPU's SMs (PANEL_FILL of every wave's slots), at any length), plus with column panels a
float32 [N, L, K] dQ accumulator of one head. O(L) at any length: a panel holds L x C values
with C ~ block x SMs (on 132 SMs, 64-key tiles, bfloat16: C = 8,192 columns, 128 programs,
1 GiB at L = 65,536 and 2 GiB at 131,072, where a 1 GiB cap had left 64 programs on the 132
SMs; + 201 MB of dQ accumulator at 65,536).
Matmuls per score element of layer l: forward (l + 1) + 1; backward: dS kernel (l + 1) + 2
(acc, dO V^T, dV), GEMMs 2 n (n >= l + 1 the bucket), i.e. (10 + 6l) K FLOPs at n = l + 1.
The stated cost (`_forward_cost`, `_score_gradient_cost`; HBM bytes, L2 bytes of the reloaded
tiles, no atomics) is per call site and a rolled scan's one call site runs every layer, so it
counts the mean layer of the stack, l + 1 = (N + 1) / 2; the GEMMs are XLA's dots, costed by
XLA. Tiles, warps and stages come from tiles.py's TILES, a table keyed by the device kind
(each row says which of its entries were measured on a device, and where).
One block of a ring (score_paths/ring_attention.py): `block_forward` and `block_backward`, the
same two steps on a (query block, key block) pair with the block's global origin in the
dropout hash; the backward also returns the travelling padding bias's and the score scale's
gradients, which the ring's einsum formula gives too.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from realformer_jax.kernels.backends.triton.attention import (
  HASH_OPS_PER_ELEMENT,
  _cost_metadata,
  _draw_keep,
  _exp2,
)
from realformer_jax.kernels.backends.triton.tiles import device_sms, device_tiles, with_device_tiles
from realformer_jax.kernels.dropout.dropout_bits import DRAWS_PER_GENERATOR
from realformer_jax.kernels.plumbing import tile_math as tm
from realformer_jax.kernels.plumbing.spec import KernelSpec

DS_PANEL_BYTES = 2**30  # the largest dS panel of every (batch, head) at once
# The least share of the SMs' program slots a one-head dS panel's grid fills in each wave
# (`wave_fill`): 128 programs on 132 SMs fill 0.97 (one wave, 4 SMs idle), as 256 do in two
# waves; 64 programs fill 0.48.
PANEL_FILL = 0.9


def fit_blocks(spec: KernelSpec, layers: int, seq_len: int, head_dim: int) -> KernelSpec:
  """`spec` with the device's tiles where they divide the sequence (the plan's otherwise);
  interpret mode keeps the plan's small tiles."""
  del layers, head_dim
  if spec.interpret:
    return spec
  return with_device_tiles(spec, seq_len, qk_backward=True)


def _compiler_params(head_dim: int, score_gradient: bool = False):
  """The table's warps and stages (the dS kernel's own where the row names them)."""
  tiles = device_tiles()
  warps, stages = tiles.warps, tiles.stages
  if score_gradient:
    warps, stages = tiles.ds_warps or warps, tiles.ds_stages or stages
  warps = warps if head_dim <= 64 else max(warps, 8)
  return plgpu.CompilerParams(num_warps=warps, num_stages=stages)


def _stack_spec(layers: int, seq_len: int, head_dim: int) -> pl.BlockSpec:
  """One (batch, head)'s queries and keys of every layer, [2, N, L, K] (grid (_, b, h))."""
  return pl.BlockSpec(
    (2, layers, None, seq_len, None, head_dim), lambda _, b, h: (0, 0, b, 0, h, 0)
  )


def _forward_outputs(batch, rows, heads, head_dim, dtype, block_q):
  """The forwards' outputs (context, row max, log row sum) and their blocks: `block_q` rows of
  one batch row and head a program."""
  out_shape = [
    jax.ShapeDtypeStruct((batch, rows, heads, head_dim), dtype),
    jax.ShapeDtypeStruct((batch, heads, rows), jnp.float32),
    jax.ShapeDtypeStruct((batch, heads, rows), jnp.float32),
  ]
  out_specs = [
    pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, i, h, 0)),
    pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i)),
    pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i)),
  ]
  return out_shape, out_specs


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
  exp2 = _exp2(spec)
  base2_scale = scale * inv_div * tm.LOG2E

  def body(j, state):
    ks = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
    # z in base 2 (tile_math.py), the sum scaled once by scale / divisor (no acc leaves)
    z = _tile_scores(stack_ref, layers, qs, ks, base2_scale, dtype, (block_q, block_k))
    z = z + bias_ref[ks][None, :] * tm.LOG2E
    keep = None
    if spec.dropout:
      keep = _draw_keep(spec, i_ref, b, h, seq_len, iq * block_q, j * block_k, (block_q, block_k))
    return tm.online_softmax_step(state, z, v_ref[ks, :], keep, spec.keep_prob, exp2)

  state = lax.fori_loop(0, seq_len // block_k, body, tm.initial_state(block_q, head_dim))
  out, (m, log_l) = tm.finish(state, jnp.log2)  # base 2: the dS kernel reads them so
  o_ref[...] = out.astype(o_ref.dtype)
  m_ref[...] = m[:, 0]
  log_l_ref[...] = log_l[:, 0]


def _forward_cost(spec, stack) -> dict:
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  return _forward_cost_of(spec, layers, batch, seq_len, seq_len, heads, head_dim, stack.dtype)


def _forward_cost_of(spec, layers, batch, rows, cols, heads, head_dim, dtype) -> dict:
  """The forward's stated cost on `rows` queries against `cols` keys (rows = cols = L: the
  one-device kernel; a ring's block: its own lengths), a stack of `layers` slots in `dtype`."""
  elements = batch * heads * rows * cols
  mean_layers = (layers + 1) / 2  # the mean l + 1 over the stack (module docstring)
  itemsize = jnp.dtype(dtype).itemsize
  q_rows = batch * rows * heads * head_dim * itemsize  # one [B, Lq, H, K] array
  k_rows = batch * cols * heads * head_dim * itemsize  # one [B, Lk, H, K] array
  # Loads per [block_q, block_k] tile: q and k of l + 1 layers (the q tile too is loaded
  # inside the layer loop), v, the bias row.
  block_q, block_k = min(spec.block_q, rows), min(spec.block_k, cols)
  reloads = (
    head_dim * itemsize * (mean_layers * (1 / block_q + 1 / block_k) + 1 / block_q) + 4 / block_q
  )
  return _cost_metadata(
    elements,
    head_dim,
    cols,  # the row statistics: elements / cols rows
    passes=mean_layers + 1,
    score_bytes=0,
    row_bytes=mean_layers * (q_rows + k_rows) + k_rows + q_rows,  # q, k of l + 1 layers; v, out
    float_ops=8 + mean_layers + 2 * spec.dropout,
    exps=1,
    int_ops=HASH_OPS_PER_ELEMENT[spec.generator] + 2 if spec.dropout else 0,
    reloads=reloads,
    tile=block_q * block_k,
  )


def forward(stack, v, bias, fparams, iparams, layer, spec: KernelSpec):
  """(out [B, L, H, K], lse = (m, log l) [B, H, L] float32 each in base 2 (m log2 e, log2 l:
  tile_math.py), None: no stored dropout
  mask). stack: [2, N, B, L, H, K] in any float dtype (tiles are cast to v's); layer: int32
  [1]."""
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
  out_shape, out_specs = _forward_outputs(batch, seq_len, heads, head_dim, v.dtype, block_q)
  out, m, log_l = pl.pallas_call(
    functools.partial(_forward_kernel, spec=spec),
    grid=(seq_len // block_q, batch, heads),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    interpret=spec.interpret,
    compiler_params=_compiler_params(head_dim),
    metadata=_forward_cost(spec, stack),
    name='realformer_qk_attention_fwd',
  )(stack, v, bias, fparams, iparams, layer)
  return out, (m, log_l), None


# --- one block of a ring (kernels/score_paths/ring_attention.py) ----------------------------------


def _block_forward_kernel(
  q_ref,
  k_ref,
  v_ref,
  bias_ref,
  f_ref,
  i_ref,
  l_ref,
  c_ref,
  o_ref,
  m_ref,
  log_l_ref,
  *,
  spec,
  length,
):
  """_forward_kernel on one block of the global [L, L] scores: the queries' rows and the keys'
  columns are separate arrays of their own lengths, and the dropout hash takes the block's
  global origin (c_ref: first row, first column) and the global length, so the mask is the
  one-device mask's block."""
  _, block_rows, head_dim = q_ref.shape
  cols = k_ref.shape[1]
  block_q, block_k = min(spec.block_q, block_rows), min(spec.block_k, cols)
  iq, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  qs = pl.ds(pl.multiple_of(iq * block_q, block_q), block_q)
  scale, inv_div = f_ref[0], f_ref[1]
  layers = l_ref[0] + 1
  dtype = v_ref.dtype
  exp2 = _exp2(spec)
  base2_scale = scale * inv_div * tm.LOG2E
  row0, col0 = c_ref[0] + iq * block_q, c_ref[1]

  def body(j, state):
    ks = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
    z = tm.summed_scores(
      lambda i: q_ref[i, qs, :].astype(dtype),
      lambda i: k_ref[i, ks, :].astype(dtype),
      layers,
      base2_scale,
      (block_q, block_k),
    )
    z = z + bias_ref[ks][None, :] * tm.LOG2E
    keep = None
    if spec.dropout:
      keep = _draw_keep(spec, i_ref, b, h, length, row0, col0 + j * block_k, (block_q, block_k))
    return tm.online_softmax_step(state, z, v_ref[ks, :], keep, spec.keep_prob, exp2)

  state = lax.fori_loop(0, cols // block_k, body, tm.initial_state(block_q, head_dim))
  out, (m, log_l) = tm.finish(state, jnp.log2)
  o_ref[...] = out.astype(o_ref.dtype)
  m_ref[...] = m[:, 0]
  log_l_ref[...] = log_l[:, 0]


def block_forward(q_stack, k_stack, v, bias, fparams, iparams, layer, origin, length, spec):
  """forward() on one block of a ring: (out [B, Lq, H, K], (m, log l) [B, H, Lq] float32 in
  base 2) of the queries q_stack [N, B, Lq, H, K] against the keys k_stack [N, B, Lk, H, K],
  v [B, Lk, H, K] and their padding bias [B, Lk]; slots <= layer (int32 [1]) summed. origin:
  uint32 [2], the block's first global row and column; length: the global sequence length
  (the dropout hash's row counter). The tiles are the spec's, capped at the block's lengths."""
  layers, batch, rows, heads, head_dim = q_stack.shape
  cols = k_stack.shape[2]
  block_q = min(spec.block_q, rows)
  block_k = min(spec.block_k, cols)
  if spec.dropout and block_k % DRAWS_PER_GENERATOR[spec.generator]:
    raise ValueError(
      f'block_forward: a {block_k}-column tile is not whole {spec.generator} hash words'
    )
  if rows % block_q or cols % block_k:
    raise ValueError(
      f'block_forward: tiles {spec.block_q}x{spec.block_k} do not divide a {rows}x{cols} block'
    )
  stack_spec = lambda n: pl.BlockSpec(
    (layers, None, n, None, head_dim), lambda _, b, h: (0, b, 0, h, 0)
  )
  in_specs = [
    stack_spec(rows),
    stack_spec(cols),
    _rows_spec(cols, head_dim),
    pl.BlockSpec((None, cols), lambda i, b, h: (b, 0)),
    pl.BlockSpec((None, 2), lambda i, b, h: (b, 0)),
    pl.BlockSpec((4,), lambda i, b, h: (0,)),
    pl.BlockSpec((1,), lambda i, b, h: (0,)),
    pl.BlockSpec((2,), lambda i, b, h: (0,)),
  ]
  out_shape, out_specs = _forward_outputs(batch, rows, heads, head_dim, v.dtype, block_q)
  out, m, log_l = pl.pallas_call(
    functools.partial(_block_forward_kernel, spec=spec, length=length),
    grid=(rows // block_q, batch, heads),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    interpret=spec.interpret,
    compiler_params=_compiler_params(head_dim),
    metadata=_forward_cost_of(spec, layers, batch, rows, cols, heads, head_dim, q_stack.dtype),
    name='realformer_qk_ring_block_fwd',
  )(q_stack, k_stack, v, bias, fparams, iparams, layer, origin)
  return out, (m, log_l)


# --- backward ----------------------------------------------------------------------------------


def _score_gradient_kernel(
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
  c_ref,
  ds_ref,
  dv_ref,
  *,
  spec: KernelSpec,
):
  """Program (jk, b, h): key rows col0 + jk * block of (b, h); writes dS[:, those columns]
  and their dV."""
  _, _, seq_len, head_dim = stack_ref.shape
  block, rows = spec.block_bwd, spec.backward_rows
  jk, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  scale, inv_div = f_ref[0], f_ref[1]
  layers = l_ref[0] + 1
  dtype = v_ref.dtype
  exp2 = _exp2(spec)
  k0 = c_ref[0] + jk * block  # the global first column of this program's keys
  ks = pl.ds(pl.multiple_of(k0, block), block)
  v, bias2 = v_ref[ks, :], bias_ref[ks][None, :] * tm.LOG2E
  base2_scale = scale * inv_div * tm.LOG2E  # z in base 2 (tile_math.py); dS stays natural

  def q_body(i, dv):
    qs = pl.ds(pl.multiple_of(i * rows, rows), rows)
    do = do_ref[qs, :]
    z = _tile_scores(stack_ref, layers, qs, ks, base2_scale, dtype, (rows, block)) + bias2
    keep = None
    if spec.dropout:
      keep = _draw_keep(spec, i_ref, b, h, seq_len, i * rows, k0, (rows, block))
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
    ds_ref[qs, :] = (dz * inv_div * scale).astype(ds_ref.dtype)  # d (q_i k_i^T), every i
    return dv + tm.t_dot(p_dropped, do)

  dv = lax.fori_loop(0, seq_len // rows, q_body, jnp.zeros((block, head_dim), jnp.float32))
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _score_gradient_cost(spec, stack, columns: int, resident_keys: bool = False) -> dict:
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  return _score_gradient_cost_of(
    spec, layers, batch, seq_len, columns, heads, head_dim, stack.dtype,
    resident_keys=resident_keys,
  )  # fmt: skip


def _score_gradient_cost_of(
  spec, layers, batch, rows, columns, heads, head_dim, dtype, block_outputs=False,
  resident_keys=False,
) -> dict:  # fmt: skip
  """The dS kernel's stated cost on `rows` queries against a panel of `columns` keys, a stack
  of `layers` slots in `dtype`. block_outputs: a ring block's kernel, which writes dV in
  float32 and the column sums of dz (the travelling padding bias's gradient: one float add per
  element, 4 bytes per column) besides. resident_keys: a program's keys of l + 1 layers are
  loaded once, not per query step (the Hopper dS kernel's: mosaic_gpu/qk_attention.py)."""
  elements = batch * heads * rows * columns
  mean_layers = (layers + 1) / 2
  itemsize = jnp.dtype(dtype).itemsize
  q_rows = batch * rows * heads * head_dim * itemsize
  panel_rows = batch * columns * heads * head_dim * itemsize
  dv_bytes = panel_rows // itemsize * (4 if block_outputs else itemsize)
  # Loads per [rows, block] tile: q and k of l + 1 layers (both inside the layer loop; the
  # keys once per program where resident), dO, and the three float32 row statistics (the
  # last two: `rows` rows each).
  step_rows, block = min(spec.backward_rows, rows), min(spec.block_bwd, columns)
  key_rows = rows if resident_keys else step_rows
  reloads = (
    head_dim * itemsize * mean_layers * (1 / key_rows + 1 / block)
    + (head_dim * itemsize + 12) / block
  )
  return _cost_metadata(
    elements,
    head_dim,
    rows,
    passes=mean_layers + 2,  # acc (l + 1 products), dO V^T, dV
    score_bytes=itemsize,  # dS written once, in the compute dtype
    # q of l + 1 layers and dO (all rows); the panel's k of l + 1 layers, v and dV
    row_bytes=(mean_layers + 1) * q_rows
    + (mean_layers + 1) * panel_rows
    + dv_bytes
    + 4 * batch * heads * columns * block_outputs,
    float_ops=14 + mean_layers + 4 * spec.dropout + block_outputs,
    exps=1,
    int_ops=HASH_OPS_PER_ELEMENT[spec.generator] + 2 if spec.dropout else 0,
    reloads=reloads,
    tile=step_rows * block,
  )


def _score_gradient(stack, v, do, lse, delta, bias, fparams, iparams, layer, col0, columns, spec):
  """(dS [B, H, L, columns] in v's dtype, dV [B, columns, H, K]) of the key columns
  col0 .. col0 + columns (col0: int32 [1], a multiple of the tile)."""
  _, layers, batch, seq_len, heads, head_dim = stack.shape
  block = spec.block_bwd
  stat_spec = pl.BlockSpec((None, None, seq_len), lambda j, b, h: (b, h, 0))
  in_specs = [
    _stack_spec(layers, seq_len, head_dim),
    _rows_spec(seq_len, head_dim),
    _rows_spec(seq_len, head_dim),
    stat_spec,
    stat_spec,
    stat_spec,
    pl.BlockSpec((None, seq_len), lambda j, b, h: (b, 0)),
    pl.BlockSpec((None, 2), lambda j, b, h: (b, 0)),
    pl.BlockSpec((4,), lambda j, b, h: (0,)),
    pl.BlockSpec((1,), lambda j, b, h: (0,)),
    pl.BlockSpec((1,), lambda j, b, h: (0,)),
  ]
  out_shape = [
    jax.ShapeDtypeStruct((batch, heads, seq_len, columns), v.dtype),
    jax.ShapeDtypeStruct((batch, columns, heads, head_dim), v.dtype),
  ]
  out_specs = [
    pl.BlockSpec((None, None, seq_len, block), lambda j, b, h: (b, h, 0, j)),
    pl.BlockSpec((None, block, None, head_dim), lambda j, b, h: (b, j, h, 0)),
  ]
  return pl.pallas_call(
    functools.partial(_score_gradient_kernel, spec=spec),
    grid=(columns // block, batch, heads),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    interpret=spec.interpret,
    compiler_params=_compiler_params(head_dim, score_gradient=True),
    metadata=_score_gradient_cost(spec, stack, columns),
    name='realformer_qk_attention_ds',
  )(stack, v, do, *lse, delta, bias, fparams, iparams, layer, col0)


def slot_buckets(layers: int) -> tuple[int, ...]:
  """Static slot counts the backward's matmuls run at: the smallest >= l + 1 is taken, so
  they multiply at most ~N/8 unused slots on average instead of ~N/2 (a `lax.switch`)."""
  if layers < 8:
    return (layers,)
  return tuple(sorted({math.ceil(layers * j / 4) for j in range(1, 5)}))


def wave_fill(programs: int, sms: int) -> float:
  """The share of the program slots `programs` use over the waves they take on `sms` SMs (one
  program an SM at a time: these kernels hold ~170-255 registers a thread)."""
  return programs / (math.ceil(programs / sms) * sms)


def column_panels(
  batch: int, heads: int, seq_len: int, itemsize: int, block: int, sms: int, rows: int = 0
) -> int:
  """Columns per dS panel: 0 when every (batch, head) and column fits DS_PANEL_BYTES at once
  (one panel of B H L / block programs), else one (batch, head) at a time in panels of the
  fewest columns (a multiple of `block` dividing L) whose C / block programs fill PANEL_FILL
  of `sms` SMs' slots; where none does (L / block programs are too few), the columns that fill
  the most (all L at best). `rows`: the query rows of a ring's block (0: seq_len, square)."""
  if batch * heads * (rows or seq_len) * seq_len * itemsize <= DS_PANEL_BYTES:
    return 0
  candidates = [c for c in range(block, seq_len + 1, block) if seq_len % c == 0]
  for columns in candidates:
    if wave_fill(columns // block, sms) >= PANEL_FILL:
      return columns
  return max(candidates, key=lambda c: wave_fill(c // block, sms))  # the first: fewest columns


def backward(
  stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec: KernelSpec,
  score_gradient=None,
):  # fmt: skip
  """(dV [B, L, H, K], g_stack + this layer's gradient of every stacked q_i, k_i, i <= l, in
  g_stack's dtype). The dropout mask is drawn again from `iparams`' key words (`bits` is None
  from this module's forward). `score_gradient`: another backend's dS kernel with
  _score_gradient's signature (the Hopper one: mosaic_gpu/qk_attention.py), this file's where
  None; the GEMMs and panels around it are these."""
  del bits
  at = lambda slots, layer, g_stack: _backward_at(
    slots, stack, v, do, lse, delta, bias, fparams, iparams, layer, g_stack, spec, score_gradient
  )
  return _by_slot_bucket(stack.shape[1], layer, at, g_stack)


def _by_slot_bucket(layers: int, layer, at, operand):
  """at(slots, layer, operand) at the smallest of slot_buckets(layers) >= l + 1 (a lax.switch
  over the buckets; layer: int32 [1])."""
  buckets = slot_buckets(layers)
  branches = [functools.partial(at, slots) for slots in buckets]
  if len(branches) == 1:
    return branches[0](layer, operand)
  index = jnp.searchsorted(jnp.asarray(buckets), layer[0] + 1)  # first bucket >= l + 1
  return lax.switch(index, branches, layer, operand)


def _backward_at(
  slots, stack, v, do, lse, delta, bias, fparams, iparams, layer, g_stack, spec, score_gradient
):  # fmt: skip
  """The backward with the matmuls over slots 0 .. slots - 1 (slots >= l + 1)."""
  score_gradient = score_gradient or _score_gradient
  _, _, batch, seq_len, heads, head_dim = stack.shape
  used = (jnp.arange(slots) <= layer[0]).astype(stack.dtype)[:, None, None, None, None]
  columns = column_panels(batch, heads, seq_len, v.dtype.itemsize, spec.block_bwd, device_sms())
  if not columns:  # one panel: every head, every column
    ds, dv = score_gradient(
      stack,
      v,
      do,
      lse,
      delta,
      bias,
      fparams,
      iparams,
      layer,
      jnp.zeros((1,), jnp.int32),
      seq_len,
      spec,
    )
    q_n, k_n = (stack[part, :slots] * used for part in range(2))
    dq = jnp.einsum(
      'bhqv,nbvhk->nbqhk', ds, k_n.astype(ds.dtype), preferred_element_type=jnp.float32
    )
    dk = jnp.einsum(
      'bhqv,nbqhk->nbvhk', ds, q_n.astype(ds.dtype), preferred_element_type=jnp.float32
    )
    grads = jnp.stack([dq, dk])
    g_stack = g_stack.at[:, :slots].add(grads.astype(g_stack.dtype))
    return dv, g_stack
  return _backward_by_head(
    slots, used, columns, stack, v, do, lse, delta, bias, fparams, iparams, layer, g_stack, spec,
    score_gradient,
  )  # fmt: skip


def _backward_by_head(
  slots, used, columns, stack, v, do, lse, delta, bias, fparams, iparams, layer, g_stack, spec,
  score_gradient,
):  # fmt: skip
  """One (batch, head) at a time, its key columns in panels of `columns` (a loop in XLA): the
  dS panel is [L, columns] (column_panels). dK_i of a panel's columns is complete
  (a product over every row); dQ_i sums over the panels in a float32 [N, L, K] accumulator."""
  _, _, batch, seq_len, heads, head_dim = stack.shape
  panels = seq_len // columns
  m, log_l = lse

  def head(bh, carry):
    dv_all, g_all = carry
    b, h = bh // heads, bh % heads

    def one(x, axis_b, axis_h):  # the (b, h) slice, keeping size-1 batch and head axes
      x = lax.dynamic_slice_in_dim(x, b, 1, axis_b)
      return x if axis_h is None else lax.dynamic_slice_in_dim(x, h, 1, axis_h)

    stack_h = one(stack, 2, 4)  # [2, N, 1, L, 1, K]
    v_h, do_h = one(v, 0, 2), one(do, 0, 2)
    lse_h = (one(m, 0, 1), one(log_l, 0, 1))
    delta_h, bias_h, f_h = one(delta, 0, 1), one(bias, 0, None), one(fparams, 0, None)
    # the dropout counters of the global (b, h): offsets as a shard's (spec.py)
    i_h = iparams.at[2].add(b.astype(jnp.uint32)).at[3].add(h.astype(jnp.uint32))
    q_n, k_n = (stack_h[part, :slots] * used for part in range(2))

    def panel(c, carry):
      dq, dv_h, g_k = carry
      col0 = c * columns
      ds, dv_c = score_gradient(
        stack_h,
        v_h,
        do_h,
        lse_h,
        delta_h,
        bias_h,
        f_h,
        i_h,
        layer,
        jnp.reshape(col0, (1,)).astype(jnp.int32),
        columns,
        spec,
      )
      ds = ds.astype(v.dtype)
      k_c = lax.dynamic_slice_in_dim(k_n, col0, columns, 2).astype(ds.dtype)
      dq = dq + jnp.einsum('bhqv,nbvhk->nbqhk', ds, k_c, preferred_element_type=jnp.float32)
      dk_c = jnp.einsum(
        'bhqv,nbqhk->nbvhk', ds, q_n.astype(ds.dtype), preferred_element_type=jnp.float32
      )
      old = lax.dynamic_slice_in_dim(g_k, col0, columns, 2)
      g_k = lax.dynamic_update_slice_in_dim(g_k, old + dk_c.astype(g_k.dtype), col0, 2)
      dv_h = lax.dynamic_update_slice_in_dim(dv_h, dv_c, col0, 1)
      return dq, dv_h, g_k

    g_h = one(g_all, 2, 4)[:, :slots]  # [2, slots, 1, L, 1, K]
    dq0 = jnp.zeros(g_h.shape[1:], jnp.float32)
    dq, dv_h, g_k = lax.fori_loop(0, panels, panel, (dq0, jnp.zeros_like(v_h), g_h[1]))
    g_h = jnp.stack([(g_h[0].astype(jnp.float32) + dq).astype(g_all.dtype), g_k])
    zero = jnp.zeros((), jnp.int32)
    g_all = lax.dynamic_update_slice(g_all, g_h, (zero, zero, b, zero, h, zero))
    dv_all = lax.dynamic_update_slice(dv_all, dv_h, (b, zero, h, zero))
    return dv_all, g_all

  return lax.fori_loop(0, batch * heads, head, (jnp.zeros_like(v), g_stack))


# --- one block of a ring, backward (kernels/score_paths/ring_attention.py) ----------------------


def _block_score_gradient_kernel(
  q_ref,
  k_ref,
  v_ref,
  do_ref,
  m_ref,
  log_l_ref,
  delta_ref,
  bias_ref,
  f_ref,
  i_ref,
  l_ref,
  c_ref,
  ds_ref,
  dv_ref,
  dbias_ref,
  *,
  spec: KernelSpec,
  length: int,
  block: int,
  rows: int,
):
  """_score_gradient_kernel on one block of the global [L, L] scores. Program (jk, b, h) owns
  the block's key rows c_ref[2] + jk * block (k_ref: the block's keys, [N, Lk, K]) and walks
  every query row of q_ref ([N, Lq, K]); the dropout hash takes the block's global origin
  (c_ref[0]: first row, c_ref[1]: first column) and the global length, so the mask is the
  one-device mask's block. Writes dS = dz / divisor WITHOUT the score scale (the matmuls after
  it apply the scale and form its gradient from the same product), dV in float32 (summed over
  the ring's blocks) and the column sums of dz (the travelling padding bias's gradient)."""
  _, rows_total, head_dim = q_ref.shape
  jk, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  scale, inv_div = f_ref[0], f_ref[1]
  layers = l_ref[0] + 1
  dtype = v_ref.dtype
  exp2 = _exp2(spec)
  k0 = c_ref[2] + jk * block  # this program's first key row in the block
  ks = pl.ds(pl.multiple_of(k0, block), block)
  v, bias2 = v_ref[ks, :], bias_ref[ks][None, :] * tm.LOG2E
  base2_scale = scale * inv_div * tm.LOG2E  # z in base 2 (tile_math.py); dS stays natural

  def q_body(i, carry):
    dv, dbias = carry
    qs = pl.ds(pl.multiple_of(i * rows, rows), rows)
    z = tm.summed_scores(
      lambda n: q_ref[n, qs, :].astype(dtype),
      lambda n: k_ref[n, ks, :].astype(dtype),
      layers,
      base2_scale,
      (rows, block),
    )
    keep = None
    if spec.dropout:
      keep = _draw_keep(
        spec, i_ref, b, h, length, c_ref[0] + i * rows, c_ref[1] + k0, (rows, block)
      )
    p_dropped, dz = tm.score_gradient(
      z + bias2,
      (m_ref[qs][:, None], log_l_ref[qs][:, None]),
      delta_ref[qs][:, None],
      do_ref[qs, :],
      v,
      keep,
      spec.keep_prob,
      exp2,
    )
    ds_ref[qs, :] = (dz * inv_div).astype(ds_ref.dtype)  # d (sum_i q_i k_i^T) / scale
    return dv + tm.t_dot(p_dropped, do_ref[qs, :]), dbias + jnp.sum(dz, axis=0)

  dv, dbias = lax.fori_loop(
    0,
    rows_total // rows,
    q_body,
    (jnp.zeros((block, head_dim), jnp.float32), jnp.zeros((block,), jnp.float32)),
  )
  dv_ref[...] = dv
  dbias_ref[...] = dbias


def _block_score_gradient(
  q_n, k_n, v, do, stats2, delta, bias, fparams, iparams, layer, coords, columns, length, spec,
  stack_layers,
):  # fmt: skip
  """(dS [B, H, Lq, columns] in v's dtype, dV [B, columns, H, K] and the bias gradient [B, H,
  columns], float32) of the block's key columns coords[2] .. coords[2] + columns (a multiple of
  the tile); coords: int32 [3], the block's global first row and column, then that local
  column. stats2: the rows' global (m, log l) in base 2; length: the global sequence length;
  stack_layers: N of the whole stack (its cost counts the mean l + 1 over it, as the one-device
  dS kernel's: each slot bucket's call site states the same mean)."""
  layers, batch, rows, heads, head_dim = q_n.shape
  cols = k_n.shape[2]
  block, step_rows = min(spec.block_bwd, columns), min(spec.backward_rows, rows)
  if spec.dropout and block % DRAWS_PER_GENERATOR[spec.generator]:
    raise ValueError(
      f'block_backward: a {block}-column tile is not whole {spec.generator} hash words'
    )
  if rows % step_rows or columns % block:
    raise ValueError(
      f'block_backward: tiles {step_rows}x{block} do not divide a {rows}x{columns} panel'
    )
  stack = lambda n: pl.BlockSpec((layers, None, n, None, head_dim), lambda j, b, h: (0, b, 0, h, 0))
  stat_spec = pl.BlockSpec((None, None, rows), lambda j, b, h: (b, h, 0))
  in_specs = [
    stack(rows),
    stack(cols),
    _rows_spec(cols, head_dim),
    _rows_spec(rows, head_dim),
    stat_spec,
    stat_spec,
    stat_spec,
    pl.BlockSpec((None, cols), lambda j, b, h: (b, 0)),
    pl.BlockSpec((None, 2), lambda j, b, h: (b, 0)),
    pl.BlockSpec((4,), lambda j, b, h: (0,)),
    pl.BlockSpec((1,), lambda j, b, h: (0,)),
    pl.BlockSpec((3,), lambda j, b, h: (0,)),
  ]
  out_shape = [
    jax.ShapeDtypeStruct((batch, heads, rows, columns), v.dtype),
    jax.ShapeDtypeStruct((batch, columns, heads, head_dim), jnp.float32),
    jax.ShapeDtypeStruct((batch, heads, columns), jnp.float32),
  ]
  out_specs = [
    pl.BlockSpec((None, None, rows, block), lambda j, b, h: (b, h, 0, j)),
    pl.BlockSpec((None, block, None, head_dim), lambda j, b, h: (b, j, h, 0)),
    pl.BlockSpec((None, None, block), lambda j, b, h: (b, h, j)),
  ]
  kernel = functools.partial(
    _block_score_gradient_kernel, spec=spec, length=length, block=block, rows=step_rows
  )
  return pl.pallas_call(
    kernel,
    grid=(columns // block, batch, heads),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    interpret=spec.interpret,
    compiler_params=_compiler_params(head_dim, score_gradient=True),
    metadata=_score_gradient_cost_of(
      spec, stack_layers, batch, rows, columns, heads, head_dim, q_n.dtype, block_outputs=True
    ),
    name='realformer_qk_ring_block_ds',
  )(q_n, k_n, v, do, *stats2, delta, bias, fparams, iparams, layer, coords)


def block_backward(
  q_stack, k_stack, v, do, stats, delta, bias, fparams, iparams, layer, origin, length, grads, spec
):
  """block_forward's backward on one block of a ring, added into the ring's float32 gradients
  grads = (dq [N, B, Lq, H, K], dk [N, B, Lk, H, K], dv [B, Lk, H, K], dbias [B, Lk], dscale
  [B]) and returned: the stacked queries' and keys' of slots <= layer (the slots above get
  nothing: block_forward does not read them), v's, the padding bias's, the score scale's.
  stats: the rows' GLOBAL (m, log l) [B, H, Lq], natural units (the ring's merged statistics);
  delta [B, H, Lq]: rowsum(dO * out) of the global output; do [B, Lq, H, K] in the compute
  dtype; the rest as block_forward's. backward()'s two steps: the dS kernel on the block, in
  column panels (column_panels: every (batch, head) at once where that fits, else one at a time
  in panels that fill the SMs), then XLA's matmuls over the stacked slots (slot_buckets)."""
  at = lambda slots, layer, grads: _block_backward_at(
    slots, q_stack, k_stack, v, do, tm.to_base2(stats), delta, bias, fparams, iparams, layer,
    origin, length, grads, spec,
  )  # fmt: skip
  return _by_slot_bucket(q_stack.shape[0], layer, at, grads)


def _block_backward_at(
  slots, q_stack, k_stack, v, do, stats2, delta, bias, fparams, iparams, layer, origin, length,
  grads, spec,
):  # fmt: skip
  """block_backward with the matmuls over slots 0 .. slots - 1 (slots >= l + 1)."""
  _, batch, rows, heads, _ = q_stack.shape
  cols = k_stack.shape[2]
  used = (jnp.arange(slots) <= layer[0]).astype(q_stack.dtype)[:, None, None, None, None]
  q_n, k_n = q_stack[:slots] * used, k_stack[:slots] * used
  block = min(spec.block_bwd, cols)
  columns = column_panels(batch, heads, cols, v.dtype.itemsize, block, device_sms(), rows=rows)
  group_b, group_h, columns = (batch, heads, cols) if not columns else (1, 1, columns)
  head_groups = heads // group_h

  def group(g, grads):
    """Batch rows b .. b + group_b and heads h .. h + group_h: all of them, or one of each."""
    b, h = (g // head_groups) * group_b, (g % head_groups) * group_h
    zero = jnp.zeros((), jnp.int32)

    def part(x, axis_b, axis_h):
      x = lax.dynamic_slice_in_dim(x, b, group_b, axis_b)
      return x if axis_h is None else lax.dynamic_slice_in_dim(x, h, group_h, axis_h)

    q_g, k_g, v_g, do_g = part(q_n, 1, 3), part(k_n, 1, 3), part(v, 0, 2), part(do, 0, 2)
    stats_g, delta_g = tuple(part(x, 0, 1) for x in stats2), part(delta, 0, 1)
    bias_g, f_g = part(bias, 0, None), part(fparams, 0, None)
    # the dropout counters of the global (b, h): offsets as a shard's (spec.py)
    i_g = iparams.at[2].add(b.astype(jnp.uint32)).at[3].add(h.astype(jnp.uint32))
    scale_g = f_g[:, 0][None, :, None, None, None]
    g_q, g_k, g_v, g_bias, g_scale = grads

    def panel(c, carry):
      dq, dk, dv, dbias = carry
      col0 = c * columns
      coords = jnp.stack([origin[0], origin[1], col0]).astype(jnp.int32)
      ds, dv_c, dbias_c = _block_score_gradient(
        q_g, k_g, v_g, do_g, stats_g, delta_g, bias_g, f_g, i_g, layer, coords, columns, length,
        spec, q_stack.shape[0],
      )  # fmt: skip
      k_c = lax.dynamic_slice_in_dim(k_g, col0, columns, 2).astype(ds.dtype)
      dq = dq + jnp.einsum('bhqv,nbvhk->nbqhk', ds, k_c, preferred_element_type=jnp.float32)
      dk_c = jnp.einsum(
        'bhqv,nbqhk->nbvhk', ds, q_g.astype(ds.dtype), preferred_element_type=jnp.float32
      )
      add = lambda total, part, axis: lax.dynamic_update_slice_in_dim(
        total, lax.dynamic_slice_in_dim(total, col0, columns, axis) + part, col0, axis
      )
      return dq, add(dk, dk_c * scale_g, 2), add(dv, dv_c, 1), add(dbias, dbias_c.sum(1), 1)

    dq, dk, dv, dbias = lax.fori_loop(
      0,
      cols // columns,
      panel,
      (jnp.zeros(q_g.shape, jnp.float32), part(g_k[:slots], 1, 3), part(g_v, 0, 2),
       part(g_bias, 0, None)),
    )  # fmt: skip
    # dS carries no scale: d scale = sum_i <q_i, dS K_i>, and dQ_i = scale dS K_i
    dscale = jnp.einsum('nbqhk,nbqhk->b', q_g.astype(jnp.float32), dq)
    dq = part(g_q[:slots], 1, 3) + dq * scale_g
    at = lambda *index: tuple(jnp.asarray(i, jnp.int32) for i in index)
    return (
      lax.dynamic_update_slice(g_q, dq, at(zero, b, zero, h, zero)),
      lax.dynamic_update_slice(g_k, dk, at(zero, b, zero, h, zero)),
      lax.dynamic_update_slice(g_v, dv, at(b, zero, h, zero)),
      lax.dynamic_update_slice(g_bias, dbias, at(b, zero)),
      lax.dynamic_update_slice_in_dim(
        g_scale, lax.dynamic_slice_in_dim(g_scale, b, group_b) + dscale, b, 0
      ),
    )

  groups = (batch // group_b) * head_groups
  return lax.fori_loop(0, groups, group, grads)

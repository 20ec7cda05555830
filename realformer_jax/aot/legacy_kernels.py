"""What the residual_carry='qk' Triton kernels of before issue 40 did and did not state: their L2
traffic and atomic updates, stated on their behalf so the estimator can cost the program that
was measured on an H200 (benchmarks/qk_calibration.py) after the kernels were redesigned.

Those kernels (commit QK_KERNELS_COMMIT, realformer_jax/kernels/backends/triton/qk_attention.py
there)
stated their matmul FLOPs, HBM bytes and element-wise work (the dropout hash included) in their
metadata, but not:

forward   `realformer_qk_attention_fwd`, grid (L / block_q, B, H): for every key block of a
          program and every layer i <= l it loads layer i's float32 query tile [block_q, K] and
          key tile [block_k, K] again (the layer loop is dynamic, inside the key loop):
          4 K (block_q + block_k) (l + 1) bytes per tile pair through L2.
backward  `realformer_qk_attention_bwd`, grid (L / block, B, H): for every query block a
          program walks it rebuilds the scores from every layer's float32 q, k tiles
          (8 block K (l + 1) bytes), then for every layer n <= l loads q_n and k_n again
          (8 block K), reads and writes its own rows of dK_n (8 block K) and adds ds K_n into
          dQ_n by `atomic_add`: block x K float32 atomic updates (acq_rel, gpu scope), shared
          rows with the programs of every other key block.

Per call, with P = B H (L / block)^2 tile pairs and the rolled scan's mean layer
l + 1 = (N + 1) / 2 (as the kernels' own stated cost counts it):
    backward atomics = P (l + 1) block K = B H L^2 K (l + 1) / block,
    backward L2 bytes = P (l + 1) 24 block K, forward L2 bytes = P_fwd (l + 1) 4 K (bq + bk).
At BERT-Base, L = 65,536, block 64: 4.0e12 atomic updates a step, as issue 40 counted.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from realformer_jax.aot.hlo_text import Instruction

# The code the H200 measured (issue 40): main when the calibration was made. Its qk kernels
# are the ones described above.
QK_KERNELS_COMMIT = 'eaf81ca'
FORWARD = 'realformer_qk_attention_fwd'
BACKWARD = 'realformer_qk_attention_bwd'
F32_BYTES = 4


def _grid_x(config: str) -> Optional[int]:
  match = re.search(r'grid_x = (\d+)', config)
  return int(match.group(1)) if match else None


def _kernel(config: str) -> Optional[str]:
  match = re.search(r'name = \\?"(realformer_qk_attention_(?:fwd|bwd))\\?"', config)
  return match.group(1) if match else None


def _stack(ins: Instruction) -> Optional[tuple[int, ...]]:
  """[2, N, B, L, H, K] of the float32 stack operand, from the call's operand layouts."""
  layouts = ins.attribute('operand_layout_constraints') or ''
  match = re.search(r'f32\[2,(\d+),(\d+),(\d+),(\d+),(\d+)\]', layouts)
  return (2,) + tuple(int(d) for d in match.groups()) if match else None


def qk_work(
  kernel: str,
  layers: int,
  batch: int,
  seq_len: int,
  heads: int,
  head_dim: int,
  block_rows: int,
  block_cols: int,
) -> dict:
  """{'l2_bytes', 'atomics'} of one call of the old qk `kernel` (module docstring).
  block_rows x block_cols: the forward's [block_q, block_k] tiles, the backward's square one."""
  mean_layers = (layers + 1) / 2
  pairs = batch * heads * (seq_len // block_rows) * (seq_len // block_cols)
  if kernel == FORWARD:
    tiles = F32_BYTES * head_dim * (block_rows + block_cols)
    return {'l2_bytes': pairs * mean_layers * tiles, 'atomics': 0.0}
  tile = F32_BYTES * block_rows * head_dim
  # rebuild the scores (q_i, k_i), the layer loop's q_n, k_n, dK_n read and written
  return {
    'l2_bytes': pairs * mean_layers * 6 * tile,
    'atomics': pairs * mean_layers * block_rows * head_dim,
  }


# The old kernels' tiles (kernels/plumbing/select.py then): forward 128 x 64, backward 64 x 64,
# each side
# the largest power of two <= its cap that divides L. The grid gives the rows; the forward's
# columns follow from L.
FORWARD_BLOCK_COLS = 64


def costs_on_behalf(ins: Instruction) -> Optional[dict]:
  """roofline.estimate(costs_on_behalf=...): the old qk kernels' L2 bytes and atomics; None
  for every other instruction."""
  config = ins.attribute('backend_config') or ''
  kernel = _kernel(config)
  stack = _stack(ins)
  grid = _grid_x(config)
  if kernel is None or stack is None or not grid:
    return None
  _, layers, batch, seq_len, heads, head_dim = stack
  rows = seq_len // grid
  cols = math.gcd(seq_len, FORWARD_BLOCK_COLS) if kernel == FORWARD else rows
  return qk_work(kernel, layers, batch, seq_len, heads, head_dim, rows, cols)

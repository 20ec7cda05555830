"""What a kernel of a compiled train step is for, from its HLO alone: the categories of the
estimate's tables (roofline.py) and of the benchmark's top-kernel lists. The opcode lists here
(MOVEMENT_OPS, BOOKKEEPING_OPS, COLLECTIVE_OPS) are also the measured trace breakdown's
(benchmarks/trace_breakdown.py), so estimate and measurement sort ops alike.

Rules, first match wins:

  collectives                all-reduce / all-gather / reduce-scatter / all-to-all / permute
  fused attention            a kernel backend's custom call (its record's hlo_calls:
                             cuDNN flash attention, Pallas Triton / Mosaic kernels)
  GEMM                       anything that multiplies matrices (dot, convolution, cuBLAS)
  scatter                    contains a scatter (e.g. an embedding-table gradient)
  dropout bits               a Threefry hash (xor + logical shifts, or jax's threefry kernel)
  optimizer                  traced from optax or the project's train/build.py (clipping,
                             AdamW moments and update)
  copies & layout            only moves data: copy, transpose, (dynamic-)slice and
                             dynamic-update-slice (a rolled scan's per-layer stacking), pad,
                             concatenate, broadcast (zero-fills)
  score-sized element-wise   computes on an array whose last two dims are the attention
                             scores' [.., L, L] (`score_dims`)
  other element-wise         the rest: norms, activations, biases, reductions
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from realformer_jax.aot.hlo_text import Array
from realformer_jax.kernels import backends

COLLECTIVES = 'collectives'
ATTENTION = 'fused attention'
GEMM = 'GEMM'
SCATTER = 'scatter'
DROPOUT_BITS = 'dropout bits'
OPTIMIZER = 'optimizer'
SCORES = 'score-sized element-wise'
COPIES = 'copies & layout'
ELEMENTWISE = 'other element-wise'

# Ops that only move, reorder or reinterpret data.
MOVEMENT_OPS = frozenset(
  {
    'copy',
    'copy-start',
    'copy-done',
    'transpose',
    'dynamic-slice',
    'dynamic-update-slice',
    'slice',
    'concatenate',
    'pad',
    'broadcast',
    'reshape',
    'bitcast',
    'reverse',
    'gather',
  }
)
# Ops that compute nothing: a kernel of these and MOVEMENT_OPS only moves data.
BOOKKEEPING_OPS = frozenset({'parameter', 'constant', 'tuple', 'get-tuple-element', 'iota'})
# Ops that start a collective (an async one's '-done' half only waits for it).
COLLECTIVE_OPS = frozenset(
  {
    'all-reduce',
    'all-reduce-start',
    'all-gather',
    'all-gather-start',
    'reduce-scatter',
    'reduce-scatter-start',
    'all-to-all',
    'all-to-all-start',
    'collective-permute',
    'collective-permute-start',
    'collective-broadcast',
    'ragged-all-to-all',
  }
)
THREEFRY_CALLS = ('cu_threefry2x32', 'threefry2x32')


@dataclasses.dataclass(frozen=True)
class KernelFacts:
  """What the categorisation looks at."""

  opcodes: frozenset  # every opcode inside the kernel (a fusion's body included)
  custom_call_target: Optional[str]
  matmul_flops: float
  is_collective: bool
  arrays: Sequence[Array]  # the kernel's operands and results
  source_files: frozenset  # Python files the kernel's instructions were traced from


def categorize(facts: KernelFacts, score_dims: Optional[tuple[int, int]] = None) -> str:
  target = facts.custom_call_target or ''
  if facts.is_collective:
    return COLLECTIVES
  if target.startswith(backends.hlo_calls()):  # each backend's record names its calls
    return ATTENTION
  if facts.matmul_flops > 0:
    return GEMM
  if 'scatter' in facts.opcodes:
    return SCATTER
  if target.startswith(THREEFRY_CALLS) or {'xor', 'shift-right-logical'} <= facts.opcodes:
    return DROPOUT_BITS
  if any('/optax/' in f or f.endswith('train/build.py') for f in facts.source_files):
    return OPTIMIZER
  if facts.opcodes and facts.opcodes <= MOVEMENT_OPS | BOOKKEEPING_OPS:
    return COPIES
  if touches(facts.arrays, score_dims):
    return SCORES
  return ELEMENTWISE


def touches(arrays: Sequence[Array], score_dims: Optional[tuple[int, int]]) -> bool:
  """Whether any of `arrays` is attention-score sized: last two dims == score_dims."""
  return bool(score_dims) and any(
    len(a.dims) >= 2 and tuple(a.dims[-2:]) == tuple(score_dims) for a in arrays
  )

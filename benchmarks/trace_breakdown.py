"""Where a compiled step's device time goes, by category, from a profiler trace.

    categories = categorize_hlo(compiled.as_text(), score_dims=(512, 512))
    times = device_time_by_category(xplane_path, categories)   # {category: seconds}

1. The optimized HLO (`compiled.as_text()`) says what every instruction is: a matmul (dot,
   convolution, a fusion around one, a cuBLAS / cuDNN custom call), a scatter, data movement
   (copy, transpose, dynamic-(update-)slice, the stacking a rolled layer scan does), a
   collective, or other element-wise / reduction work; the latter is split further when it
   touches an attention-score-sized tensor (trailing dims `score_dims`).
2. The trace (`jax.profiler.trace`, an XSpace `.xplane.pb`, read with jax's own
   `ProfileData`, no TensorBoard needed) gives device time per executed op: GPU kernels on the
   '/device:GPU:*' planes, TPU ops on '/device:TPU:*', XLA:CPU thunks on '/host:CPU' threads.
   An event names its HLO op in its `hlo_op` stat; kernels that ran inside a CUDA graph (command
   buffer) carry only their kernel name, which is matched to the fusion of the same name
   ('fusion.12' emits 'fusion_12'); cuBLAS / cuDNN kernels by their library names.
Time in nothing that matched is reported as 'unattributed', so the categories always add up to
the traced device time.
"""

from __future__ import annotations

import collections
import re
from typing import Optional, Sequence

import jax

from realformer_jax.aot import categories as aot_categories

MATMUL, SCATTER, MOVEMENT, COLLECTIVE = 'matmul', 'scatter', 'copies & layout', 'collectives'
SCORES, OTHER, UNATTRIBUTED = (
  'elementwise/reduce on [.., L, L]',
  'elementwise/reduce (other)',
  'unattributed',
)
CATEGORIES = (MATMUL, SCORES, OTHER, SCATTER, MOVEMENT, COLLECTIVE, UNATTRIBUTED)
_CONTAINER = None  # while / call / conditional: their time is their body's ops' time

_MATMUL_OPS = {'dot', 'convolution', 'ragged-dot'}
# The estimate's lists (realformer_jax/aot/categories.py). A collective's device time is also
# in its '-done' half and in point-to-point transfers.
_COLLECTIVE_OPS = (
  aot_categories.COLLECTIVE_OPS
  | {op.replace('-start', '-done') for op in aot_categories.COLLECTIVE_OPS if op.endswith('-start')}
  | {'send', 'recv', 'send-done', 'recv-done'}
)
# A data-movement fusion may also hold its own opcode and a dynamic slice's scalar index
# arithmetic (the estimate drops scalar instructions; this parser keeps them).
_MOVEMENT_ONLY = (
  aot_categories.MOVEMENT_OPS
  | aot_categories.BOOKKEEPING_OPS
  | {'fusion', 'convert', 'select', 'compare'}
)
_CONTAINER_OPS = {
  'while',
  'conditional',
  'call',
  'async-start',
  'async-done',
  'parameter',
  'tuple',
  'get-tuple-element',
  'constant',
}
# Library kernels (no HLO name inside CUDA graphs): cuBLAS / cuBLASLt / CUTLASS / cuDNN names.
_MATMUL_KERNELS = re.compile(r'gemm|xmma|nvjet|cutlass|cublas|matmul|cudnn|flash|fmha', re.I)
_MOVEMENT_KERNELS = re.compile(r'memcpy|memset|copy', re.I)

_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$')
_COMPUTATION = re.compile(r'^%?([\w.\-]+)\s.*\{\s*$')
_SHAPE = re.compile(r'\[([\d,]+)\]')


def _opcodes_by_computation(hlo_text: str) -> tuple[dict, list]:
  """({computation: set of opcodes (nested calls flattened)}, [(name, opcode, line, calls)])."""
  computations: dict[str, set] = {}
  calls: dict[str, list] = {}
  instructions = []
  current: Optional[str] = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and '=' not in line.split('{')[0].split('->')[0].split('(')[0]:
      current = header.group(1)
      computations[current], calls[current] = set(), []
      continue
    if line.strip() == '}':
      current = None
      continue
    match = _INSTRUCTION.match(line)
    if not match or current is None:
      continue
    name, _, opcode, rest = match.groups()
    called = re.findall(r'(?:calls|to_apply|body|condition)=%?([\w.\-]+)', rest)
    computations[current].add(opcode)
    calls[current].extend(called)
    target = re.search(r'custom_call_target="([^"]+)"', rest)
    instructions.append((name, opcode, line, called, target.group(1) if target else '', current))
  # Flatten nested calls (a fusion calling a reduction region, a while body's fusions...).
  flat: dict[str, set] = {}

  def ops(computation, seen=()):
    if computation in flat:
      return flat[computation]
    result = set(computations.get(computation, ()))
    for child in calls.get(computation, ()):
      if child not in seen:
        result |= ops(child, seen + (computation,))
    flat[computation] = result
    return result

  for computation in computations:
    ops(computation)
  return flat, instructions


def categorize_hlo(hlo_text: str, score_dims: Optional[Sequence[int]] = None) -> dict[str, str]:
  """{HLO instruction name: category} for every instruction that can run as its own op."""
  computation_ops, instructions = _opcodes_by_computation(hlo_text)
  fused = {
    c for name, opcode, _, called, _, _ in instructions if opcode == 'fusion' for c in called
  }
  categories = {}
  for name, opcode, line, called, target, computation in instructions:
    if computation in fused:
      continue  # runs inside its fusion
    if opcode in _CONTAINER_OPS:
      categories[name] = _CONTAINER  # only sequences other ops
      continue
    inner = set().union(*(computation_ops.get(c, set()) for c in called)) if called else set()
    ops = inner | {opcode}
    if ops & _MATMUL_OPS or (opcode == 'custom-call' and _MATMUL_KERNELS.search(target)):
      category = MATMUL
    elif ops & _COLLECTIVE_OPS:
      category = COLLECTIVE
    elif 'scatter' in ops:
      category = SCATTER
    elif ops <= _MOVEMENT_ONLY and ops & aot_categories.MOVEMENT_OPS:
      category = MOVEMENT
    elif 'dynamic-update-slice' in ops:
      category = MOVEMENT
    else:
      category = OTHER
      if score_dims is not None:
        shapes = [
          tuple(int(d) for d in s.split(',')) for s in _SHAPE.findall(line.split(', metadata=')[0])
        ]
        if any(len(s) >= 3 and tuple(s[-2:]) == tuple(score_dims) for s in shapes):
          category = SCORES
    categories[name] = category
  return categories


def _kernel_to_hlo(categories: dict[str, str]) -> dict[str, str]:
  """XLA:GPU names a fusion's kernel after the instruction, '.' -> '_'."""
  return {
    name.replace('.', '_').replace('-', '_'): name
    for name, category in categories.items()
    if category is not _CONTAINER
  }


def _device_events(profile):
  """(name, hlo_op stat or None, duration seconds) of every executed device op."""
  for plane in profile.planes:
    gpu_or_tpu = plane.name.startswith('/device:')
    if not (gpu_or_tpu or plane.name == '/host:CPU'):
      continue
    for line in plane.lines:
      if gpu_or_tpu:
        # GPU kernels run on 'Stream #..' lines; TPUs summarise ops on 'XLA Ops'.
        if not (line.name.startswith('Stream') or line.name == 'XLA Ops'):
          continue
      elif not line.name.startswith('tf_XLA'):
        continue  # XLA:CPU executes its thunks on these threads
      for event in line.events:
        stats = dict(event.stats)
        hlo_op = stats.get('hlo_op')
        if not gpu_or_tpu and hlo_op is None:
          continue  # thread-pool bookkeeping, not an op
        yield event.name, hlo_op, event.duration_ns * 1e-9


def device_time_by_category(
  xplane_path: str, categories: dict[str, str], steps: int = 1
) -> dict[str, float]:
  """Seconds per step in each category (CATEGORIES order), from one trace file."""
  profile = jax.profiler.ProfileData.from_file(xplane_path)
  by_kernel = _kernel_to_hlo(categories)
  totals = collections.defaultdict(float)
  for name, hlo_op, seconds in _device_events(profile):
    op = hlo_op if hlo_op in categories else by_kernel.get(name)
    if op is None:  # a kernel name with a suffix ('fusion_12_1'), or a library kernel
      stem = re.sub(r'(_\d+)+$', '', name)
      op = by_kernel.get(stem) if stem != name else None
    if op is not None:
      if categories[op] is not _CONTAINER:
        totals[categories[op]] += seconds
    elif _MATMUL_KERNELS.search(name):
      totals[MATMUL] += seconds
    elif _MOVEMENT_KERNELS.search(name):
      totals[MOVEMENT] += seconds
    else:
      totals[UNATTRIBUTED] += seconds
  return {category: totals.get(category, 0.0) / steps for category in CATEGORIES}


def device_time_by_kernel(xplane_path: str, steps: int = 1) -> dict[str, float]:
  """Seconds per step of every executed device kernel, by its name (a Pallas kernel's is its
  pallas_call name, e.g. 'realformer_qk_attention_bwd'), dearest first."""
  profile = jax.profiler.ProfileData.from_file(xplane_path)
  totals = collections.defaultdict(float)
  for name, _, seconds in _device_events(profile):
    totals[name] += seconds / steps
  return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

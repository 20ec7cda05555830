r"""An ESTIMATED step time for a program XLA compiled for an accelerator: a kernel roofline
over its optimized HLO. No device is involved; nothing here is a measurement.

    from realformer_jax.aot import roofline, targets
    target = targets.parse('h100:8')
    est = roofline.estimate(compiled, target, score_dims=(512, 512))  # or the HLO text
    est.seconds, est.non_gemm_bytes, est.launches, est.warnings
    est.top(10)             # the kernels that cost the most, with their category
    est.by_category()       # {category: seconds per step}

The model (one per device: an SPMD program is the same on every device):

1. Kernels. Walk the ENTRY computation. Every fusion, custom call, collective and unfused
   instruction that launches work is a kernel; parameters, tuples, get-tuple-element, bitcasts
   and constants are free. A while loop's body (and condition) run `known_trip_count` times
   (nested loops multiply); `call`s and async wrappers are entered; of a conditional's branches
   the dearest is counted (with a warning). A loop without a known trip count is counted once,
   with a warning.
2. Bytes: a kernel reads its operands and writes its results once from / to HBM. A fusion
   parameter that is only sliced inside (dynamic-slice, slice, gather: a rolled scan reading
   layer l of a stacked [N, ...] buffer) counts as the slices it reads; a result written in
   place by dynamic-update-slice (or scatter) counts as the update, not the whole buffer. For
   cuBLAS / cuDNN calls the scratch workspace result is not counted.
3. Work: matmul FLOPs = 2 x output elements x contracted size for every dot and convolution
   (fused or not) and cuBLAS GEMM; cuDNN flash attention 4 B H Lq Lk D forward and 10 B H Lq Lk D
   backward; grouped by the operands' arithmetic (bf16, tf32 for a float32 dot at default
   precision on a GPU, f32 at 'highest', fp8, int8). Element-wise work (GPUs only): one op per
   output element of each arithmetic instruction, a reduce one per input element; split into
   float ops, integer ops and transcendentals (exp, log, erf, tanh, rsqrt, ...). Threefry's
   integer hash (dropout bits) is where this ceiling bites.
4. Time per kernel = max(bytes / HBM rate, sum over dtypes of FLOPs / matmul rate, element-wise
   ops / vector rates) + the launch overhead (2 us on a GPU, 0 on a TPU); the rates are the
   target's roofline rates (targets.py: measured or derated datasheet numbers). The step is the
   sum over kernels in program order, i.e. no overlap between kernels.
5. Collectives cost bytes over the interconnect (ring: all-reduce 2 (n-1)/n S, all-gather and
   reduce-scatter (n-1)/n S, all-to-all (n-1)/n S, permute S; n from `replica_groups`) and are
   reported apart from the kernels: `seconds` adds them (no overlap), `overlapped_seconds`
   assumes XLA hides them behind compute.

Kernels the roofline cannot judge are costed as above but also listed in `warnings`, never
silently: atomic scatters of many rows into a small table (contention: issue 11 measured one
at 50 ms that a roofline puts at microseconds), host callbacks and transfers, custom kernels
whose FLOPs the program does not state (Pallas / Triton / Mosaic calls: pass
`custom_call_flops`), loops without a trip count.

On a TPU target, XLA's own `cost_analysis()` (FLOPs, bytes accessed, `optimal_seconds`) is
read from the compiled program and reported beside the roofline (`xla_optimal_seconds`); on a
GPU the deviceless compiler returns no cost analysis.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Callable, Iterable, Optional, Union

from realformer_jax.aot import categories, hlo_text, targets
from realformer_jax.aot.hlo_text import Array, Computation, Instruction, Module

FREE_OPS = frozenset({
    'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast', 'after-all',
    'partition-id', 'replica-id', 'opt-barrier', 'add-dependency', 'domain', 'async-done',
    'async-update', 'all-reduce-done', 'all-gather-done', 'collective-permute-done',
    'reduce-scatter-done', 'all-to-all-done', 'copy-done', 'send-done', 'recv-done',
    'get-dimension-size', 'set-dimension-size'})
COLLECTIVE_OPS = frozenset({
    'all-reduce', 'all-reduce-start', 'all-gather', 'all-gather-start', 'reduce-scatter',
    'reduce-scatter-start', 'all-to-all', 'all-to-all-start', 'collective-permute',
    'collective-permute-start', 'collective-broadcast', 'ragged-all-to-all'})
HOST_OPS = frozenset({'send', 'recv', 'infeed', 'outfeed'})
FREE_CUSTOM_CALLS = frozenset({'AllocateBuffer'})  # TPU: reserves a buffer, no work
# Custom calls that only move or reinterpret data: costed by their bytes, no warning.
MOVEMENT_CALLS = frozenset({'ConcatBitcast', 'SliceToDynamic', 'PadToStatic'})
# Instructions that only move or reinterpret data inside a fusion: no arithmetic.
NO_ARITHMETIC = categories.MOVEMENT_OPS | frozenset({
    'dot', 'convolution', 'fusion', 'call', 'custom-call', 'scatter', 'bitcast-convert',
    'rng-bit-generator', 'rng-get-and-update-state', 'sort', 'while', 'conditional',
    'partition-id', 'replica-id', 'after-all', 'opt-barrier'})
TRANSCENDENTAL_OPS = frozenset({
    'exponential', 'exponential-minus-one', 'log', 'log-plus-one', 'tanh', 'logistic', 'erf',
    'sine', 'cosine', 'tan', 'atan2', 'power', 'sqrt', 'rsqrt', 'cbrt'})
SLICING_OPS = frozenset({'dynamic-slice', 'slice', 'gather'})
TRANSPARENT_OPS = frozenset({'bitcast', 'reshape'})
HOST_CALLBACK = re.compile(r'callback|host|xla_python', re.I)
# Integer ops per u32 output of jax's threefry2x32 kernel: 20 rounds of (add, rotate = two
# shifts and an or, xor) per output pair plus the key schedule, ~130 ops per pair.
THREEFRY_OPS_PER_OUTPUT = 65
# An atomic scatter is flagged when it writes more than this many rows per table row.
SCATTER_CONTENTION_ROWS = 64


@dataclasses.dataclass
class Work:
  """What one execution of a kernel does."""

  bytes: float = 0.0  # HBM bytes read + written
  matmul_flops: dict = dataclasses.field(default_factory=dict)  # dtype class -> FLOPs
  float_ops: float = 0.0
  int_ops: float = 0.0
  transcendentals: float = 0.0
  link_bytes: float = 0.0  # collectives: bytes over the interconnect per device
  opcodes: set = dataclasses.field(default_factory=set)
  files: set = dataclasses.field(default_factory=set)
  arrays: list = dataclasses.field(default_factory=list)
  warning: Optional[str] = None

  def add_flops(self, dtype_class: str, flops: float) -> None:
    self.matmul_flops[dtype_class] = self.matmul_flops.get(dtype_class, 0.0) + flops


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One kernel of the program and its estimated cost."""

  name: str  # the HLO instruction
  computation: str  # where it sits (ENTRY, a loop body, ...)
  opcode: str  # fusion / custom-call / copy / all-gather-start / ...
  kind: str  # fusion kind or backend kind, custom call target, or the opcode
  count: int  # executions per step (loop trip counts multiplied)
  bytes: float  # HBM bytes per execution
  matmul_flops: float  # per execution
  seconds: float  # estimated per execution, launch overhead included
  bound: str  # 'memory' | 'matmul' | 'vector' | 'launch' | 'interconnect'
  category: str  # categories.py
  shape: str  # the result, e.g. 'f32[8,16,512,512]'
  op_name: str  # the jax op it came from (metadata)
  warning: Optional[str] = None

  @property
  def total_seconds(self) -> float:
    return self.seconds * self.count

  @property
  def is_collective(self) -> bool:
    return self.category == categories.COLLECTIVES


@dataclasses.dataclass(frozen=True)
class Estimate:
  """The roofline of one program on one target (per device; every device runs the same)."""

  target: str
  kernels: tuple[Kernel, ...]
  warnings: tuple[str, ...]
  xla_optimal_seconds: Optional[float] = None  # TPU: XLA's own cost model
  xla_flops: Optional[float] = None
  xla_bytes_accessed: Optional[float] = None

  @property
  def compute_seconds(self) -> float:
    """Kernels run back to back (collectives excluded)."""
    return sum(k.total_seconds for k in self.kernels if not k.is_collective)

  @property
  def collective_seconds(self) -> float:
    return sum(k.total_seconds for k in self.kernels if k.is_collective)

  @property
  def seconds(self) -> float:
    """The estimated step: kernels plus collectives, nothing overlapped."""
    return self.compute_seconds + self.collective_seconds

  @property
  def overlapped_seconds(self) -> float:
    """The estimated step if every collective hides behind compute."""
    return max(self.compute_seconds, self.collective_seconds)

  @property
  def launches(self) -> int:
    return sum(k.count for k in self.kernels)

  @property
  def hbm_bytes(self) -> float:
    return sum(k.bytes * k.count for k in self.kernels if not k.is_collective)

  @property
  def non_gemm_bytes(self) -> float:
    """HBM traffic of everything that is not a matmul (or fused attention) or a collective."""
    return sum(k.bytes * k.count for k in self.kernels
               if k.category not in (categories.GEMM, categories.ATTENTION,
                                     categories.COLLECTIVES))

  @property
  def matmul_flops(self) -> float:
    return sum(k.matmul_flops * k.count for k in self.kernels)

  def by_category(self) -> dict[str, float]:
    """Estimated seconds per step by category, dearest first."""
    totals: dict[str, float] = {}
    for k in self.kernels:
      totals[k.category] = totals.get(k.category, 0.0) + k.total_seconds
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

  def top(self, n: int = 10) -> list[Kernel]:
    return sorted(self.kernels, key=lambda k: -k.total_seconds)[:n]

  def csv(self) -> str:
    """One row per kernel (the `--dump` file)."""
    header = ('kernel,computation,opcode,kind,count,category,bound,us_each,ms_total,'
              'bytes_each,matmul_flops_each,shape,op_name,warning')
    rows = [header]
    for k in sorted(self.kernels, key=lambda k: -k.total_seconds):
      fields = [k.name, k.computation, k.opcode, k.kind, k.count, k.category, k.bound,
                f'{k.seconds * 1e6:.3f}', f'{k.total_seconds * 1e3:.4f}', f'{k.bytes:.0f}',
                f'{k.matmul_flops:.0f}', k.shape, k.op_name, k.warning or '']
      rows.append(','.join(_csv_field(f) for f in fields))
    return '\n'.join(rows) + '\n'


def _csv_field(value) -> str:
  text = str(value)
  if any(c in text for c in ',"\n'):
    text = '"' + text.replace('"', '""') + '"'
  return text


Target = Union[targets.Target, targets.Chip]
CustomCallFlops = Callable[[Instruction], Optional[float]]


def estimate(program, target: Target, *, score_dims: Optional[tuple[int, int]] = None,
             custom_call_flops: Optional[CustomCallFlops] = None) -> Estimate:
  """The roofline estimate of `program` (a `jax.stages.Compiled` or its `as_text()`) on
  `target` (a targets.Target, or a bare targets.Chip). `score_dims` = (L, L) names the
  attention-score arrays for the 'score-sized element-wise' category. `custom_call_flops(
  instruction)` may return the matmul FLOPs of custom kernels (Pallas / Triton / Mosaic) the
  program does not describe; None keeps the warning."""
  text = program if isinstance(program, str) else program.as_text()
  chip = target.chip if isinstance(target, targets.Target) else target
  devices = target.num_devices if isinstance(target, targets.Target) else 1
  module = hlo_text.parse_module(text)
  walker = _Walker(module, chip, devices, score_dims, custom_call_flops)
  walker.visit(module.entry_computation, 1)
  name = target.describe() if isinstance(target, targets.Target) else chip.description
  xla = _xla_cost(program) if not isinstance(program, str) else {}
  return Estimate(name, tuple(walker.kernels), tuple(dict.fromkeys(walker.warnings)),
                  xla_optimal_seconds=xla.get('optimal_seconds'), xla_flops=xla.get('flops'),
                  xla_bytes_accessed=xla.get('bytes accessed'))


def _xla_cost(compiled) -> dict:
  """XLA's cost analysis where the backend gives one (TPU); {} otherwise. A negative
  optimal_seconds (what XLA:TPU returns for some programs with loops) is dropped."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except  # backends without a cost model
    return {}
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  cost = dict(cost) if cost else {}
  if cost.get('optimal_seconds') is not None and cost['optimal_seconds'] < 0:
    cost.pop('optimal_seconds')
  return cost


class _Walker:
  """Visits executed computations and turns their instructions into Kernels."""

  def __init__(self, module: Module, chip: targets.Chip, devices: int,
               score_dims: Optional[tuple[int, int]],
               custom_call_flops: Optional[CustomCallFlops]):
    self.module, self.chip, self.devices = module, chip, devices
    self.score_dims = score_dims
    self.custom_call_flops = custom_call_flops
    self.kernels: list[Kernel] = []
    self.warnings: list[str] = []

  def computation(self, name: str) -> Optional[Computation]:
    return self.module.computations.get(name)

  def visit(self, computation: Computation, count: int) -> None:
    for ins in computation.instructions:
      op = ins.opcode
      if op in FREE_OPS:
        continue
      if op == 'while':
        body, condition = self.computation(_name(ins.attribute('body'))), self.computation(
            _name(ins.attribute('condition')))
        trips = ins.known_trip_count or _counted_loop_trips(ins, computation, condition)
        if trips is None:
          trips = 1
          self.warnings.append(f'{ins.name}: while loop without a known trip count, counted '
                               'once')
        if body:
          self.visit(body, count * trips)
        if condition:
          self.visit(condition, count * (trips + 1))
      elif op in ('call', 'async-start'):
        for name in ins.called():
          if self.computation(name):
            self.visit(self.computation(name), count)
      elif op == 'conditional':
        self._conditional(ins, count)
      elif op == 'custom-call' and ins.custom_call_target in FREE_CUSTOM_CALLS:
        continue
      else:
        self._kernel(ins, computation, count)

  def _conditional(self, ins: Instruction, count: int) -> None:
    branches = []
    for name in ins.called():
      sub = _Walker(self.module, self.chip, self.devices, self.score_dims,
                    self.custom_call_flops)
      if self.computation(name):
        sub.visit(self.computation(name), count)
      branches.append(sub)
    if not branches:
      return
    dearest = max(branches, key=lambda w: sum(k.total_seconds for k in w.kernels))
    self.kernels.extend(dearest.kernels)
    self.warnings.extend(dearest.warnings)
    self.warnings.append(f'{ins.name}: conditional with {len(branches)} branches, the dearest '
                         'counted')

  def _kernel(self, ins: Instruction, computation: Computation, count: int) -> None:
    if ins.opcode in COLLECTIVE_OPS:
      work = self._collective(ins, computation)
    elif ins.opcode == 'fusion':
      work = self._fusion(ins, computation)
    elif ins.opcode == 'custom-call':
      work = self._custom_call(ins, computation)
    else:
      work = self._single(ins, computation)
    if ins.opcode in HOST_OPS:
      work.warning = f'{ins.name}: host transfer ({ins.opcode}), not costed by the roofline'
    facts = categories.KernelFacts(
        opcodes=frozenset(work.opcodes), custom_call_target=ins.custom_call_target,
        matmul_flops=sum(work.matmul_flops.values()), is_collective=ins.opcode in COLLECTIVE_OPS,
        arrays=work.arrays, source_files=frozenset(work.files))
    seconds, bound = self._time(work, ins.opcode in COLLECTIVE_OPS)
    if work.warning:
      self.warnings.append(work.warning)
    self.kernels.append(Kernel(
        name=ins.name, computation=computation.name, opcode=ins.opcode,
        kind=ins.custom_call_target or ins.backend_kind or ins.fusion_kind or ins.opcode,
        count=count, bytes=work.bytes, matmul_flops=sum(work.matmul_flops.values()),
        seconds=seconds, bound=bound, category=categories.categorize(facts, self.score_dims),
        shape=' '.join(str(a) for a in ins.shapes[:3]) + (' ...' if len(ins.shapes) > 3 else ''),
        op_name=ins.op_name, warning=work.warning))

  def _time(self, work: Work, collective: bool) -> tuple[float, str]:
    chip = self.chip
    launch = chip.launch_overhead_s
    if collective:
      return work.link_bytes / chip.interconnect_bytes_per_s + launch, 'interconnect'
    rates = chip.roofline_matmul_flops
    parts = {
        'memory': work.bytes / chip.roofline_hbm_bytes_per_s,
        'matmul': sum(flops / rates[dtype] for dtype, flops in work.matmul_flops.items()),
        'vector': _vector_seconds(work, chip),
    }
    bound = max(parts, key=parts.get)
    if parts[bound] == 0.0:
      bound = 'launch'
    return parts.get(bound, 0.0) + launch, bound

  # ----- kinds of kernels -------------------------------------------------------------------

  def _operand_arrays(self, ins: Instruction, computation: Computation) -> list[Array]:
    arrays = []
    for name in ins.operands:
      source = computation.by_name.get(name)
      if source is not None:
        arrays.extend(source.shapes)
    return arrays

  def _fusion(self, ins: Instruction, computation: Computation) -> Work:
    work = Work()
    fused = self.computation(_name(ins.attribute('calls')))
    operands = self._operand_arrays(ins, computation)
    work.arrays = operands + list(ins.shapes)
    if fused is None:
      work.bytes = sum(a.bytes for a in work.arrays)
      return work
    params = fused.parameters()
    work.bytes = (sum(_read_bytes(self.module, fused, p) for p in params)
                  + _write_bytes(fused))
    self._body_work(fused, work)
    return work

  def _body_work(self, computation: Computation, work: Work, seen=None) -> None:
    """Matmul FLOPs and element-wise ops of a fused computation (and fusions nested in it)."""
    seen = set() if seen is None else seen
    if computation.name in seen:
      return
    seen.add(computation.name)
    for ins in computation.instructions:
      if any(a.dims for a in ins.shapes):  # not the scalar index arithmetic of a slice
        work.opcodes.add(ins.opcode)
      work.files.update(self.module.source_files(ins))
      if ins.opcode in ('dot', 'convolution'):
        lhs = computation.by_name.get(ins.operands[0]) if ins.operands else None
        rhs = computation.by_name.get(ins.operands[1]) if len(ins.operands) > 1 else None
        flops = _dot_flops(ins, lhs, rhs)
        dtype = lhs.shapes[0].dtype if lhs is not None and lhs.shapes else 'f32'
        precision = (ins.attribute('operand_precision') or '') + (ins.attribute('algorithm')
                                                                 or '')
        work.add_flops(targets.dtype_class(dtype, precision, self.chip.platform), flops)
      elif ins.opcode == 'fusion':
        nested = self.computation(_name(ins.attribute('calls')))
        if nested is not None:
          self._body_work(nested, work, seen)
      elif ins.opcode == 'scatter':
        self._check_scatter(ins, computation, work)
      elif ins.opcode not in NO_ARITHMETIC:
        _count_ops(ins, computation, work)

  def _check_scatter(self, ins: Instruction, computation: Computation, work: Work) -> None:
    table = computation.by_name.get(ins.operands[0]) if ins.operands else None
    updates = computation.by_name.get(ins.operands[-1]) if ins.operands else None
    if not (table and updates and table.shapes and updates.shapes):
      return
    table_rows = table.shapes[0].dims[0] if table.shapes[0].dims else 1
    update_dims = updates.shapes[0].dims
    row = math.prod(table.shapes[0].dims[1:]) if len(table.shapes[0].dims) > 1 else 1
    update_rows = updates.shapes[0].elements // max(row, 1)
    if update_rows > SCATTER_CONTENTION_ROWS * max(table_rows, 1):
      work.warning = (f'{ins.name}: atomic scatter of {update_rows:,} rows into a {table_rows}'
                      f'-row table {table.shapes[0]} (updates {list(update_dims)}): contention '
                      'the roofline cannot judge; its real time can be far larger')

  def _single(self, ins: Instruction, computation: Computation) -> Work:
    """An unfused instruction: a kernel of its own."""
    work = Work(opcodes={ins.opcode}, files=set(self.module.source_files(ins)))
    operands = [computation.by_name.get(n) for n in ins.operands]
    operand_arrays = [a for o in operands if o is not None for a in o.shapes]
    work.arrays = operand_arrays + list(ins.shapes)
    if ins.opcode in SLICING_OPS:
      work.bytes = 2 * ins.result_bytes + sum(o.result_bytes for o in operands[1:] if o)
    elif ins.opcode == 'copy-start':  # TPU: a move between memory spaces reads HBM once
      work.bytes = sum(a.bytes for a in operand_arrays)
    elif ins.opcode == 'dynamic-update-slice' and len(operands) > 1 and operands[1]:
      work.bytes = 2 * operands[1].result_bytes
    elif ins.opcode == 'scatter' and operands and operands[-1]:
      work.bytes = 3 * operands[-1].result_bytes + sum(
          o.result_bytes for o in operands[1:-1] if o)
      self._check_scatter(ins, computation, work)
    else:
      work.bytes = sum(a.bytes for a in operand_arrays) + ins.result_bytes
    if ins.opcode in ('dot', 'convolution'):
      lhs, rhs = (operands + [None, None])[:2]
      dtype = lhs.shapes[0].dtype if lhs is not None and lhs.shapes else 'f32'
      precision = (ins.attribute('operand_precision') or '') + (ins.attribute('algorithm') or '')
      work.add_flops(targets.dtype_class(dtype, precision, self.chip.platform),
                     _dot_flops(ins, lhs, rhs))
    elif ins.opcode not in NO_ARITHMETIC:
      _count_ops(ins, computation, work)
    return work

  def _custom_call(self, ins: Instruction, computation: Computation) -> Work:
    target = ins.custom_call_target or ''
    work = Work(opcodes={'custom-call'}, files=set(self.module.source_files(ins)))
    operands = [computation.by_name.get(n) for n in ins.operands]
    operand_arrays = [a for o in operands if o is not None for a in o.shapes]
    results = list(ins.shapes)
    if (target.startswith(('__cublas', '__cudnn')) and len(results) > 1
        and results[-1].dtype in ('u8', 's8')):
      results = results[:-1]  # the scratch workspace
    work.arrays = operand_arrays + results
    work.bytes = sum(a.bytes for a in work.arrays)
    config = ins.attribute('backend_config') or ''
    if target.startswith('__cublas'):
      lhs = operand_arrays[0] if operand_arrays else None
      numbers = _json_field(config, 'dot_dimension_numbers') or {}
      contracting = [int(d) for d in numbers.get('lhs_contracting_dimensions', [])]
      if lhs is not None and results:
        flops = 2 * results[0].elements * math.prod(lhs.dims[d] for d in contracting)
        work.add_flops(targets.dtype_class(lhs.dtype, config, self.chip.platform), flops)
    elif target.startswith('__cudnn$fmha'):
      dims = (_json_field(config, 'intermediate_tensor_shape') or {}).get('dimensions', [])
      q = operand_arrays[0] if operand_arrays else None
      if len(dims) == 4 and q is not None:
        b, h, lq, lk = (int(d) for d in dims)
        factor = 10 if 'Backward' in target else 4
        work.add_flops(targets.dtype_class(q.dtype, None, self.chip.platform),
                       factor * b * h * lq * lk * q.dims[-1])
      else:
        work.warning = f'{ins.name}: {target} without score dimensions, costed by bytes only'
    elif target.startswith(categories.THREEFRY_CALLS):
      work.int_ops = THREEFRY_OPS_PER_OUTPUT * sum(a.elements for a in results)
    elif target in MOVEMENT_CALLS:
      work.opcodes = {'copy'}
    elif HOST_CALLBACK.search(target):
      work.warning = f'{ins.name}: host callback {target!r}, not costed by the roofline'
    else:
      flops = _stated_cost(config).get('flops')
      if flops is None and self.custom_call_flops is not None:
        flops = self.custom_call_flops(ins)
      if flops:
        dtype = operand_arrays[0].dtype if operand_arrays else 'bf16'
        work.add_flops(targets.dtype_class(dtype, None, self.chip.platform), float(flops))
      else:
        work.warning = (f'{ins.name}: custom call {target!r}{_kernel_name(config)} states no '
                        'FLOPs, costed by its bytes only (estimate(..., custom_call_flops=...))')
    return work

  def _collective(self, ins: Instruction, computation: Computation) -> Work:
    work = Work(opcodes={ins.opcode}, files=set(self.module.source_files(ins)))
    operands = [computation.by_name.get(n) for n in ins.operands]
    sent = sum(o.result_bytes for o in operands if o is not None)
    received = max((a.bytes for a in ins.shapes), default=0.0)
    work.arrays = [a for o in operands if o for a in o.shapes] + list(ins.shapes)
    n = _group_size(ins, self.devices)
    share = (n - 1) / n if n > 1 else 0.0
    op = ins.opcode.replace('-start', '')
    if op == 'all-reduce':
      work.link_bytes = 2 * share * sent
    elif op == 'all-gather':
      work.link_bytes = share * received
    elif op in ('reduce-scatter', 'all-to-all', 'ragged-all-to-all'):
      work.link_bytes = share * sent
    else:  # permute / broadcast: every byte crosses once
      work.link_bytes = sent if n > 1 else 0.0
    return work


# ----- helpers -------------------------------------------------------------------------------

def _name(value: Optional[str]) -> str:
  return (value or '').strip('{}').split(',')[0].strip().lstrip('%')


def _follow(computation: Computation, users: dict, name: str) -> Iterable[tuple[Instruction,
                                                                                  int]]:
  """(user, operand index) of `name`, looking through bitcasts and reshapes."""
  for user in users.get(name, ()):
    if user.opcode in TRANSPARENT_OPS:
      yield from _follow(computation, users, user.name)
    else:
      for index, operand in enumerate(user.operands):
        if operand == name:
          yield user, index


def _read_bytes(module: Module, computation: Computation, param: Instruction) -> float:
  """HBM bytes a fusion reads through one parameter (slices only where it is only sliced)."""
  users = computation.users()
  full = param.result_bytes
  total = 0.0
  uses = list(_follow(computation, users, param.name))
  if not uses:
    return 0.0
  for user, index in uses:
    if user.opcode in SLICING_OPS and index == 0:
      total += user.result_bytes
    elif user.opcode == 'dynamic-update-slice' and index == 0:
      continue  # written in place: the write is the update (_write_bytes)
    elif user.opcode == 'scatter' and index == 0:
      updates = computation.by_name.get(user.operands[-1])
      total += updates.result_bytes if updates is not None else full
    elif user.opcode == 'fusion':
      nested = module.computations.get(_name(user.attribute('calls')))
      inner = next((p for p in nested.parameters() if p.parameter_number == index),
                   None) if nested else None
      if inner is None:
        return full
      total += _read_bytes(module, nested, inner)
    else:
      return full
  return min(total, full)


def _counted_loop_trips(loop: Instruction, computation: Computation,
                        condition: Optional[Computation]) -> Optional[int]:
  """Trips of a counted loop whose backend config states none (TPU): the condition compares
  the tuple element i < N (or <= N) with a constant N, and i starts at a constant."""
  if condition is None:
    return None
  root = _resolve(condition, condition.root)
  direction = re.search(r'direction=(\w+)', root.attributes)
  if root.opcode != 'compare' or not direction or direction.group(1) not in ('LT', 'LE'):
    return None
  operands = [condition.by_name.get(n) for n in root.operands]
  if len(operands) != 2 or None in operands:
    return None
  counter, limit = operands
  if counter.opcode != 'get-tuple-element' or limit.opcode != 'constant':
    return None
  bound = _constant_value(limit)
  index = re.search(r'index=(\d+)', counter.attributes)
  start = 0
  initial = computation.by_name.get(loop.operands[0]) if loop.operands else None
  if initial is not None and initial.opcode == 'tuple' and index:
    element = computation.by_name.get(initial.operands[int(index.group(1))])
    if element is not None and element.opcode == 'constant':
      start = _constant_value(element)
  if bound is None or start is None:
    return None
  trips = bound - start + (1 if direction.group(1) == 'LE' else 0)
  return trips if trips > 0 else None


def _constant_value(ins: Instruction) -> Optional[int]:
  """The value of a scalar integer constant, e.g. `s32[] constant(12)`."""
  match = re.match(r'\s*(-?\d+)\s*$', ins.operand_text)
  return int(match.group(1)) if match else None


def _resolve(computation: Computation, ins: Instruction) -> Instruction:
  """`ins`, or what it bitcasts / reshapes."""
  while ins.opcode in TRANSPARENT_OPS and ins.operands and ins.operands[0] in \
      computation.by_name:
    ins = computation.by_name[ins.operands[0]]
  return ins


def _write_bytes(computation: Computation) -> float:
  """HBM bytes a fusion writes: its results, or the update where one is written in place."""
  root = computation.root
  outputs = ([computation.by_name.get(n) for n in root.operands] if root.opcode == 'tuple'
             else [root])
  total = 0.0
  for out in filter(None, outputs):
    source = _resolve(computation, out)
    if (source.opcode in ('dynamic-update-slice', 'scatter') and source.operands and
        _resolve(computation, computation.by_name.get(source.operands[0], source)).opcode
        == 'parameter'):
      index = 1 if source.opcode == 'dynamic-update-slice' else -1
      update = computation.by_name.get(source.operands[index])
      total += update.result_bytes if update is not None else out.result_bytes
    elif source.opcode != 'parameter':  # a parameter passed through is not written
      total += out.result_bytes
  return total


def _dot_flops(ins: Instruction, lhs: Optional[Instruction],
               rhs: Optional[Instruction]) -> float:
  """2 x output elements x contracted size for a dot; for a convolution, 2 x the multiply-adds
  of its window taps that land on real input (convolution.py-style dots on a TPU put batch
  dimensions in dilated, padded windows whose other taps do no work)."""
  if not ins.shapes or lhs is None or not lhs.shapes:
    return 0.0
  if ins.opcode == 'dot':
    contracting = ins.dims_attribute('lhs_contracting_dims')
    return 2.0 * ins.shapes[0].elements * math.prod(lhs.shapes[0].dims[d] for d in contracting)
  if rhs is None or not rhs.shapes:
    return 0.0
  return _convolution_flops(ins, lhs.shapes[0], rhs.shapes[0])


def _window(ins: Instruction, key: str, rank: int, default: int) -> list:
  value = ins.attribute('window') or ''
  match = re.search(key + r'=([\d_x\-]+)', value)
  if not match:
    return [default] * rank
  return match.group(1).split('x')


def _convolution_flops(ins: Instruction, lhs: Array, rhs: Array) -> float:
  labels = re.match(r'(\w+)_(\w+)->(\w+)', ins.attribute('dim_labels') or '')
  if not labels:
    return 2.0 * ins.shapes[0].elements * rhs.elements / max(rhs.dims[-1], 1)
  lhs_labels, rhs_labels, out_labels = labels.groups()
  out = ins.shapes[0]
  spatial = sorted(c for c in lhs_labels if c.isdigit())
  rank = len(spatial)
  sizes = [int(k) for k in _window(ins, 'size', rank, 1)]
  strides = [int(k) for k in _window(ins, 'stride', rank, 1)]
  lhs_dilation = [int(k) for k in _window(ins, 'lhs_dilate', rank, 1)]
  rhs_dilation = [int(k) for k in _window(ins, 'rhs_dilate', rank, 1)]
  pads = [int(str(p).split('_')[0]) for p in _window(ins, 'pad', rank, '0_0')]
  taps = 1
  for d, name in enumerate(spatial):
    n = lhs.dims[lhs_labels.index(name)]
    m = out.dims[out_labels.index(name)]
    if lhs_dilation[d] == 1 and pads[d] == 0:
      taps *= m * sizes[d]  # every tap reads real input
      continue
    extent = (n - 1) * lhs_dilation[d]  # last real input position, in dilated coordinates
    valid = 0
    for o in range(m):
      for t in range(sizes[d]):
        x = o * strides[d] + t * rhs_dilation[d] - pads[d]
        valid += 0 <= x <= extent and x % lhs_dilation[d] == 0
    taps *= valid
  batch = out.dims[out_labels.index('b')]
  in_features = rhs.dims[rhs_labels.index('i')]
  out_features = out.dims[out_labels.index('f')]
  return 2.0 * batch * out_features * in_features * taps


def _element_kind(dtype: str) -> str:
  if dtype[0] in 'su' or dtype == 'pred':
    return 'int'
  return 'float'


def _count_ops(ins: Instruction, computation: Computation, work: Work) -> None:
  """Element-wise work of one arithmetic instruction."""
  if ins.opcode in ('reduce', 'reduce-window', 'select-and-scatter'):
    source = computation.by_name.get(ins.operands[0]) if ins.operands else None
    elements = source.shapes[0].elements if source is not None and source.shapes else 0
  else:
    elements = sum(a.elements for a in ins.shapes)
  if ins.opcode in TRANSCENDENTAL_OPS:
    work.transcendentals += elements
    return
  dtypes = [a.dtype for a in ins.shapes]
  first = computation.by_name.get(ins.operands[0]) if ins.operands else None
  if first is not None and first.shapes:
    dtypes = [first.shapes[0].dtype] + dtypes
  dtype = next((d for d in dtypes if d != 'pred'), 'pred')
  if _element_kind(dtype) == 'int':
    work.int_ops += elements
  else:
    work.float_ops += elements


def _vector_seconds(work: Work, chip: targets.Chip) -> float:
  if chip.vector_flops is None:
    return 0.0
  return (work.float_ops / chip.vector_flops + work.int_ops / chip.vector_int_ops
          + work.transcendentals / chip.transcendentals)


def _group_size(ins: Instruction, devices: int) -> int:
  """Devices in one replica group of a collective."""
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", ins.attributes)
  if mesh:
    sizes = {k: int(v) for k, v in re.findall(r"'(\w+)'=(\d+)", mesh.group(1))}
    axes = re.findall(r"'(\w+)'", mesh.group(2))
    return math.prod(sizes.get(a, 1) for a in axes) if axes else devices
  groups = ins.attribute('replica_groups')
  if groups is None:
    pairs = ins.attribute('source_target_pairs')
    return 2 if pairs else devices
  if groups.startswith('['):
    dims = re.match(r'\[([\d,]+)\]', groups)
    return int(dims.group(1).split(',')[-1]) if dims else devices
  first = re.match(r'\{\{([^}]*)\}', groups)
  if first:
    return len([x for x in first.group(1).split(',') if x.strip()])
  return devices


def _json_field(config: str, key: str):
  """A JSON object or value inside a backend_config string, or None."""
  start = config.find(f'"{key}"')
  if start < 0:
    return None
  colon = config.find(':', start)
  text = config[colon + 1:].lstrip()
  if not text.startswith(('{', '[')):
    match = re.match(r'"?([^",}]*)"?', text)
    return match.group(1) if match else None
  opener, closer = text[0], '}' if text[0] == '{' else ']'
  depth = 0
  for i, c in enumerate(text):
    depth += c == opener
    depth -= c == closer
    if depth == 0:
      try:
        return json.loads(text[:i + 1])
      except ValueError:
        return None
  return None


def _stated_cost(config: str) -> dict:
  """A custom kernel's own cost statement (Mosaic's "cost_estimate"), if any."""
  cost = _json_field(config, 'cost_estimate')
  return cost if isinstance(cost, dict) else {}


def _kernel_name(config: str) -> str:
  match = re.search(r'name = \\?"([\w.\-]+)\\?"', config) or re.search(
      r'"kernel_name":\s*"([\w.\-]+)"', config)
  return f' ({match.group(1)})' if match else ''

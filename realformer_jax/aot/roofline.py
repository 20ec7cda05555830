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
   (nested loops multiply); `call`s and async wrappers are entered. A conditional whose branch
   rule is in the code (switches.py: the qk backward's slot buckets, layer l takes the first
   bucket >= l + 1) has each branch counted for the executions that take it; of any other
   conditional the dearest branch is counted, every time, with a warning. A loop without a
   known trip count is counted once, with a warning.
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
4. Time per kernel = max(bytes / HBM rate, L2 bytes / L2 rate, sum over dtypes of FLOPs /
   matmul rate, element-wise ops / vector rates, atomic updates / atomic rate) + the launch
   overhead (2 us on a GPU, 0 on a TPU); the rates are the target's (targets.py: measured or
   derated datasheet numbers, each with its source). L2 bytes and atomics are what a custom
   kernel states (`l2_bytes`: every tile load and store, a tile re-read inside a loop counted
   each time; `atomics`: global atomic element updates); XLA's own fusions state neither and
   are costed by HBM bytes. A fused custom kernel (a Pallas Triton kernel that states its
   cost: flash attention, the qk kernels) has no warp specialisation: its matmuls and its
   CUDA-core work run in sequence, so for it the two are one term, (matmul + vector) /
   chip.fused_kernel_efficiency; and where its grid has fewer programs than the GPU has SMs
   (chip.sms), its time is scaled by SMs / programs (one program an SM). The step is the sum
   over kernels in program order, i.e. no overlap between kernels. Free parameters: TWO
   fitted, fused_kernel_efficiency and the L2 rate's fraction (targets.FUSED_KERNEL_EFFICIENCY,
   HOPPER_L2_FRACTION: fitted to the per-kernel device times an H200 measured at L = 16,384
   and 65,536, validated on the measured steps); every other rate
   is a datasheet figure, a derating (0.9 of HBM, 805/989 of matmul: issue 11's H100
   measurements) or a cited measurement, and every count is the program's or the kernel's
   stated work (docs/performance.md, "Calibration").
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
read from the compiled program and reported beside the roofline (`xla_optimal_seconds`). It
counts each while-loop body once, not once per trip (checked: a 12-trip scan of three matmuls
reports the FLOPs of one trip), and for the project's train step it returns a negative
optimal_seconds, which is dropped; on a GPU the deviceless compiler returns no cost analysis.
Where the kernels live: kernel_work.py (bytes, FLOPs, ops of one kernel), categories.py.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Union

from realformer_jax.aot import categories, hlo_text, kernel_work, switches, targets
from realformer_jax.aot.hlo_text import Computation, Instruction, Module

FREE_OPS = frozenset(
  {
    'parameter',
    'constant',
    'get-tuple-element',
    'tuple',
    'bitcast',
    'after-all',
    'partition-id',
    'replica-id',
    'opt-barrier',
    'add-dependency',
    'domain',
    'async-done',
    'async-update',
    'all-reduce-done',
    'all-gather-done',
    'collective-permute-done',
    'reduce-scatter-done',
    'all-to-all-done',
    'copy-done',
    'send-done',
    'recv-done',
    'get-dimension-size',
    'set-dimension-size',
  }
)
HOST_OPS = frozenset({'send', 'recv', 'infeed', 'outfeed'})
FREE_CUSTOM_CALLS = frozenset({'AllocateBuffer'})  # TPU: reserves a buffer, no work


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One kernel of the program and its estimated cost."""

  name: str  # the HLO instruction
  computation: str  # where it sits (ENTRY, a loop body, ...)
  opcode: str  # fusion / custom-call / copy / all-gather-start / ...
  kind: str  # fusion kind or backend kind, custom call target, or the opcode
  # executions per step (loop trip counts multiplied; a switch's branch its share of them)
  count: float
  bytes: float  # HBM bytes per execution
  matmul_flops: float  # per execution
  seconds: float  # estimated per execution, launch overhead included
  # 'memory' | 'l2' | 'matmul' | 'vector' | 'matmul+vector' | 'atomics' | 'launch' |
  # 'interconnect'
  bound: str
  category: str  # categories.py
  shape: str  # the result, e.g. 'f32[8,16,512,512]'
  op_name: str  # the jax op it came from (metadata)
  warning: Optional[str] = None
  score_sized: bool = False  # reads or writes an [.., L, L] array (estimate(score_dims=))
  # The estimator's inputs for this kernel (WORK_FIELDS, per execution): `seconds` is
  # kernel_seconds(work, chip), so a committed record can be timed again without the program.
  work: dict = dataclasses.field(default_factory=dict)

  @property
  def total_seconds(self) -> float:
    return self.seconds * self.count

  @property
  def is_collective(self) -> bool:
    return self.category == categories.COLLECTIVES


@dataclasses.dataclass(frozen=True)
class KernelGroup:
  """Kernels doing the same jax op on the same shape (e.g. one per unrolled layer)."""

  kernels: tuple[Kernel, ...]

  @property
  def total_seconds(self) -> float:
    return sum(k.total_seconds for k in self.kernels)

  @property
  def count(self) -> int:
    return sum(k.count for k in self.kernels)

  @property
  def first(self) -> Kernel:
    return max(self.kernels, key=lambda k: k.total_seconds)

  @property
  def name(self) -> str:
    extra = len(self.kernels) - 1
    return self.first.name + (f' (+{extra} alike)' if extra else '')


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
  def unstated(self) -> dict[str, tuple[str, ...]]:
    """What the estimate leaves out: {custom kernel name: the fields of
    kernel_work.UNSTATED_CHECKED it does not state (its L2 re-reads, its atomics: costed as
    zero)}."""
    return {
      k.work['unstated'][0]: tuple(k.work['unstated'][1:])
      for k in self.kernels
      if k.work.get('unstated')
    }

  @property
  def launches(self) -> int:
    return sum(k.count for k in self.kernels)

  @property
  def hbm_bytes(self) -> float:
    return sum(k.bytes * k.count for k in self.kernels if not k.is_collective)

  @property
  def non_gemm_bytes(self) -> float:
    """HBM traffic of everything that is not a matmul (or fused attention) or a collective."""
    return sum(
      k.bytes * k.count
      for k in self.kernels
      if k.category not in (categories.GEMM, categories.ATTENTION, categories.COLLECTIVES)
    )

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
    """The `n` kernels (instructions) that cost the most per step."""
    return sorted(self.kernels, key=lambda k: -k.total_seconds)[:n]

  def top_ops(self, n: int = 10) -> list['KernelGroup']:
    """The `n` dearest groups of kernels that do the same jax op on the same shape: a model
    whose layers are unrolled (one instruction per layer) and one whose layers run in a loop
    (one instruction, run once a layer) compare like with like."""
    groups: dict[tuple, list[Kernel]] = {}
    for k in self.kernels:
      op = re.sub(r'/(?:layer_?)?\d+/', '/N/', k.op_name)
      groups.setdefault((k.category, k.shape, op), []).append(k)
    merged = [KernelGroup(tuple(ks)) for ks in groups.values()]
    return sorted(merged, key=lambda g: -g.total_seconds)[:n]

  def csv(self) -> str:
    """One row per kernel (the `--dump` file)."""
    header = (
      'kernel,computation,opcode,kind,count,category,bound,us_each,ms_total,'
      'bytes_each,matmul_flops_each,shape,op_name,warning'
    )
    rows = [header]
    for k in sorted(self.kernels, key=lambda k: -k.total_seconds):
      fields = [
        k.name,
        k.computation,
        k.opcode,
        k.kind,
        k.count,
        k.category,
        k.bound,
        f'{k.seconds * 1e6:.3f}',
        f'{k.total_seconds * 1e3:.4f}',
        f'{k.bytes:.0f}',
        f'{k.matmul_flops:.0f}',
        k.shape,
        k.op_name,
        k.warning or '',
      ]
      rows.append(','.join(_csv_field(f) for f in fields))
    return '\n'.join(rows) + '\n'


def _csv_field(value) -> str:
  text = str(value)
  if any(c in text for c in ',"\n'):
    text = '"' + text.replace('"', '""') + '"'
  return text


Target = Union[targets.Target, targets.Chip]
CustomCallFlops = kernel_work.CustomCallFlops


def estimate(
  program,
  target: Target,
  *,
  score_dims: Optional[tuple[int, int]] = None,
  custom_call_flops: Optional[CustomCallFlops] = None,
  costs_on_behalf: Optional[kernel_work.CostsOnBehalf] = None,
  kernel_sass: Optional[dict] = None,
) -> Estimate:
  """The roofline estimate of `program` (a `jax.stages.Compiled` or its `as_text()`) on
  `target` (a targets.Target, or a bare targets.Chip). `score_dims` = (L, L) names the
  attention-score arrays for the 'score-sized element-wise' category. `custom_call_flops(
  instruction)` may return the matmul FLOPs of custom kernels (Pallas / Triton / Mosaic) the
  program does not describe; None keeps the warning. `costs_on_behalf(instruction)` may return
  a dict of kernel_work.STATED_FIELDS for kernels that state less than they do (what the kernel
  states itself wins): legacy_kernels.py's for the qk kernels of before issue 40.
  `kernel_sass` ({kernel name: sass.KernelCost}, e.g. sass.from_dump(DIR) of the same
  compile's `xla_dump_to`) charges those fused kernels what their SASS issues (rule 4)."""
  text = program if isinstance(program, str) else program.as_text()
  chip = target.chip if isinstance(target, targets.Target) else target
  devices = target.num_devices if isinstance(target, targets.Target) else 1
  module = hlo_text.parse_module(text)
  walker = _Walker(
    module, chip, devices, score_dims, custom_call_flops, costs_on_behalf, kernel_sass
  )
  walker.visit(module.entry_computation, 1)
  name = target.describe() if isinstance(target, targets.Target) else chip.description
  xla = _xla_cost(program) if not isinstance(program, str) else {}
  return Estimate(
    name,
    tuple(walker.kernels),
    tuple(dict.fromkeys(walker.warnings)),
    xla_optimal_seconds=xla.get('optimal_seconds'),
    xla_flops=xla.get('flops'),
    xla_bytes_accessed=xla.get('bytes accessed'),
  )


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

  def __init__(
    self,
    module: Module,
    chip: targets.Chip,
    devices: int,
    score_dims: Optional[tuple[int, int]],
    custom_call_flops: Optional[CustomCallFlops],
    costs_on_behalf: Optional[kernel_work.CostsOnBehalf] = None,
    kernel_sass: Optional[dict] = None,
  ):
    self.module, self.chip, self.devices = module, chip, devices
    self.score_dims = score_dims
    self.custom_call_flops = custom_call_flops
    self.costs_on_behalf = costs_on_behalf
    self.kernel_sass = kernel_sass
    self.analyzer = kernel_work.Analyzer(
      module, chip, devices, custom_call_flops, costs_on_behalf, kernel_sass
    )
    self.kernels: list[Kernel] = []
    self.warnings: list[str] = []

  def computation(self, name: str) -> Optional[Computation]:
    return self.module.computations.get(name)

  def visit(self, computation: Computation, count: float) -> None:
    for ins in computation.instructions:
      op = ins.opcode
      if op in FREE_OPS:
        continue
      if op == 'while':
        body = self.computation(kernel_work.name_of(ins.attribute('body')))
        condition = self.computation(kernel_work.name_of(ins.attribute('condition')))
        trips = ins.known_trip_count or _counted_loop_trips(ins, computation, condition)
        if trips is None:
          trips = 1
          self.warnings.append(f'{ins.name}: while loop without a known trip count, counted once')
        if body:
          self.visit(body, count * trips)
        if condition:
          self.visit(condition, count * (trips + 1))
      elif op in ('call', 'async-start'):
        for name in ins.called():
          if self.computation(name):
            self.visit(self.computation(name), count)
      elif op == 'conditional':
        self._conditional(ins, computation, count)
      elif op == 'custom-call' and ins.custom_call_target in FREE_CUSTOM_CALLS:
        continue
      else:
        self._kernel(ins, computation, count)

  def _conditional(self, ins: Instruction, computation: Computation, count: float) -> None:
    """A known switch (switches.py) costs each branch for the executions that take it; any
    other conditional its dearest branch, every time, with a warning."""
    shares = switches.branch_shares(ins, computation)
    branches = []
    for i, name in enumerate(ins.called()):
      sub = _Walker(
        self.module,
        self.chip,
        self.devices,
        self.score_dims,
        self.custom_call_flops,
        self.costs_on_behalf,
        self.kernel_sass,
      )
      if self.computation(name):
        sub.visit(self.computation(name), count * shares[i] if shares else count)
      branches.append(sub)
    if not branches:
      return
    taken = branches if shares else [max(branches, key=lambda w: w.seconds())]
    for walker in taken:
      self.kernels.extend(k for k in walker.kernels if k.count)
      self.warnings.extend(walker.warnings)
    if not shares:
      self.warnings.append(
        f'{ins.name}: conditional with {len(branches)} branches, the dearest counted'
      )

  def seconds(self) -> float:
    return sum(k.total_seconds for k in self.kernels)

  def _kernel(self, ins: Instruction, computation: Computation, count: float) -> None:
    work = self.analyzer.work(ins, computation)
    if ins.opcode in HOST_OPS:
      work.warning = f'{ins.name}: host transfer ({ins.opcode}), not costed by the roofline'
    collective = ins.opcode in categories.COLLECTIVE_OPS
    facts = categories.KernelFacts(
      opcodes=frozenset(work.opcodes),
      custom_call_target=ins.custom_call_target,
      matmul_flops=sum(work.matmul_flops.values()),
      is_collective=collective,
      arrays=work.arrays,
      source_files=frozenset(work.files),
    )
    record = work_record(work, collective)
    seconds, bound = kernel_seconds(record, self.chip)
    if work.warning:
      self.warnings.append(work.warning)
    self.kernels.append(
      Kernel(
        name=ins.name,
        computation=computation.name,
        opcode=ins.opcode,
        kind=ins.custom_call_target or ins.backend_kind or ins.fusion_kind or ins.opcode,
        count=int(count) if float(count).is_integer() else count,
        bytes=work.bytes,
        matmul_flops=sum(work.matmul_flops.values()),
        seconds=seconds,
        bound=bound,
        category=categories.categorize(facts, self.score_dims),
        shape=' '.join(str(a) for a in ins.shapes[:3]) + (' ...' if len(ins.shapes) > 3 else ''),
        op_name=ins.op_name,
        warning=work.warning,
        score_sized=categories.touches(work.arrays, self.score_dims),
        work=record,
      )
    )


def _counted_loop_trips(
  loop: Instruction, computation: Computation, condition: Optional[Computation]
) -> Optional[int]:
  """Trips of a counted loop whose backend config states none (TPU): the condition compares
  the tuple element i < N (or <= N) with a constant N, and i starts at a constant."""
  if condition is None:
    return None
  root = kernel_work.resolve(condition, condition.root)
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


WORK_FIELDS = (
  'bytes',
  'l2_bytes',
  'atomics',
  'float_ops',
  'int_ops',
  'transcendentals',
  'link_bytes',
  'programs',
)


def work_record(work: kernel_work.Work, collective: bool = False) -> dict:
  """The numbers kernel_seconds needs, as plain JSON-ready data."""
  record = {field: float(getattr(work, field)) for field in WORK_FIELDS}
  record['matmul_flops'] = {k: float(v) for k, v in work.matmul_flops.items()}
  record['collective'] = collective
  if work.fused:
    record['fused'] = True
  if work.issued:
    record['issued'] = float(work.issued)
  if work.unstated:
    record['unstated'] = list(work.unstated)
  return record


def kernel_seconds(work: dict, chip: targets.Chip) -> tuple[float, str]:
  """(seconds per execution, what bounds it) of one kernel's `work` (work_record) on `chip`:
  the slowest of its HBM bytes, its L2 traffic, its matmuls, its CUDA-core ops and its atomic
  updates, plus the launch (module docstring, rule 4). A fused kernel (work['fused']: a Pallas
  GPU kernel that states its cost) runs its matmuls and its CUDA-core ops in sequence, at
  chip.fused_kernel_efficiency of the peak rates: one term 'matmul+vector'; one whose SASS was
  read (work['issued'], aot/sass.py) runs its matmuls, then its issued instructions at
  chip.issue_efficiency of the issue rate: 'matmul+issue'."""
  launch = chip.launch_overhead_s
  if work.get('collective'):
    return work['link_bytes'] / chip.interconnect_bytes_per_s + launch, 'interconnect'
  rates = chip.roofline_matmul_flops
  matmul = sum(flops / rates[dtype] for dtype, flops in work['matmul_flops'].items())
  vector = _vector_seconds(work, chip)
  parts = {
    'memory': work['bytes'] / chip.roofline_hbm_bytes_per_s,
    'l2': _rate_seconds(work.get('l2_bytes', 0.0), chip.l2_bytes_per_s),
    'atomics': _rate_seconds(work.get('atomics', 0.0), chip.atomic_updates_per_s),
  }
  issue = _rate_seconds(work.get('issued', 0.0), chip.issue_per_s) / chip.issue_efficiency
  if work.get('fused') and issue:
    # What the kernel's SASS issues replaces the counted element-wise ops (it holds them, the
    # hash as compiled, the layout moves and libdevice's range reductions), in sequence with
    # its matmuls: the tensor cores wait for the warps that feed them (aot/sass.py).
    parts['matmul+issue'] = matmul + issue
  elif work.get('fused') and matmul and vector:
    # No warp specialisation: a warp issues the tile's matmul, waits for it, then runs the
    # softmax / dropout / gradient element-wise code; the two do not overlap.
    parts['matmul+vector'] = (matmul + vector) / chip.fused_kernel_efficiency
  elif work.get('fused'):
    parts['matmul'] = matmul / chip.fused_kernel_efficiency
    parts['vector'] = vector / chip.fused_kernel_efficiency
  else:
    parts['matmul'], parts['vector'] = matmul, vector
  idle = _idle_sm_factor(work, chip)
  if idle > 1.0:  # every rate above is the whole chip's; the grid reaches only part of it
    parts = {name: seconds * idle for name, seconds in parts.items()}
  bound = max(parts, key=parts.get)
  if parts[bound] == 0.0:
    bound = 'launch'
  return parts.get(bound, 0.0) + launch, bound


def stated_seconds(
  stated: dict, programs: int, matmul_dtype: str, chip: targets.Chip
) -> tuple[float, str]:
  """kernel_seconds of a Pallas GPU kernel from its own cost statement (the `metadata` a kernel
  of realformer_jax/kernels gives its pallas_call: 'flops', 'bytes_accessed', 'l2_bytes', ...),
  read as kernel_work reads it from a compiled program (fused, its SASS unread), for
  `programs` programs and matmuls on `matmul_dtype` operands ('bf16', 'f32'): what lets a
  kernel choose between variants of itself by the estimate before anything is compiled."""
  number = lambda field: float(stated.get(field, 0.0))
  work = {field: number(field) for field in ('l2_bytes', 'atomics', 'float_ops', 'int_ops')}
  work.update(
    bytes=number('bytes_accessed'),
    transcendentals=number('transcendentals'),
    link_bytes=0.0,
    programs=float(programs),
    matmul_flops={targets.dtype_class(matmul_dtype, None, chip.platform): number('flops')},
    collective=False,
    fused=True,
  )
  return kernel_seconds(work, chip)


def _idle_sm_factor(work: dict, chip: targets.Chip) -> float:
  """chip.sms / programs for a fused kernel whose grid has fewer programs than the GPU has SMs
  (each program runs on one SM: these kernels hold ~170-255 registers a thread at 4-8 warps,
  so a second program would not fit beside it), else 1. At L = 65,536 the qk dS kernel runs
  one head's column panel at a time: 8,192 columns / 64 keys = 128 programs on 132 SMs."""
  programs = work.get('programs', 0.0)
  if not (work.get('fused') and programs and chip.sms) or programs >= chip.sms:
    return 1.0
  return chip.sms / programs


def _rate_seconds(amount: float, rate: Optional[float]) -> float:
  return amount / rate if amount and rate else 0.0


def _vector_seconds(work: dict, chip: targets.Chip) -> float:
  if chip.vector_flops is None:
    return 0.0
  int_ops = work['int_ops']
  if work.get('fused'):  # stated as written; the hash compiles to fewer ops (hash_work.py)
    from realformer_jax.aot import hash_work  # pylint: disable=import-outside-toplevel

    int_ops = hash_work.kernel_int_ops(int_ops)
  return (
    work['float_ops'] / chip.vector_flops
    + int_ops / chip.vector_int_ops
    + work['transcendentals'] / chip.transcendentals
  )

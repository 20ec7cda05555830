"""What one kernel of an optimized HLO program does: HBM bytes, matmul FLOPs by arithmetic,
element-wise ops, interconnect bytes, and what the roofline cannot judge (roofline.py turns
this into time; the rules are in its docstring).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Callable, Iterable, Optional

from realformer_jax.aot import categories, targets
from realformer_jax.aot.hlo_text import Array, Computation, Instruction, Module

CustomCallFlops = Callable[[Instruction], Optional[float]]
# Costs stated on a custom kernel's behalf (the keys of STATED_FIELDS), for kernels that state
# less than the estimator reads (legacy_kernels.py: the qk kernels of before issue 40); what
# the kernel states itself wins.
CostsOnBehalf = Callable[[Instruction], Optional[dict]]
# What a GPU custom kernel that states its cost should also state, or be listed as leaving out
# (Estimate.unstated): its L2 re-reads and its atomics are otherwise costed as zero.
UNSTATED_CHECKED = ('l2_bytes', 'atomics')
# What a custom kernel may state in its metadata (roofline.py's docstring, rule 4):
# matmul FLOPs, HBM bytes, element-wise ops, L2 traffic, global atomic updates; totals per call.
STATED_FIELDS = (
  'flops',
  'bytes_accessed',
  'float_ops',
  'int_ops',
  'transcendentals',
  'l2_bytes',
  'atomics',
)
# What a fused kernel may state beside them, per trip of its element loops, not per call: the
# score elements a program covers (its tile; aot/sass.py divides its SASS by it).
STATED_TILE = 'tile_elements'

# Custom calls that only move or reinterpret data: costed by their bytes, no warning.
MOVEMENT_CALLS = frozenset({'ConcatBitcast', 'SliceToDynamic', 'PadToStatic'})
# Instructions that only move or reinterpret data inside a fusion: no arithmetic.
NO_ARITHMETIC = (
  categories.MOVEMENT_OPS
  | categories.BOOKKEEPING_OPS
  | frozenset(
    {
      'dot',
      'convolution',
      'fusion',
      'call',
      'custom-call',
      'scatter',
      'bitcast-convert',
      'rng-bit-generator',
      'rng-get-and-update-state',
      'sort',
      'while',
      'conditional',
      'partition-id',
      'replica-id',
      'after-all',
      'opt-barrier',
    }
  )
)
TRANSCENDENTAL_OPS = frozenset(
  {
    'exponential',
    'exponential-minus-one',
    'log',
    'log-plus-one',
    'tanh',
    'logistic',
    'erf',
    'sine',
    'cosine',
    'tan',
    'atan2',
    'power',
    'sqrt',
    'rsqrt',
    'cbrt',
  }
)
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
  l2_bytes: float = 0.0  # custom kernels that state it: loads and stores through L2
  atomics: float = 0.0  # custom kernels that state it: global atomic element updates
  # A custom kernel's name and what it leaves unstated of UNSTATED_CHECKED (costed as zero)
  unstated: tuple = ()
  # A GPU custom kernel that states its cost (Pallas Triton): its matmuls and CUDA-core work
  # run in sequence (roofline.kernel_seconds)
  fused: bool = False
  # A Pallas Triton kernel's programs (its grid, from the custom call's backend config)
  programs: float = 0.0
  # Thread instructions one call issues in its element loops, read from its SASS (aot/sass.py;
  # estimate(kernel_sass=...)); 0: not read, the element-wise ops are charged instead
  issued: float = 0.0
  opcodes: set = dataclasses.field(default_factory=set)
  files: set = dataclasses.field(default_factory=set)
  arrays: list = dataclasses.field(default_factory=list)
  warning: Optional[str] = None

  def add_flops(self, dtype_class: str, flops: float) -> None:
    self.matmul_flops[dtype_class] = self.matmul_flops.get(dtype_class, 0.0) + flops


class Analyzer:
  """Work of the kernels of one module on one chip."""

  def __init__(
    self,
    module: Module,
    chip: targets.Chip,
    devices: int,
    custom_call_flops: Optional[CustomCallFlops] = None,
    costs_on_behalf: Optional[CostsOnBehalf] = None,
    kernel_sass: Optional[dict] = None,
  ):
    self.module, self.chip, self.devices = module, chip, devices
    self.custom_call_flops = custom_call_flops
    self.costs_on_behalf = costs_on_behalf
    self.kernel_sass = kernel_sass or {}  # kernel name -> sass.KernelCost

  def work(self, ins: Instruction, computation: Computation) -> Work:
    """What one execution of the kernel `ins` (in `computation`) does."""
    if ins.opcode in categories.COLLECTIVE_OPS:
      return self.collective(ins, computation)
    if ins.opcode == 'fusion':
      return self.fusion(ins, computation)
    if ins.opcode == 'custom-call':
      return self.custom_call(ins, computation)
    return self.single(ins, computation)

  def _operand_arrays(self, ins: Instruction, computation: Computation) -> list[Array]:
    arrays = []
    for name in ins.operands:
      source = computation.by_name.get(name)
      if source is not None:
        arrays.extend(source.shapes)
    return arrays

  def fusion(self, ins: Instruction, computation: Computation) -> Work:
    work = Work()
    fused = self.module.computations.get(name_of(ins.attribute('calls')))
    operands = self._operand_arrays(ins, computation)
    work.arrays = operands + list(ins.shapes)
    if fused is None:
      work.bytes = sum(a.bytes for a in work.arrays)
      return work
    params = fused.parameters()
    work.bytes = sum(_read_bytes(self.module, fused, p) for p in params) + _write_bytes(fused)
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
        precision = (ins.attribute('operand_precision') or '') + (ins.attribute('algorithm') or '')
        work.add_flops(targets.dtype_class(dtype, precision, self.chip.platform), flops)
      elif ins.opcode == 'fusion':
        nested = self.module.computations.get(name_of(ins.attribute('calls')))
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
      work.warning = (
        f'{ins.name}: atomic scatter of {update_rows:,} rows into a {table_rows}'
        f'-row table {table.shapes[0]} (updates {list(update_dims)}): contention '
        'the roofline cannot judge; its real time can be far larger'
      )

  def single(self, ins: Instruction, computation: Computation) -> Work:
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
      work.bytes = 3 * operands[-1].result_bytes + sum(o.result_bytes for o in operands[1:-1] if o)
      self._check_scatter(ins, computation, work)
    else:
      work.bytes = sum(a.bytes for a in operand_arrays) + ins.result_bytes
    if ins.opcode in ('dot', 'convolution'):
      lhs, rhs = (operands + [None, None])[:2]
      dtype = lhs.shapes[0].dtype if lhs is not None and lhs.shapes else 'f32'
      precision = (ins.attribute('operand_precision') or '') + (ins.attribute('algorithm') or '')
      work.add_flops(
        targets.dtype_class(dtype, precision, self.chip.platform), _dot_flops(ins, lhs, rhs)
      )
    elif ins.opcode not in NO_ARITHMETIC:
      _count_ops(ins, computation, work)
    return work

  def custom_call(self, ins: Instruction, computation: Computation) -> Work:
    target = ins.custom_call_target or ''
    work = Work(opcodes={'custom-call'}, files=set(self.module.source_files(ins)))
    operands = [computation.by_name.get(n) for n in ins.operands]
    operand_arrays = [a for o in operands if o is not None for a in o.shapes]
    results = list(ins.shapes)
    if (
      target.startswith(('__cublas', '__cudnn'))
      and len(results) > 1
      and results[-1].dtype in ('u8', 's8')
    ):
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
        work.add_flops(
          targets.dtype_class(q.dtype, None, self.chip.platform),
          factor * b * h * lq * lk * q.dims[-1],
        )
      else:
        work.warning = f'{ins.name}: {target} without score dimensions, costed by bytes only'
    elif target.startswith(categories.THREEFRY_CALLS):
      work.int_ops = THREEFRY_OPS_PER_OUTPUT * sum(a.elements for a in results)
    elif target in MOVEMENT_CALLS:
      work.opcodes = {'copy'}
    elif HOST_CALLBACK.search(target):
      work.warning = f'{ins.name}: host callback {target!r}, not costed by the roofline'
    else:
      behalf = (self.costs_on_behalf(ins) if self.costs_on_behalf else None) or {}
      stated = {**{k: float(v) for k, v in behalf.items()}, **_stated_cost(config)}
      if stated.get('bytes_accessed'):  # the kernel knows what it moves better than its
        work.bytes = float(stated['bytes_accessed'])  # operands' sizes do (in-place, slices)
      # its element-wise work, L2 traffic and atomics
      for field in ('float_ops', 'int_ops', 'transcendentals', 'l2_bytes', 'atomics'):
        setattr(work, field, getattr(work, field) + float(stated.get(field, 0.0)))
      missing = tuple(f for f in UNSTATED_CHECKED if f not in stated)
      work.fused = bool(stated) and self.chip.platform == 'cuda'
      if work.fused:
        work.programs = float(_grid_programs(config))
        cost = self.kernel_sass.get(_kernel_name(config).strip(' ()'))
        if cost is not None:
          work.issued = cost.with_tile(stated.get(STATED_TILE, 0.0)).issued(
            {'transcendentals': work.transcendentals, 'matmul_flops': _stated_matmul(stated)}
          )
      if stated and missing and self.chip.platform == 'cuda':
        work.unstated = ((_kernel_name(config).strip(' ()') or target),) + missing
      flops = stated.get('flops')
      if flops is None and self.custom_call_flops is not None:
        flops = self.custom_call_flops(ins)
      if flops:
        work.add_flops(
          targets.dtype_class(_matmul_dtype(operand_arrays), None, self.chip.platform), float(flops)
        )
      elif flops is None:  # a stated 0 is a kernel without matmuls, not an unknown
        work.warning = (
          f'{ins.name}: custom call {target!r}{_kernel_name(config)} states no '
          'FLOPs, costed by its bytes only (estimate(..., custom_call_flops=...))'
        )
    return work

  def collective(self, ins: Instruction, computation: Computation) -> Work:
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


def name_of(value: Optional[str]) -> str:
  return (value or '').strip('{}').split(',')[0].strip().lstrip('%')


def _follow(computation: Computation, users: dict, name: str) -> Iterable[tuple[Instruction, int]]:
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
      nested = module.computations.get(name_of(user.attribute('calls')))
      inner = (
        next((p for p in nested.parameters() if p.parameter_number == index), None)
        if nested
        else None
      )
      if inner is None:
        return full
      total += _read_bytes(module, nested, inner)
    else:
      return full
  return min(total, full)


def resolve(computation: Computation, ins: Instruction) -> Instruction:
  """`ins`, or what it bitcasts / reshapes."""
  while ins.opcode in TRANSPARENT_OPS and ins.operands and ins.operands[0] in computation.by_name:
    ins = computation.by_name[ins.operands[0]]
  return ins


def _write_bytes(computation: Computation) -> float:
  """HBM bytes a fusion writes: its results, or the update where one is written in place."""
  root = computation.root
  outputs = (
    [computation.by_name.get(n) for n in root.operands] if root.opcode == 'tuple' else [root]
  )
  total = 0.0
  for out in filter(None, outputs):
    source = resolve(computation, out)
    if (
      source.opcode in ('dynamic-update-slice', 'scatter')
      and source.operands
      and resolve(computation, computation.by_name.get(source.operands[0], source)).opcode
      == 'parameter'
    ):
      index = 1 if source.opcode == 'dynamic-update-slice' else -1
      update = computation.by_name.get(source.operands[index])
      total += update.result_bytes if update is not None else out.result_bytes
    elif source.opcode != 'parameter':  # a parameter passed through is not written
      total += out.result_bytes
  return total


def _dot_flops(ins: Instruction, lhs: Optional[Instruction], rhs: Optional[Instruction]) -> float:
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


def _group_size(ins: Instruction, devices: int) -> int:
  """Devices in one replica group of a collective."""
  mesh = re.search(r'replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}', ins.attributes)
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
  text = config[colon + 1 :].lstrip()
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
        return json.loads(text[: i + 1])
      except ValueError:
        return None
  return None


def _grid_programs(config: str) -> int:
  """Programs a Pallas Triton custom call launches: grid_x * grid_y * grid_z of its backend
  config (0 where it states none)."""
  dims = [re.search(rf'grid_{axis} = (\d+)', config) for axis in 'xyz']
  return math.prod(int(d.group(1)) for d in dims) if all(dims) else 0


def _stated_cost(config: str) -> dict:
  """A custom kernel's own cost statement, if any: Mosaic's "cost_estimate", or the `metadata`
  a Pallas Triton kernel carries (`serialized_metadata`, JSON with MLIR's \\22 for quotes;
  realformer_jax/kernels states 'flops' and 'bytes_accessed' there)."""
  cost = _json_field(config, 'cost_estimate')
  if isinstance(cost, dict):
    return cost
  match = re.search(r'serialized_metadata = "((?:[^"\\]|\\.)*)"', config)
  if not match:
    return {}
  try:
    stated = json.loads(match.group(1).replace('\\22', '"'))
  except ValueError:
    return {}
  return {
    key: float(value) for key, value in stated.items() if key in STATED_FIELDS + (STATED_TILE,)
  }


# Float dtypes from the narrowest: a custom kernel's matmuls run at the narrowest it is fed.
_FLOAT_WIDTHS = ('f8e4m3fn', 'f8e5m2', 'bf16', 'f16', 'f32', 'f64')


def _matmul_dtype(operands: list[Array]) -> str:
  """The arithmetic of a custom kernel's stated matmuls: the narrowest float dtype among its
  operands. A kernel fed 16-bit tensors multiplies in 16 bits even where it also reads
  float32 ones (the carried-sum kernels' float32 sum, the qk kernels' float32 stack of 16-bit
  values, cast back per tile); all-float32 operands are a float32 model's kernel."""
  floats = [a.dtype for a in operands if a.dtype in _FLOAT_WIDTHS]
  return min(floats, key=_FLOAT_WIDTHS.index) if floats else 'bf16'


def _stated_matmul(stated: dict) -> dict:
  return {'stated': float(stated['flops'])} if stated.get('flops') else {}


def _kernel_name(config: str) -> str:
  match = re.search(r'name = \\?"([\w.\-]+)\\?"', config) or re.search(
    r'"kernel_name":\s*"([\w.\-]+)"', config
  )
  return f' ({match.group(1)})' if match else ''

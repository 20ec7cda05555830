"""Reading the machine code (SASS) of the Triton kernels: what each loop issues per score element.

The roofline charges a fused kernel its FLOPs and L2 bytes; what its CUDA cores issue (the
hash of drawn dropout masks, libdevice's `exp`, layout moves through shared memory, the `qk`
kernels' per-layer scale and add) is invisible there. The machine code shows it, without a GPU:
XLA dumps every Triton kernel's PTX in a deviceless compile (ptx.py), `ptxas -arch=sm_90a`
assembles it and `cuobjdump -sass` lists the instructions (the `aot` extra's nvidia wheels;
FACTS.md, "SASS without a GPU").

    costs = sass.sass_cost(ptx_text)              # every .entry of the PTX, assembled for sm_90a
    costs = sass.from_dump(DIR)                   # every kernel XLA dumped into DIR
    cost = costs['flash_attention_bwd'].with_tile(64 * 64)  # the tile it states (kernel_work)
    cost.per_element                              # {'fp32': 35.0, 'mma': 1.2, 'shared': ...}
    cost.total_per_element                        # summed over classes and loops: 53.7
    cost.issued(work)                             # thread instructions of one call (roofline)

Counting. A kernel's loops are found as ptx.py finds them (basic blocks from the branch targets,
dominators, back edges). A loop that visits score elements takes at least one softmax
exponential per element (libdevice's `__nv_expf` or a bare `ex2.approx`: one `MUFU.EX2` each),
and its instructions per element are its instructions per trip (the blocks of loops nested in
it counted once a trip) over the elements a thread owns per trip. Those come from the launch,
not from the exponentials: the kernel states the score elements a program covers per trip of
its element loops (its tile, rows x columns: `tile_elements` in its cost metadata, read by
kernel_work) and the PTX its threads (`.reqntid`, 32 x num_warps), so a thread owns tile /
threads per trip (`KernelCost.with_tile`). The `MUFU.EX2`s per trip cross-check it: an element
loop issues at least that many, a whole number per element plus the online softmax's per-row
rescalings (realformer_attention_bwd issues 3 an element: p in three layouts); a stated tile
that no loop exponentiates that often raises. Why the tile and not a stated count of
exponentials: the tile is computed from the same spec the launch uses, so it stays true when
the tiles or warps change, while the exponentials per element are the compiler's choice of
layouts and can change with no line of the kernel changing; they are derived, not stated.
Without a stated tile (an old commit's kernels, a bare SASS listing) the elements are the
largest power of two not above the `MUFU.EX2` count, right only at one exponential an element.
A kernel's figure is the sum over its loops that exponentiate (Post-LN's backward visits every
element twice: its dK/dV loop and its dQ loop). Loops without an exponential (a mask kernel's
hash, the RealFormer dQ kernel) and the code outside the loops (per program, not per element)
are not charged.

roofline.kernel_seconds charges the result (work['issued']: thread instructions per call) at
the target's issue rate (targets.Chip.issue_per_s, four warp instructions per SM per clock)
beside the FLOP / L2 terms; docs/performance.md, "Instructions", has the calibration.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

from realformer_jax.aot import ptx

ARCH = 'sm_90a'  # Hopper: what the H100 and H200 targets compile for
CACHE = pathlib.Path(tempfile.gettempdir()) / 'realformer_jax_sass'
_FUNCTION = re.compile(r'^\s*Function\s*:\s*(\S+)')
# `/*01a0*/   @!P0 BRA 0x330 ;` (cuobjdump -sass: address, guard, opcode, operands)
_INSTRUCTION = re.compile(r'^\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);')
_ADDRESS = re.compile(r'0x([0-9a-f]+)')
_PREDICATE_OPERAND = re.compile(r'(^|[\s,])!?U?P[0-7T]\b')
# Opcode (before its first '.') -> class. The classes are what the CUDA cores issue through
# different pipes; every instruction costs one issue slot of its warp scheduler.
CLASSES = {
  'mma': ('HGMMA', 'HMMA', 'IMMA', 'QGMMA', 'IGMMA', 'WARPGROUP'),
  'mufu': ('MUFU',),
  'fp32': (
    'FFMA', 'FADD', 'FMUL', 'FMNMX', 'FSETP', 'FSEL', 'FSET', 'FCHK', 'FRND', 'FSWZADD',
    'FADD32I', 'FMUL32I', 'FFMA32I',
  ),
  'convert': ('F2F', 'F2FP', 'F2I', 'I2F', 'I2FP', 'F2IP', 'HADD2', 'HMUL2', 'HFMA2', 'HMNMX2'),
  'int': (
    'IMAD', 'IADD3', 'IADD', 'LOP3', 'LOP', 'SHF', 'SHL', 'SHR', 'ISETP', 'SEL', 'PRMT', 'LEA',
    'IABS', 'IMNMX', 'MOV', 'POPC', 'FLO', 'BREV', 'P2R', 'R2P', 'PLOP3', 'VOTE', 'IMUL', 'CS2R',
    'S2R', 'S2UR', 'R2UR', 'LDC', 'BMSK', 'SGXT', 'VIADD', 'VIMNMX',
  ),
  'uniform': ('UIADD3', 'UMOV', 'USHF', 'ULOP3', 'USEL', 'UISETP', 'UIMAD', 'ULDC', 'ULEA',
              'UPRMT', 'USHL', 'USHR', 'UPLOP3', 'ULOP', 'UFLO', 'UPOPC', 'UBMSK', 'USGXT'),
  'shuffle': ('SHFL',),
  'shared': ('LDS', 'STS', 'LDSM', 'STSM', 'ATOMS'),
  'global': ('LDG', 'STG', 'LDGSTS', 'LDGDEPBAR', 'ATOMG', 'ATOM', 'RED', 'REDG', 'UTMALDG',
             'UTMASTG', 'LD', 'ST', 'LDL', 'STL'),
  'barrier': ('BAR', 'DEPBAR', 'MEMBAR', 'FENCE', 'ARRIVES', 'SYNCS', 'WARPSYNC', 'ERRBAR'),
  'control': ('BRA', 'EXIT', 'BSSY', 'BSYNC', 'CALL', 'RET', 'YIELD', 'JMP', 'BRX', 'ACQBULK'),
}  # fmt: skip
_CLASS_OF = {opcode: name for name, opcodes in CLASSES.items() for opcode in opcodes}
_FREE = frozenset({'NOP'})  # padding: issued only where the assembler aligns


def instruction_class(opcode: str) -> str:
  """'FFMA.FTZ' -> 'fp32'; an opcode no class names is 'other'."""
  return _CLASS_OF.get(opcode.split('.')[0], 'other')


@dataclasses.dataclass(frozen=True)
class Instruction:
  address: int
  guarded: bool  # has a predicate guard (`@P0`, `@!UP1`)
  opcode: str  # 'FFMA.FTZ'
  operands: str


@dataclasses.dataclass(frozen=True)
class LoopCost:
  """One loop of a kernel, per thread and trip: its own instructions by class (loops nested in
  it apart), the exponentials among them and the matmul FLOPs its warpgroup MMAs do."""

  header: int  # address of the loop's first instruction
  by_class: dict  # class -> instructions per trip, nested loops' blocks not included
  exps: int  # MUFU.EX2 per trip
  mma_flops: float  # per thread per trip: an HGMMA m64nNk16 is 2 x 64 x N x 16 over 128 threads
  nested: tuple = ()  # headers of the loops inside it
  share: int = 0  # score elements a thread owns per trip, from the stated tile (0: unstated)

  @property
  def instructions(self) -> int:
    return sum(self.by_class.values())

  @property
  def elements(self) -> int:
    """Score elements a thread handles per trip (0: not an element loop). With the tile
    stated, its `share` where the loop exponentiates at least once per element. Unstated, the
    largest power of two not above the exponentials (tiles and warps are powers of two, the
    rest being the online softmax's per-row rescalings, exp(m_old - m_new)): right only where
    the kernel takes one exponential per element."""
    if self.share:
      return self.share if self.exps >= self.share else 0
    return 1 << (self.exps.bit_length() - 1) if self.exps else 0

  @property
  def exps_per_element(self) -> int:
    """Whole exponentials per element (the rest of a trip's are per-row rescalings)."""
    return self.exps // self.elements if self.elements else 0


@dataclasses.dataclass(frozen=True)
class KernelCost:
  """What one kernel's loops issue per score element (module docstring). A loop nested in an
  element loop (the qk kernels' loop over the stacked layers) runs a number of trips per
  element trip that the code does not fix: its instructions are kept apart, per element and
  per nested trip, and `issued` finds the trips from the FLOPs the kernel states."""

  name: str
  loops: tuple  # LoopCost of every loop, by address
  per_element: dict  # class -> instructions per score element of the element loops' own code
  nested_per_element: dict  # class -> per score element per trip of the loops nested in them
  mma_flops_per_element: float  # of the element loops' own code
  nested_mma_flops_per_element: float  # per nested trip
  threads: int = 0  # per program, from the PTX's `.reqntid` (0: unknown)

  @property
  def element_loops(self) -> int:
    """The loops that visit score elements (each once per element of the call)."""
    return sum(1 for loop in self.loops if loop.elements and not _holds_element_loop(self, loop))

  def with_tile(self, tile: float) -> 'KernelCost':
    """This kernel with the tile its launch states (`tile` score elements a program covers per
    trip of its element loops; 0: unstated, the kernel as it is): each loop's elements per
    thread and trip are tile / threads, cross-checked against its `MUFU.EX2`s (module
    docstring)."""
    if not tile or not self.threads or not any(loop.by_class for loop in self.loops):
      return self  # nothing stated, or a committed record (its counts fixed when read)
    share = tile / self.threads
    if share < 1 or share != int(share):
      raise ValueError(
        f'error: {self.name} states a tile of {tile:g} score elements, not a whole share '
        f'of its {self.threads} threads'
      )
    loops = tuple(dataclasses.replace(loop, share=int(share)) for loop in self.loops)
    if any(loop.exps for loop in loops) and not any(loop.elements for loop in loops):
      raise ValueError(
        f'error: {self.name} states {tile:g} score elements a trip ({int(share)} for each of '
        f'its {self.threads} threads), but no loop of its SASS exponentiates that often '
        f'(MUFU.EX2 a trip: {", ".join(str(loop.exps) for loop in loops if loop.exps)}): '
        'is the stated tile the launched one?'
      )
    return _aggregate(self.name, loops, self.threads)

  def nested_trips(self, matmul_flops_per_element: float) -> float:
    """Trips of the nested loops per element trip that make the code's MMAs do the FLOPs a
    kernel states per score element (0 where nothing is nested)."""
    if not self.nested_mma_flops_per_element:
      return 0.0
    extra = matmul_flops_per_element - self.mma_flops_per_element
    return max(extra / self.nested_mma_flops_per_element, 0.0)

  def instructions_per_element(self, nested_trips: float = 1.0) -> dict:
    """class -> instructions per score element, the nested loops at `nested_trips`."""
    out = dict(self.per_element)
    for kind, value in self.nested_per_element.items():
      out[kind] = out.get(kind, 0.0) + value * nested_trips
    return out

  @property
  def total_per_element(self) -> float:
    """Instructions per score element, nested loops once (what a kernel without them issues)."""
    return sum(self.instructions_per_element().values())

  def issued(self, work: dict) -> float:
    """Thread instructions one call issues in its element loops, from the kernel's stated
    work (kernel_work.STATED_FIELDS, per call): one exponential per score element per element
    loop gives the elements; its matmul FLOPs per element, the nested trips."""
    if not self.element_loops or not work.get('transcendentals'):
      return 0.0
    elements = work['transcendentals'] / self.element_loops
    flops = sum(work.get('matmul_flops', {}).values()) / elements
    per_element = self.instructions_per_element(self.nested_trips(flops))
    return sum(per_element.values()) * elements

  def record(self) -> dict:
    """What a calibration commits: per-element counts by class and each loop's trip."""
    rounded = lambda d: {k: round(v, 3) for k, v in sorted(d.items())}
    return {
      'per_element': rounded(self.per_element),
      'nested_per_element': rounded(self.nested_per_element),
      'mma_flops_per_element': round(self.mma_flops_per_element, 3),
      'nested_mma_flops_per_element': round(self.nested_mma_flops_per_element, 3),
      'total_per_element': round(self.total_per_element, 2),
      'threads': self.threads,
      'loops': [
        {
          'header': f'0x{loop.header:x}',
          'exps': loop.exps,
          'elements': loop.elements,
          'instructions': loop.instructions,
          'nested': [f'0x{h:x}' for h in loop.nested],
        }
        for loop in self.loops
      ],
    }

  @classmethod
  def from_record(cls, name: str, record: dict) -> 'KernelCost':
    """A committed record back (record()): what the calibration tables are re-timed from. Its
    loops keep only what element_loops reads (records from before the tile was stated hold
    no 'elements': the power-of-two rule then, as when they were read)."""
    loops = tuple(
      LoopCost(
        int(loop['header'], 16),
        {},
        loop['exps'],
        0.0,
        tuple(int(h, 16) for h in loop['nested']),
        loop.get('elements', 0),
      )
      for loop in record['loops']
    )
    return cls(
      name,
      loops,
      dict(record['per_element']),
      dict(record['nested_per_element']),
      record['mma_flops_per_element'],
      record['nested_mma_flops_per_element'],
      record.get('threads', 0),
    )


def _holds_element_loop(cost: KernelCost, loop: LoopCost) -> bool:
  by_header = {other.header: other for other in cost.loops}
  return any(by_header[h].elements for h in loop.nested if h in by_header)


def functions(sass_text: str) -> dict[str, list[Instruction]]:
  """`cuobjdump -sass` text -> {kernel name: its instructions in address order}."""
  found: dict[str, list[Instruction]] = {}
  current: Optional[list] = None
  for line in sass_text.splitlines():
    function = _FUNCTION.match(line)
    if function:
      current = found.setdefault(function.group(1), [])
      continue
    match = _INSTRUCTION.match(line)
    if match and current is not None:
      address, guard, opcode, operands = match.groups()
      current.append(Instruction(int(address, 16), bool(guard), opcode, operands.strip()))
  return found


def _branch_target(ins: Instruction) -> Optional[int]:
  if ins.opcode.split('.')[0] not in ('BRA', 'JMP'):
    return None
  addresses = _ADDRESS.findall(ins.operands)
  return int(addresses[-1], 16) if addresses else None


def _conditional(ins: Instruction) -> bool:
  """A guarded branch, or one whose operands test a predicate (`BRA.U !UP0, 0x...`)."""
  return ins.guarded or bool(_PREDICATE_OPERAND.search(ins.operands.split('0x')[0]))


def _graph(code: list[Instruction]):
  """(block order, block -> instructions, block -> successors) in ptx.natural_loops' form,
  blocks named by their first address; only the blocks the entry reaches. A CALL falls
  through (its subroutine, placed after EXIT, is left out as unreached)."""
  if not code:
    return [], {}, {}
  leaders = {code[0].address}
  for i, ins in enumerate(code):
    target = _branch_target(ins)
    ends = target is not None or ins.opcode.split('.')[0] in ('EXIT', 'RET')
    if target is not None:
      leaders.add(target)
    if ends and i + 1 < len(code):
      leaders.add(code[i + 1].address)
  order, blocks, current = [], {}, None
  for ins in code:
    if ins.address in leaders:
      current = f'{ins.address:x}'
      order.append(current)
      blocks[current] = []
    blocks[current].append(ins)
  successors = {}
  for i, name in enumerate(order):
    last = blocks[name][-1]
    following = order[i + 1] if i + 1 < len(order) else None
    target, op = _branch_target(last), last.opcode.split('.')[0]
    if target is not None:
      out = [f'{target:x}'] + ([following] if _conditional(last) and following else [])
    elif op in ('EXIT', 'RET'):
      out = [following] if last.guarded and following else []
    else:
      out = [following] if following else []
    successors[name] = [t for t in out if t in blocks]
  order = ptx.reachable(order, successors)
  return order, {n: blocks[n] for n in order}, {n: successors[n] for n in order}


def loops(code: list[Instruction]) -> list[ptx.Loop]:
  """The natural loops of one kernel's instructions (ptx.Loop: header address in hex, blocks,
  their instructions as 'OPCODE operands' lines)."""
  order, blocks, successors = _graph(code)
  lines = {name: [f'{i.opcode} {i.operands}'.strip() for i in blocks[name]] for name in order}
  return ptx.natural_loops(order, lines, successors)


_MMA_SHAPE = re.compile(r'^[HQI]GMMA\.64x(\d+)x(\d+)')


def _mma_flops(opcode: str) -> float:
  """FLOPs per thread of one warpgroup MMA instruction (m64nNkK over the warpgroup's 128
  threads: N x K)."""
  shape = _MMA_SHAPE.match(opcode)
  return float(int(shape.group(1)) * int(shape.group(2))) if shape else 0.0


def kernel_cost(name: str, code: list[Instruction], threads: int = 0) -> KernelCost:
  """Instructions per trip and per score element of every loop of one kernel of `threads` a
  program (its tile unstated: KernelCost.with_tile states it)."""
  found = sorted(loops(code), key=lambda loop: int(loop.header, 16))
  blocks = {}
  order, graph_blocks, _ = _graph(code)
  for name_ in order:
    blocks[name_] = graph_blocks[name_]
  costs = []
  for loop in found:
    inside = [other for other in found if other.blocks < loop.blocks]
    own_blocks = loop.blocks - frozenset().union(*(other.blocks for other in inside))
    by_class: dict[str, int] = {}
    exps, flops = 0, 0.0
    for block in own_blocks:
      for ins in blocks[block]:
        if ins.opcode in _FREE:
          continue
        kind = instruction_class(ins.opcode)
        by_class[kind] = by_class.get(kind, 0) + 1
        exps += ins.opcode.startswith('MUFU.EX2')
        flops += _mma_flops(ins.opcode)
    costs.append(
      LoopCost(
        int(loop.header, 16), by_class, exps, flops, tuple(int(o.header, 16) for o in inside)
      )
    )
  return _aggregate(name, tuple(costs), threads)


def _aggregate(name: str, costs: tuple, threads: int) -> KernelCost:
  """The KernelCost of loops counted per trip: their instructions per score element."""
  by_header = {cost.header: cost for cost in costs}
  own: dict[str, float] = {}
  nested: dict[str, float] = {}
  own_flops = nested_flops = 0.0
  for cost in costs:
    inner = [by_header[h] for h in cost.nested]
    if not cost.elements or any(other.elements for other in inner):
      continue  # not an element loop, or one that holds an element loop (counted there)
    for kind, count in cost.by_class.items():
      own[kind] = own.get(kind, 0.0) + count / cost.elements
    own_flops += cost.mma_flops / cost.elements
    for other in inner:
      for kind, count in other.by_class.items():
        nested[kind] = nested.get(kind, 0.0) + count / cost.elements
      nested_flops += other.mma_flops / cost.elements
  return KernelCost(name, costs, own, nested, own_flops, nested_flops, threads)


def tool(name: str) -> str:
  """Path of `ptxas` / `cuobjdump`: on PATH, in the nvidia wheels of this Python (the `aot`
  extra: site-packages/nvidia/cu13/bin), or in a CUDA toolkit; None found raises naming it."""
  places = [shutil.which(name)]
  for root in sys.path:
    places.append(os.path.join(root, 'nvidia', 'cu13', 'bin', name))
  places += [f'/usr/local/cuda/bin/{name}', f'/usr/local/cuda-13.0/bin/{name}']
  for place in places:
    if place and os.path.isfile(place) and os.access(place, os.X_OK):
      return place
  raise FileNotFoundError(
    f'error: {name} not found (pip install the aot extra: nvidia-cuda-cuobjdump, '
    'nvidia-cuda-nvdisasm; ptxas comes with the CUDA 13 toolkit or the nvidia wheels)'
  )


def disassemble(ptx_text: str, arch: str = ARCH) -> str:
  """`ptxas -arch=ARCH` then `cuobjdump -sass` of one PTX module, cached under CACHE by the
  hash of its text (an assembly takes seconds; the kernels' PTX changes only with the code)."""
  digest = hashlib.sha256(f'{arch}\n{ptx_text}'.encode()).hexdigest()[:20]
  cached = CACHE / f'{digest}.sass'
  if cached.exists():
    return cached.read_text()
  CACHE.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as scratch:
    source, cubin = os.path.join(scratch, 'k.ptx'), os.path.join(scratch, 'k.cubin')
    pathlib.Path(source).write_text(ptx_text)
    subprocess.run(
      [tool('ptxas'), f'-arch={arch}', source, '-o', cubin], check=True, capture_output=True
    )
    text = subprocess.run(
      [tool('cuobjdump'), '-sass', cubin], check=True, capture_output=True, text=True
    ).stdout
  cached.write_text(text)
  return text


def sass_cost(kernel_ptx: str, arch: str = ARCH) -> dict[str, KernelCost]:
  """Every kernel (.entry) of a PTX module -> its KernelCost, assembled for `arch`."""
  count = ptx.threads(kernel_ptx)
  return {
    name: kernel_cost(name, code, count.get(name, 0))
    for name, code in functions(disassemble(kernel_ptx, arch)).items()
  }


@functools.lru_cache(maxsize=8)
def from_dump(dump_dir: str, names: tuple = ()) -> dict[str, KernelCost]:
  """KernelCost of every Triton kernel XLA dumped into `dump_dir` (or only those of `names`):
  each .ptx file assembled alone (a file is one fusion's module)."""
  found: dict[str, KernelCost] = {}
  for file in sorted(pathlib.Path(dump_dir).glob('*.ptx')):
    text = file.read_text()
    entries = ptx.entries(text)
    if names and not any(name in entries for name in names):
      continue
    for name, cost in sass_cost(text).items():
      found.setdefault(name, cost)
  return found

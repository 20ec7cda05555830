"""A reader for XLA's optimized HLO text (`compiled.as_text()`): computations, instructions,
shapes and the attributes a cost model needs.

Only what the roofline (roofline.py) uses is parsed: each instruction's name, opcode, result
shape(s), operand names, the computations it calls (fusion `calls=`, while `body=` /
`condition=`, `to_apply=`, conditional branches), `custom_call_target`, the fusion kind, dot
dimension numbers, `replica_groups`, the while loop's `known_trip_count` from its backend
config, its `metadata` op_name and `stack_frame_id`; and the module's stack-frame tables, which
name the source file of every instruction. Layouts, shardings and the rest are skipped. The
format is XLA's (GPU and TPU modules print the same way); anything unrecognised is kept as text
in `Instruction.attributes`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional

# Bytes per element of XLA primitive types (sub-byte types as fractions).
DTYPE_BYTES = {
  'pred': 1,
  's4': 0.5,
  'u4': 0.5,
  's8': 1,
  'u8': 1,
  's16': 2,
  'u16': 2,
  's32': 4,
  'u32': 4,
  's64': 8,
  'u64': 8,
  'f16': 2,
  'bf16': 2,
  'f32': 4,
  'f64': 8,
  'c64': 8,
  'c128': 16,
  'f8e4m3fn': 1,
  'f8e5m2': 1,
  'f8e4m3': 1,
  'f8e4m3b11fnuz': 1,
  'f8e5m2fnuz': 1,
  'f8e4m3fnuz': 1,
  'f8e3m4': 1,
  'f8e8m0fnu': 1,
  'f4e2m1fn': 0.5,
  'token': 0,
}
_ARRAY = re.compile(
  r'\b(' + '|'.join(sorted(DTYPE_BYTES, key=len, reverse=True)) + r')\[([\d,\s]*)\]'
)


@dataclasses.dataclass(frozen=True)
class Array:
  """One array shape: element type and dimensions."""

  dtype: str
  dims: tuple[int, ...]

  @property
  def elements(self) -> int:
    return math.prod(self.dims)

  @property
  def bytes(self) -> float:
    return self.elements * DTYPE_BYTES[self.dtype]

  def __str__(self) -> str:
    return f'{self.dtype}[{",".join(map(str, self.dims))}]'


def parse_shape(text: str) -> tuple[Array, ...]:
  """Every array in a (possibly tuple) shape string, in order; layouts are ignored."""
  return tuple(
    Array(dtype, tuple(int(d) for d in dims.split(',') if d.strip()))
    for dtype, dims in _ARRAY.findall(text)
  )


@dataclasses.dataclass
class Instruction:
  name: str
  opcode: str
  shapes: tuple[Array, ...]  # the result: one array, or the elements of a tuple
  operands: tuple[str, ...]
  attributes: str  # everything after the operand list, verbatim
  is_root: bool = False
  parameter_number: Optional[int] = None  # parameter instructions only
  operand_text: str = ''  # the operand list verbatim (a constant's value)

  @property
  def result_bytes(self) -> float:
    return sum(a.bytes for a in self.shapes)

  def attribute(self, key: str) -> Optional[str]:
    """The raw value of `key=` (a {...} or "..." group is returned whole), or None."""
    match = re.search(r'(?:^|[\s,])' + re.escape(key) + r'=', self.attributes)
    if not match:
      return None
    return _read_value(self.attributes, match.end())

  def called(self) -> list[str]:
    """Names of the computations this instruction calls."""
    names = []
    for key in (
      'calls',
      'to_apply',
      'condition',
      'body',
      'branch_computations',
      'true_computation',
      'false_computation',
    ):
      value = self.attribute(key)
      if value:
        names.extend(n.strip().lstrip('%') for n in value.strip('{}').split(',') if n.strip())
    return names

  @property
  def custom_call_target(self) -> Optional[str]:
    value = self.attribute('custom_call_target')
    return value.strip('"') if value else None

  @property
  def fusion_kind(self) -> Optional[str]:
    """kLoop / kInput / kOutput / kCustom for fusions; the backend's kind (e.g.
    '__triton_gemm', '__cublas...') comes from `backend_kind`."""
    return self.attribute('kind')

  @property
  def backend_kind(self) -> Optional[str]:
    match = re.search(r'"kind":"([^"]+)"', self.attributes)
    return match.group(1) if match else None

  @property
  def known_trip_count(self) -> Optional[int]:
    match = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', self.attributes)
    return int(match.group(1)) if match else None

  @property
  def op_name(self) -> str:
    match = re.search(r'op_name="((?:[^"\\]|\\.)*)"', self.attributes)
    return match.group(1) if match else ''

  @property
  def stack_frame_id(self) -> Optional[int]:
    match = re.search(r'stack_frame_id=(\d+)', self.attributes)
    return int(match.group(1)) if match else None

  def dims_attribute(self, key: str) -> tuple[int, ...]:
    value = self.attribute(key)
    if not value:
      return ()
    return tuple(int(x) for x in value.strip('{}').split(',') if x.strip())


@dataclasses.dataclass
class Computation:
  name: str
  instructions: list[Instruction]
  is_entry: bool = False

  def __post_init__(self):
    self.by_name = {i.name: i for i in self.instructions}

  @property
  def root(self) -> Instruction:
    return next((i for i in self.instructions if i.is_root), self.instructions[-1])

  def parameters(self) -> list[Instruction]:
    """Parameter instructions ordered by their parameter number."""
    params = [i for i in self.instructions if i.opcode == 'parameter']
    return sorted(params, key=lambda i: i.parameter_number)

  def users(self) -> dict[str, list[Instruction]]:
    result: dict[str, list[Instruction]] = {}
    for instruction in self.instructions:
      for operand in instruction.operands:
        result.setdefault(operand, []).append(instruction)
    return result


@dataclasses.dataclass
class Module:
  name: str
  computations: dict[str, Computation]
  entry: str
  frame_files: dict[int, tuple[str, ...]]  # stack_frame_id -> source files, innermost first

  @property
  def entry_computation(self) -> Computation:
    return self.computations[self.entry]

  def source_files(self, instruction: Instruction) -> tuple[str, ...]:
    frame = instruction.stack_frame_id
    return self.frame_files.get(frame, ()) if frame is not None else ()


def _read_value(text: str, start: int) -> str:
  """The attribute value starting at `start`: a balanced {...} / (...) group, a quoted string,
  or a bare token up to the next ', '."""
  if start >= len(text):
    return ''
  opener = text[start]
  if opener in '{(':
    closer = '}' if opener == '{' else ')'
    depth, i, quoted = 0, start, False
    while i < len(text):
      c = text[i]
      if c == '"' and text[i - 1] != '\\':
        quoted = not quoted
      elif not quoted:
        if c == opener:
          depth += 1
        elif c == closer:
          depth -= 1
          if depth == 0:
            return text[start : i + 1]
      i += 1
    return text[start:]
  if opener == '"':
    match = re.match(r'"((?:[^"\\]|\\.)*)"', text[start:])
    return match.group(0) if match else text[start:]
  match = re.match(r'[^,\s]*', text[start:])
  return match.group(0)


def _balanced(text: str, start: int) -> int:
  """Index just past the parenthesised group that opens at text[start] == '('."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] == '(':
      depth += 1
    elif text[i] == ')':
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


_INSTRUCTION = re.compile(r'^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*')
_OPCODE = re.compile(r'\s*([a-z][\w\-]*)\(')
_HEADER = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$')


def parse_instruction(line: str) -> Optional[Instruction]:
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  rest = line[match.end() :]
  # The result shape: a tuple in balanced parentheses, or one token (array with layout).
  if rest.startswith('('):
    end = _balanced(rest, 0)
  else:
    end = rest.find(' ')
    end = len(rest) if end < 0 else end
  shape_text, rest = rest[:end], rest[end:]
  op = _OPCODE.match(rest)
  if not op:
    return None
  open_at = op.end() - 1
  close_at = _balanced(rest, open_at)
  operand_text = rest[open_at + 1 : close_at - 1]
  operands = tuple(m.group(1) for m in re.finditer(r'%([\w.\-]+)', operand_text))
  opcode = op.group(1)
  return Instruction(
    name=match.group(2),
    opcode=opcode,
    shapes=parse_shape(shape_text),
    operands=operands,
    attributes=rest[close_at:].lstrip(', '),
    is_root=bool(match.group(1)),
    parameter_number=int(operand_text) if opcode == 'parameter' else None,
    operand_text=operand_text,
  )


def _stack_frames(lines: list[str]) -> dict[int, tuple[str, ...]]:
  """stack_frame_id -> the source file of that frame and of its parents."""
  sections: dict[str, dict[int, str]] = {}
  current = None
  for line in lines:
    if line in ('FileNames', 'FunctionNames', 'FileLocations', 'StackFrames'):
      current = sections.setdefault(line, {})
      continue
    if current is None:
      continue
    match = re.match(r'^(\d+)\s+(.*)$', line)
    if not match:
      current = None
      continue
    current[int(match.group(1))] = match.group(2)
  files = {k: v.strip('"') for k, v in sections.get('FileNames', {}).items()}
  location_file = {}
  for k, v in sections.get('FileLocations', {}).items():
    match = re.search(r'file_name_id=(\d+)', v)
    if match:
      location_file[k] = files.get(int(match.group(1)), '')
  frames = {}
  for k, v in sections.get('StackFrames', {}).items():
    loc = re.search(r'file_location_id=(\d+)', v)
    parent = re.search(r'parent_frame_id=(\d+)', v)
    frames[k] = (
      location_file.get(int(loc.group(1)), '') if loc else '',
      int(parent.group(1)) if parent else 0,
    )
  chains = {}
  for frame in frames:
    chain, seen, f = [], set(), frame
    while f in frames and f not in seen:
      seen.add(f)
      chain.append(frames[f][0])
      f = frames[f][1]
    chains[frame] = tuple(chain)
  return chains


def parse_module(text: str) -> Module:
  """The whole module. Raises ValueError if the text has no ENTRY computation."""
  lines = text.splitlines()
  module_name = ''
  if lines and lines[0].startswith('HloModule'):
    module_name = lines[0].split()[1].rstrip(',')
  computations: dict[str, Computation] = {}
  entry = None
  current: Optional[list[Instruction]] = None
  header = None
  for line in lines:
    if current is None:
      match = _HEADER.match(line)
      if match and not line.startswith(' '):
        header = (match.group(2), bool(match.group(1)))
        current = []
      continue
    if line.strip() == '}':
      name, is_entry = header
      computations[name] = Computation(name, current, is_entry)
      if is_entry:
        entry = name
      current = None
      continue
    instruction = parse_instruction(line)
    if instruction is not None:
      current.append(instruction)
  if entry is None:
    raise ValueError('HLO text has no ENTRY computation (expected compiled.as_text())')
  return Module(module_name, computations, entry, _stack_frames(lines))

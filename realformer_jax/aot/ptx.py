"""Reading the PTX of the Triton kernels from a deviceless compile: which loops hold what.

XLA writes every Triton kernel's PTX where `compile({'xla_dump_to': DIR})` (or
`XLA_FLAGS=--xla_dump_to=DIR`) points, also when it compiles for a GPU this host does not have
(targets.py). The kernels' loops are not visible in the PTX's text order (LLVM rotates loops
and places blocks out of line), so they are found as a compiler finds them: basic blocks,
their dominators, back edges, natural loops.

    texts = ptx.entries(ptx.dumped(DIR))          # {'realformer_qk_attention_fwd': '...', ...}
    for loop in ptx.loops(texts['realformer_qk_attention_fwd']):
      loop.innermost, loop.count('wgmma.mma_async'), loop.mma_waits()

What it is for: `wgmma.wait_group.sync.aligned N` blocks until at most N asynchronous
warpgroup MMAs are still in flight. N = 0 inside a loop of MMAs idles the tensor cores on every
trip (the next product cannot start before the last one is done); a loop that accumulates into
one accumulator keeps N > 0 there and waits for 0 once, after it (tests/kernels/test_qk_carry.py
holds the qk kernels' layer loops to that).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Iterable

_ENTRY = re.compile(r'\.entry\s+(\w+)\s*\(')
_THREADS = re.compile(r'\.(?:reqntid|maxntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?')
_LABEL = re.compile(r'^\s*(\$?[\w.$]+):\s*$')
_BRANCH = re.compile(r'^\s*(@!?%\w+\s+)?bra(\.uni)?\s+(\$?[\w.$]+)\s*;')
_EXIT = re.compile(r'^\s*(ret|exit)\s*;')
_PREDICATE = re.compile(r'^\s*@!?%\w+\s+')
_MMA_WAIT = re.compile(r'wgmma\.wait_group\.sync\.aligned\s+(\d+)\s*;')


def dumped(dump_dir: str) -> str:
  """Every PTX file XLA dumped into `dump_dir`, concatenated."""
  texts = []
  for name in sorted(os.listdir(dump_dir)):
    if name.endswith('.ptx'):
      with open(os.path.join(dump_dir, name)) as f:
        texts.append(f.read())
  return '\n'.join(texts)


def entries(ptx: str) -> dict[str, str]:
  """Kernel name (the pallas_call's `name`) -> the instructions of its body."""
  found = {}
  for match in _ENTRY.finditer(ptx):
    start = ptx.index('{', match.end())
    depth, end = 0, start
    for end in range(start, len(ptx)):
      depth += {'{': 1, '}': -1}.get(ptx[end], 0)
      if depth == 0:
        break
    found[match.group(1)] = ptx[start + 1 : end]
  return found


def threads(ptx: str) -> dict[str, int]:
  """Kernel name -> threads per program, from the `.reqntid` / `.maxntid` between its
  parameters and its body (Triton writes 32 x num_warps there); kernels without one left out."""
  found = {}
  for match in _ENTRY.finditer(ptx):
    dims = _THREADS.search(ptx[match.end() : ptx.find('{', match.end())])
    if dims:
      found[match.group(1)] = math.prod(int(d) for d in dims.groups() if d)
  return found


@dataclasses.dataclass(frozen=True)
class Loop:
  """A natural loop of a kernel: its header block's label and its blocks' instructions."""

  header: str
  blocks: frozenset[str]
  lines: tuple[str, ...]
  innermost: bool  # no other loop nests inside it

  def count(self, opcode: str) -> int:
    """Instructions of the loop whose text starts with `opcode` (e.g. 'wgmma.mma_async')."""
    return sum(1 for line in self.lines if _opcode(line).startswith(opcode))

  def mma_waits(self) -> list[int]:
    """The N of every `wgmma.wait_group.sync.aligned N` in the loop."""
    return [int(m.group(1)) for line in self.lines for m in [_MMA_WAIT.search(line)] if m]


def _instructions(body: str) -> list[str]:
  lines = []
  for raw in body.splitlines():
    line = raw.split('//')[0].strip()
    if line and not line.startswith(('.reg', '.shared', '.local', '{', '}')):
      lines.append(line)
  return lines


def _blocks(body: str) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
  """(block order, block -> instructions, block -> successors)."""
  order, code, ends = [], {}, {}
  current = '$entry'
  order.append(current)
  code[current] = []

  def start(name: str) -> None:
    nonlocal current
    current = name
    order.append(name)
    code[name] = []

  fresh = 0
  for line in _instructions(body):
    label = _LABEL.match(line)
    if label:
      start(label.group(1))
      continue
    code[current].append(line)
    branch, leaves = _BRANCH.match(line), _EXIT.match(line)
    if branch or leaves:
      conditional = bool(branch and branch.group(1))
      ends[current] = ([branch.group(3)] if branch else []) + (['<next>'] if conditional else [])
      fresh += 1
      start(f'$after{fresh}')
  successors = {}
  for i, name in enumerate(order):
    following = order[i + 1] if i + 1 < len(order) else None
    targets = ends.get(name, ['<next>'])
    successors[name] = [
      following if t == '<next>' else t for t in targets if t != '<next>' or following
    ]
  order = reachable(order, successors)
  return order, code, {name: successors[name] for name in order}


def reachable(order: list[str], successors: dict[str, list[str]]) -> list[str]:
  """The blocks of `order` its entry (the first) reaches, in order: the empty remainder after
  an unconditional branch is not a block of the kernel, and would hide every dominator."""
  reached, work = {order[0]}, [order[0]]
  while work:
    for target in successors[work.pop()]:
      if target not in reached:
        reached.add(target)
        work.append(target)
  return [name for name in order if name in reached]


def _dominators(order: list[str], successors: dict[str, list[str]]) -> dict[str, set[str]]:
  predecessors = {name: [] for name in order}
  for name, targets in successors.items():
    for target in targets:
      predecessors[target].append(name)
  everything = set(order)
  dominators = {name: set(everything) for name in order}
  dominators[order[0]] = {order[0]}
  changed = True
  while changed:
    changed = False
    for name in order[1:]:
      preds = [dominators[p] for p in predecessors[name]]
      new = (set.intersection(*preds) if preds else set()) | {name}
      if new != dominators[name]:
        dominators[name], changed = new, True
  return dominators


def loops(body: str) -> list[Loop]:
  """The natural loops of one kernel body (`entries(...)[name]`), loops sharing a header
  merged."""
  return natural_loops(*_blocks(body))


def natural_loops(
  order: list[str], code: dict[str, list], successors: dict[str, list[str]]
) -> list[Loop]:
  """The natural loops of a control-flow graph (blocks in `order` from the entry, each with its
  instructions and successors), loops sharing a header merged: also sass.py's, whose blocks
  are found from machine code addresses instead of labels."""
  dominators = _dominators(order, successors)
  predecessors = {name: [] for name in order}
  for name, targets in successors.items():
    for target in targets:
      predecessors[target].append(name)
  found: dict[str, set[str]] = {}
  for tail in order:
    for header in successors[tail]:
      if header in dominators[tail]:  # a back edge tail -> header
        # the blocks that reach the tail without passing the header
        members, work = {header, tail}, [tail] if tail != header else []
        while work:
          for p in predecessors[work.pop()]:
            if p not in members:
              members.add(p)
              work.append(p)
        found.setdefault(header, set()).update(members)
  result = []
  for header, members in found.items():
    innermost = not any(other < members for h, other in found.items() if h != header)
    lines = tuple(line for name in order if name in members for line in code[name])
    result.append(Loop(header, frozenset(members), lines, innermost))
  return result


def innermost_mma_loops(body: str) -> list[Loop]:
  """The innermost loops that issue warpgroup MMAs (the loops whose trips a wait stalls)."""
  return [loop for loop in loops(body) if loop.innermost and loop.count('wgmma.mma_async')]


def _opcode(line: str) -> str:
  """An instruction's opcode, its predicate dropped: '@%p1 bra $L;' -> 'bra'."""
  words = _PREDICATE.sub('', line).split()
  return words[0].rstrip(';') if words else ''


def opcodes(lines: Iterable[str]) -> dict[str, int]:
  """How many of each opcode (e.g. 'mul.hi.u32') the lines hold."""
  counts: dict[str, int] = {}
  for line in lines:
    opcode = _opcode(line)
    if opcode:
      counts[opcode] = counts.get(opcode, 0) + 1
  return counts

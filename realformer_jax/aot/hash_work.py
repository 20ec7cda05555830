"""The integer work of the attention-dropout hash, counted from the code the kernels run.

The fused kernels state their integer ops per score element as written (a rotation is two
shifts and an or; the Triton kernels' hand count: ~18 for the 8-bit Threefry draw, 20 with the
mask's bookkeeping). What the GPU executes is less: PTX has a funnel shift (`shf.l.wrap.b32`)
and ptxas turns every `(x << r) | (x >> (32 - r))` of a Threefry round into one (read in the
dumped PTX of the deviceless sm_90a compile, FACTS.md), and a 32 x 32 -> 64-bit product whose
high half is kept is one `mul.hi.u32` (Philox). So the estimator asks the code:

    counts = hash_work.per_decision()   # the draw the kernels call, traced to a jaxpr
    counts.written, counts.compiled     # integer ops per dropout decision (per score element)
    counts.compiled_share               # compiled / written

Counting walks the jaxpr of the kernels' tile draw (`kernels/dropout_tiles.keep_tile_joined`,
whatever generator it runs) on one [rows, cols] tile and divides the element-ops of every
integer primitive by the tile's decisions; `written` counts each primitive once per element,
`compiled` folds each rotation into one op and each high-half product into one. Ops on
operands that do not vary across the tile (the key schedule) are scalar work of a program, not
per element, and are left out of both. Nothing here is typed in: a new generator (Philox,
issue 57) is counted the same way when the kernels call it.

roofline.kernel_seconds charges a fused kernel's stated integer ops at `compiled_share` of
what they state (`kernel_int_ops`): the hash is nearly all of them (its bit unpacking is a shift
and an and, which the share barely moves), so the charge follows the generated code.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

TILE = (64, 64)  # the tile the draw is traced on: any tile gives the same per-element count
_COMMUTATIVE_OR = ('or', 'add')  # a rotation's halves are combined by an or (or an add)
_SHIFTS = ('shift_left', 'shift_right_logical')
# Primitives that move or rename bits at no cost once compiled into a kernel's registers.
_FREE = frozenset(
  {
    'broadcast_in_dim',
    'reshape',
    'squeeze',
    'expand_dims',
    'concatenate',
    'iota',
    'copy',
    'copy_p',
    'transpose',
    'stack',  # a Triton join: the draws' bytes interleaved, no arithmetic
    'slice',
    'convert_element_type',  # uint32 <-> int32 / bool: a reinterpretation
  }
)


@dataclasses.dataclass(frozen=True)
class Counts:
  """Integer element-ops per dropout decision."""

  written: float  # every integer primitive once per element
  compiled: float  # rotations as one funnel shift, high-half products as one mul.hi

  @property
  def compiled_share(self) -> float:
    return self.compiled / self.written if self.written else 1.0


def _is_int(aval) -> bool:
  dtype = getattr(aval, 'dtype', None)
  return dtype is not None and (
    jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_)
  )


def _elements(aval) -> int:
  return int(np.prod(getattr(aval, 'shape', ()) or (1,)))


def _sub_jaxprs(eqn):
  for value in eqn.params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jax.extend.core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jax.extend.core.Jaxpr):
        yield item


def count_jaxpr(jaxpr, *, per_element_of: int) -> Counts:
  """Integer element-ops of `jaxpr` (and the jaxprs it calls) over `per_element_of` decisions;
  ops whose result is a scalar (per program, not per element) are left out."""
  written = compiled = 0.0

  def walk(j):
    nonlocal written, compiled
    producers = {}
    uses: dict = {}
    for eqn in j.eqns:
      for v in eqn.invars:
        if isinstance(v, jax.extend.core.Var):
          uses[v] = uses.get(v, 0) + 1
      for v in eqn.outvars:
        producers[v] = eqn
    folded = set()  # shifts that are half of a rotation: free once the or is one funnel shift
    for eqn in j.eqns:
      if eqn.primitive.name in _COMMUTATIVE_OR:
        halves = [producers.get(v) for v in eqn.invars if isinstance(v, jax.extend.core.Var)]
        if _is_rotation(halves, uses):
          folded.update(id(h) for h in halves)
    for eqn in j.eqns:
      subs = list(_sub_jaxprs(eqn))
      if subs:
        for sub in subs:
          walk(sub)
        continue
      name = eqn.primitive.name
      out = eqn.outvars[0].aval if eqn.outvars else None
      if name in _FREE or out is None or not _is_int(out) or _elements(out) <= 1:
        continue
      operands = [v.aval for v in eqn.invars if hasattr(v, 'aval')]
      if not all(_is_int(a) for a in operands):
        continue  # a comparison of floats, a select on float data: not the hash's
      n = _elements(out)
      written += n
      if id(eqn) not in folded:
        compiled += n

  walk(jaxpr)
  return Counts(written / per_element_of, compiled / per_element_of)


def _is_rotation(halves, uses) -> bool:
  """(x << r) | (x >> (32 - r)) of one x, each shift used only here: one funnel shift."""
  if len(halves) != 2 or any(h is None or h.primitive.name not in _SHIFTS for h in halves):
    return False
  if {h.primitive.name for h in halves} != set(_SHIFTS):
    return False
  sources = [h.invars[0] for h in halves]
  if sources[0] is not sources[1]:
    return False
  return all(uses.get(h.outvars[0], 0) == 1 for h in halves)


def _default_draw() -> Callable:
  from realformer_jax.kernels.dropout import dropout_tiles  # pylint: disable=import-outside-toplevel

  return dropout_tiles.keep_tile_joined


@functools.lru_cache(maxsize=None)
def _per_decision(draw: Optional[Callable]) -> Counts:
  draw = draw or _default_draw()
  rows, cols = TILE
  words = (jnp.uint32(0),) * 2

  def tile(k1, k2, row0, col0):
    return draw(k1, k2, row0, col0, TILE, 230)

  jaxpr = jax.make_jaxpr(tile)(*words, jnp.uint32(0), jnp.uint32(0)).jaxpr
  return count_jaxpr(jaxpr, per_element_of=rows * cols)


def per_decision(draw: Optional[Callable] = None) -> Counts:
  """Integer ops per dropout decision of `draw(k1, k2, row0, col0, shape, threshold)` (default:
  the tile draw the Triton kernels call), counted from its jaxpr."""
  return _per_decision(draw)


def kernel_int_ops(stated: float) -> float:
  """A fused GPU kernel's integer ops as compiled: its statement (ops as written) at the hash's
  compiled share."""
  return stated * per_decision().compiled_share if stated else 0.0

"""The record of a kernel backend, and the table every user of a backend asks.

A backend is one folder under kernels/backends/ (or any importable package of your own) whose
`__init__.py` makes one `Backend` record, and one `register(record)` of it (the built-in ones
are registered in backends/__init__.py). Nothing else in the repository names a backend: the
config's `attention_impl`, the choice of kernel by platform, the tile sizes, the head padding,
the dispatch to its modules, the refusals of what it cannot do, the device self-check and the
compiled-HLO categories all read the record. The record holds no jax code: the modules it names
are imported when a model first runs through them, so a CPU-only install never loads a
lowering it does not run.

Two kinds of backend:
- fused (the Pallas kernels): `attention` is a module with
      forward(qkv, acc_in, bias, fparams, iparams, spec) -> (out, lse, acc_out, bits)
      backward(qkv, g_out, lse, delta, acc, g_acc, bias, fparams, iparams, bits, spec,
               rebuild=False) -> (dqkv, g_acc_in, acc_in)
  over the arrays and the `KernelSpec` that kernels/plumbing/spec.py describes (fused.py wraps them
  in
  one custom VJP; `lse` and `bits` are the backend's own, handed from its forward to its
  backward; `bits` None with dropout on: the backward draws the mask itself), and optionally
  fit_blocks(spec, seq_len) -> spec (the device's tiles); `qk_attention`, where it has one,
  a module with the residual_carry='qk' kernels
      forward(stack, v, bias, fparams, iparams, layer, spec) -> (out, lse, bits)
      backward(stack, v, do, lse, delta, bias, fparams, iparams, layer, bits, g_stack, spec)
               -> (dv, g_stack)
  and optionally fit_blocks(spec, layers, seq_len, head_dim) -> spec (tiles for N layers).
- a call (`call` names a function of `attention`): f(q, k, v, bias_Bx1x1xL, scale_B) -> out,
  differentiable as it is; post / pre attention only (residual=False, dropout=False).
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Callable, Optional

# The attention_impl values that name no backend (config.py, select.py).
MODES = ('auto', 'xla', 'pallas')
PLATFORMS = ('cpu', 'gpu', 'tpu')

Tiles = Callable[[int, bool], Optional[tuple[int, int, int]]]


def unpadded(head_dim: int) -> int:
  return head_dim


def untiled(seq_len: int, interpret: bool) -> Optional[tuple[int, int, int]]:
  del interpret
  return (seq_len, seq_len, seq_len)


def largest_block(seq_len: int, cap: int, floor: int) -> Optional[int]:
  """The largest power-of-two multiple of `floor`, at most `cap`, that divides seq_len."""
  block = cap
  while block >= floor:
    if seq_len % block == 0:
      return block
    block //= 2
  return None


@dataclasses.dataclass(frozen=True)
class Backend:
  """Everything the rest of the repository knows about one kernel backend."""

  name: str  # KernelSpec.backend, AttentionPlan.backend: 'triton'
  attention_impl: str  # the model.attention_impl value that names it: 'pallas_triton'
  platform: str  # where it compiles: 'gpu' | 'tpu' | 'cpu'
  attention: str  # module of its attention kernels (see the module docstring), imported on use
  qk_attention: Optional[str] = None  # module of its residual_carry='qk' kernels, or None
  call: Optional[str] = None  # a call backend: the function of `attention` that attends
  # 'auto' and 'pallas' take it on its platform (the first registered such backend).
  platform_default: bool = False
  # It runs in Pallas interpret mode on a CPU (tests); 'pallas' on a CPU takes the first
  # registered such backend.
  interpret: bool = False
  # tiles(seq_len, interpret) -> (block_q, block_k, block_bwd), or None where the sequence
  # length cannot be tiled; `tile_rule` says which lengths can, for the error line.
  tiles: Tiles = untiled
  tile_rule: str = ''
  head_dim: Callable[[int], int] = unpadded  # the head size its kernels run at (zero padded)
  # A sequence length its tiles take at less than their largest size: the device check
  # compiles it too (experiments/device_check.py).
  odd_length: Optional[int] = None
  # Prefixes of its custom-call targets in optimized HLO (aot/categories.py: attention).
  hlo_calls: tuple[str, ...] = ()
  residual: bool = True  # it carries residual attention's scores
  dropout: bool = True  # it applies attention dropout
  dtypes: tuple[str, ...] = ()  # the compute dtypes its kernels take (empty: every one)
  # 'auto' / 'pallas' take it on its platform, ahead of the platform's default, only where
  # experiments.device_check passed every case on this device kind, jax and kernel source and
  # the device suite timed it faster than the default there (analysis/device_checks.py); an
  # explicit attention_impl takes it anywhere.
  after_device_check: bool = False
  # The dropout generators (model.dropout_generator) its kernels draw the einsum path's masks
  # with; another is refused in one line (kernels/plumbing/select.py), never drawn as a default.
  dropout_generators: tuple[str, ...] = ('threefry',)

  def __post_init__(self):
    if self.platform not in PLATFORMS:
      raise ValueError(f'Backend {self.name!r}: platform={self.platform!r} not in {PLATFORMS}')
    if self.call is not None and (self.residual or self.dropout or self.qk_attention):
      raise ValueError(
        f'Backend {self.name!r}: a call backend attends without residual scores, dropout '
        'or qk kernels (residual=False, dropout=False, qk_attention=None)'
      )

  @property
  def fused(self) -> bool:
    """Its kernels run under fused.py's custom VJP (forward / backward over a KernelSpec)."""
    return self.call is None

  @property
  def qk(self) -> bool:
    return self.qk_attention is not None

  def kernels(self) -> ModuleType:
    """The attention module (imported now, on first use)."""
    return importlib.import_module(self.attention)

  def qk_kernels(self) -> ModuleType:
    if self.qk_attention is None:
      raise ValueError(f'Backend {self.name!r} has no residual_carry=qk kernels')
    return importlib.import_module(self.qk_attention)

  def attend(self) -> Callable:
    """A call backend's function."""
    return getattr(self.kernels(), self.call)


_BACKENDS: dict[str, Backend] = {}  # by name, in registration order


def register(backend: Backend) -> Backend:
  """Adds `backend` to the table (its name and attention_impl must be new); returns it."""
  taken = set(MODES) | {n for b in _BACKENDS.values() for n in (b.name, b.attention_impl)}
  for value in (backend.name, backend.attention_impl):
    if value in taken:
      raise ValueError(f'register({backend.name!r}): {value!r} is already taken')
  _BACKENDS[backend.name] = backend
  return backend


def unregister(name: str) -> None:
  """Removes a backend (a test's toy backend)."""
  _BACKENDS.pop(name, None)


def registered() -> tuple[Backend, ...]:
  return tuple(_BACKENDS.values())


def get(name: str) -> Backend:
  """The backend of a KernelSpec / AttentionPlan name."""
  if name not in _BACKENDS:
    raise ValueError(f'kernel backend {name!r}: not registered (one of {", ".join(_BACKENDS)})')
  return _BACKENDS[name]


def for_impl(attention_impl: str) -> Optional[Backend]:
  """The backend an attention_impl value names, or None for a mode ('auto', 'xla', 'pallas')
  or an unknown value."""
  for backend in _BACKENDS.values():
    if backend.attention_impl == attention_impl:
      return backend
  return None


def attention_impls() -> tuple[str, ...]:
  """Every value model.attention_impl accepts."""
  return MODES + tuple(b.attention_impl for b in _BACKENDS.values())


def hlo_calls() -> tuple[str, ...]:
  """Every registered backend's custom-call target prefixes."""
  return tuple(call for b in _BACKENDS.values() for call in b.hlo_calls)

"""Which attention path a model takes: `ModelConfig.attention_impl` on a platform.

| attention_impl | cpu                     | gpu                        | tpu                      |
|----------------|-------------------------|----------------------------|--------------------------|
| auto           | xla (einsum path)       | pallas_triton              | pallas_mosaic            |
| xla            | einsum path             | einsum path                | einsum path              |
| pallas         | pallas_triton, interpret| pallas_triton              | pallas_mosaic            |
| pallas_triton  | interpret mode          | Triton kernels             | error                    |
| pallas_mosaic  | interpret mode          | error                      | Mosaic kernels           |
| cudnn          | error                   | jax's cuDNN flash attention| error                    |

The table is what the registered backends' records say (kernels/backends/: each backend's
platform, whether 'auto' / 'pallas' take it there, whether it runs in interpret mode on a
CPU); a backend registered later adds a row. `check` refuses, in one line, an attention_impl
that names no backend and a backend asked for what its record says it cannot do.

The platform is `ModelConfig.attention_platform`; the train setup sets it to the platform of
the mesh's devices (`resolve_platform`), which in a deviceless compile is the target's, not
`jax.default_backend()`. Left at 'auto' (a model used directly), it is the default backend when
traced. 'auto' also takes the einsum path for a sequence length the kernels cannot tile (and
when attention maps are asked for: `sow`n maps need the probabilities the kernels never
write); an explicit kernel raises a one-line ConfigError instead.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels import backends
from realformer_jax.kernels.backends.registry import MODES

_PLATFORM_NAMES = {'cpu': 'cpu', 'gpu': 'gpu', 'cuda': 'gpu', 'rocm': 'gpu', 'tpu': 'tpu'}


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
  """A fused path: a registered backend, and the tile sizes of its kernels."""

  path: str  # 'pallas': a fused backend's kernels (fused.py); 'call': a call backend
  backend: Optional[str] = None  # its name: 'triton' | 'mosaic' | 'cudnn' | ...
  interpret: bool = False
  block_q: int = 0
  block_k: int = 0
  block_bwd: int = 0
  # Each layer is rematerialised (model.remat_policy != 'none'): plain attention keeps its
  # output and row statistics for the backward instead of running again (KernelSpec.for_remat).
  rematerialised: bool = False

  @property
  def kernels(self) -> backends.Backend:
    """The backend's record."""
    return backends.get(self.backend)


def platform_of(devices: Sequence[jax.Device]) -> str:
  """'cpu' | 'gpu' | 'tpu' for a list of devices (a mesh's, or a deviceless target's)."""
  platform = devices[0].platform.lower()
  if platform not in _PLATFORM_NAMES:
    raise ConfigError(f'model.attention_platform: unknown device platform {platform!r}')
  return _PLATFORM_NAMES[platform]


def resolve_platform(config: ModelConfig, devices: Sequence[jax.Device]) -> ModelConfig:
  """`config` with attention_platform set to the devices' platform (unless set by hand)."""
  if config.attention_platform != 'auto':
    return config
  return config.replace(attention_platform=platform_of(devices))


def _platform(config: ModelConfig) -> str:
  if config.attention_platform != 'auto':
    return config.attention_platform
  return _PLATFORM_NAMES.get(jax.default_backend(), 'cpu')


def block_sizes(backend: str, seq_len: int, interpret: bool) -> Optional[tuple[int, int, int]]:
  """(block_q, block_k, block_bwd) of a backend's kernels for a sequence length, or None if it
  cannot be tiled (the backend's tile rule: kernels/backends/<name>/__init__.py)."""
  return backends.get(backend).tiles(seq_len, interpret)


def check(config: ModelConfig) -> None:
  """Refuses in one line an attention_impl that names no registered backend, and a named
  backend asked for what it cannot do (residual scores, attention dropout, qk kernels). The
  train setup calls it before any data is built; `plan` again when the model is traced."""
  impl = config.attention_impl
  if impl in MODES:
    return
  backend = backends.for_impl(impl)
  if backend is None:
    raise ConfigError(
      f'model.attention_impl={impl!r}: must be one of {", ".join(backends.attention_impls())}'
    )
  _check_support(config, backend, config.residual_carry)


def _check_support(config: ModelConfig, backend: backends.Backend, residual_carry: str) -> None:
  impl = config.attention_impl
  if config.use_residual_attention and not backend.residual:
    raise ConfigError(
      f'model.attention_impl={impl!r}: the {backend.name} backend cannot carry residual '
      "scores; use 'pallas' (or 'auto') for residual attention"
    )
  if config.attention_dropout_rate > 0 and not backend.dropout:
    raise ConfigError(
      f'model.attention_impl={impl!r}: the {backend.name} backend has no attention dropout '
      f'(model.attention_dropout_rate={config.attention_dropout_rate}); set it to 0 or use '
      "'pallas'"
    )
  if config.use_residual_attention and residual_carry == 'qk' and not backend.qk:
    raise ConfigError(
      f"model.residual_carry='qk': the {backend.name} backend (model.attention_impl="
      f"{impl!r}) has no qk kernels; use residual_carry='scores' or attention_impl='pallas'"
    )


def check_qk(config: ModelConfig, attention_plan: Optional[AttentionPlan]) -> None:
  """Refuses a plan whose backend has no qk kernels for a stack that carries queries and keys
  (residual_carry 'qk', or 'auto' decided so for this length)."""
  if attention_plan is not None:
    _check_support(config, attention_plan.kernels, 'qk')


def _platform_backend(impl: str, platform: str) -> Optional[backends.Backend]:
  """The backend 'auto' / 'pallas' take on a platform: its default one; 'pallas' on a CPU
  takes the first that runs in interpret mode."""
  for backend in backends.registered():
    if backend.platform == platform and backend.platform_default:
      return backend
  if impl == 'pallas' and platform == 'cpu':
    for backend in backends.registered():
      if backend.interpret:
        return backend
  return None


def plan(
  config: ModelConfig, seq_len: int, *, maps_requested: bool = False
) -> Optional[AttentionPlan]:
  """The fused path for this config and sequence length, or None for the einsum path."""
  check(config)
  impl = config.attention_impl
  if impl == 'xla' or maps_requested:
    return None
  platform = _platform(config)
  backend = backends.for_impl(impl) or _platform_backend(impl, platform)
  if backend is None:
    if impl == 'auto':
      return None
    raise ConfigError(f"model.attention_impl='pallas': no kernel backend runs on {platform}")
  if impl in MODES:
    try:
      _check_support(config, backend, config.residual_carry)
    except ConfigError:
      if impl == 'auto':  # the platform's kernels cannot do this: the einsum path can
        return None
      raise
  interpret = platform != backend.platform
  if interpret and not (platform == 'cpu' and backend.interpret):
    raise ConfigError(
      f'model.attention_impl={impl!r}: needs a {backend.platform.upper()} (the '
      f"{backend.name} kernels do not run on {platform}); use 'pallas' (or 'auto')"
    )
  if not backend.fused:
    return AttentionPlan('call', backend.name)
  blocks = backend.tiles(seq_len, interpret)
  if blocks is None:
    if impl == 'auto':
      return None
    raise ConfigError(
      f'model.attention_impl={impl!r}: sequence length {seq_len} cannot be tiled by the '
      f'{backend.name} kernels (needs {backend.tile_rule})'
    )
  rematerialised = config.remat_policy != 'none'
  return AttentionPlan('pallas', backend.name, interpret, *blocks, rematerialised=rematerialised)


def pair_carry(config: ModelConfig, attention_plan: Optional[AttentionPlan]) -> bool:
  """Whether a layer stack carries residual scores as a `carried.CarriedScores` pair and seals
  it (the kernels then rebuild each layer's sum going down instead of saving it). Not under a
  per-layer remat: that saves every layer's carried input anyway, and the pair would double
  it; `residual_scores_backward='recomputed'` is the memory-flat route there."""
  return (
    attention_plan is not None
    and attention_plan.path == 'pallas'
    and config.use_residual_attention
    and config.remat_policy == 'none'
  )

"""Which attention path a model takes: `ModelConfig.attention_impl` on a platform.

| attention_impl | cpu                     | gpu                        | tpu                      |
|----------------|-------------------------|----------------------------|--------------------------|
| auto           | xla (einsum path)       | pallas_triton              | pallas_mosaic            |
| xla            | einsum path             | einsum path                | einsum path              |
| pallas         | pallas_triton, interpret| pallas_triton              | pallas_mosaic            |
| pallas_triton  | interpret mode          | Triton kernels             | error                    |
| pallas_mosaic  | interpret mode          | error                      | Mosaic kernels           |
| cudnn          | error                   | jax's cuDNN flash attention| error                    |

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

_PLATFORM_NAMES = {'cpu': 'cpu', 'gpu': 'gpu', 'cuda': 'gpu', 'rocm': 'gpu', 'tpu': 'tpu'}


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
  """A fused path: 'cudnn', or the Pallas kernels of `backend` with these tile sizes."""

  path: str  # 'cudnn' | 'pallas'
  backend: Optional[str] = None  # 'triton' | 'mosaic'
  interpret: bool = False
  block_q: int = 0
  block_k: int = 0
  block_bwd: int = 0


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


def _largest_block(seq_len: int, cap: int, floor: int) -> Optional[int]:
  block = cap
  while block >= floor:
    if seq_len % block == 0:
      return block
    block //= 2
  return None


def block_sizes(backend: str, seq_len: int, interpret: bool) -> Optional[tuple[int, int, int]]:
  """(block_q, block_k, block_bwd) for a sequence length, or None if it cannot be tiled.

  Triton: powers of two >= 16 (tensor-core tiles), 128 x 64 forward, 64 x 64 backward.
  Mosaic: rows a multiple of 8, columns a multiple of 128 or the whole sequence; 256 x 512
  forward, 256 x 256 backward. In interpret mode (CPU tests) tiles of 16 for Triton, so that
  even tiny sequences take several blocks."""
  if backend == 'triton':
    caps = (16, 16, 16) if interpret else (128, 64, 64)
    blocks = tuple(_largest_block(seq_len, cap, 16) for cap in caps)
    return None if None in blocks else blocks
  if seq_len % 8:
    return None
  if seq_len <= 256:
    return (seq_len, seq_len, seq_len)
  if seq_len % 128:
    return None
  return (
    _largest_block(seq_len, 256, 128),
    _largest_block(seq_len, 512, 128),
    _largest_block(seq_len, 256, 128),
  )


def plan(
  config: ModelConfig, seq_len: int, *, maps_requested: bool = False
) -> Optional[AttentionPlan]:
  """The fused path for this config and sequence length, or None for the einsum path."""
  impl = config.attention_impl
  if impl == 'xla' or maps_requested:
    return None
  platform = _platform(config)
  if impl == 'auto':
    if platform == 'cpu':
      return None
    impl = 'pallas'
  if impl == 'cudnn':
    if platform != 'gpu':
      raise ConfigError(f"model.attention_impl='cudnn': needs a GPU (platform {platform})")
    return AttentionPlan('cudnn')
  backend = {
    'pallas': 'mosaic' if platform == 'tpu' else 'triton',
    'pallas_triton': 'triton',
    'pallas_mosaic': 'mosaic',
  }[impl]
  if (backend, platform) in (('triton', 'tpu'), ('mosaic', 'gpu')):
    raise ConfigError(
      f'model.attention_impl={impl!r}: the {backend} kernels do not run on '
      f"{platform}; use 'pallas' (or 'auto')"
    )
  interpret = platform == 'cpu'
  blocks = block_sizes(backend, seq_len, interpret)
  if blocks is None:
    if config.attention_impl == 'auto':
      return None
    rule = (
      'a multiple of 16'
      if backend == 'triton'
      else 'a multiple of 8 up to 256, else a multiple of 128'
    )
    raise ConfigError(
      f'model.attention_impl={config.attention_impl!r}: sequence length '
      f'{seq_len} cannot be tiled by the {backend} kernels (needs {rule})'
    )
  return AttentionPlan('pallas', backend, interpret, *blocks)


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

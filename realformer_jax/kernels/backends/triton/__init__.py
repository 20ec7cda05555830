"""GPU kernels written in Pallas Triton: attention.py (post / pre / residual attention) and
qk_attention.py (residual_carry='qk'). This file is the backend's record; the kernels are
imported when a model first runs through them. (The record's tile rule is `plan_tiles`, not
`tiles`: tiles.py beside it, the per-device tile table, is a submodule of that name.)"""

from typing import Optional

from realformer_jax.kernels.backends.registry import largest_block, pallas_backend


def plan_tiles(seq_len: int, interpret: bool) -> Optional[tuple[int, int, int]]:
  """Powers of two >= 16 (tensor-core tiles): 128 x 64 forward, 64 x 64 backward; in
  interpret mode (CPU tests) 16, so that even tiny sequences take several blocks."""
  caps = (16, 16, 16) if interpret else (128, 64, 64)
  blocks = tuple(largest_block(seq_len, cap, 16) for cap in caps)
  return None if None in blocks else blocks


def padded_head_dim(head_dim: int) -> int:
  """Triton tiles are powers of two: the head size is zero padded up to one."""
  return 1 << max(head_dim - 1, 0).bit_length()


BACKEND = pallas_backend(
  __name__,
  'triton',
  platform='gpu',
  platform_default=True,
  interpret=True,
  tiles=plan_tiles,
  tile_rule='a multiple of 16',
  head_dim=padded_head_dim,
  odd_length=208,  # tiles of 16, not 128 x 64
  hlo_calls=('__gpu$xla.gpu.triton',),
  dropout_generators=('threefry', 'philox'),
)

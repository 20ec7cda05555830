"""TPU kernels written in Pallas Mosaic: attention.py (post / pre / residual attention) and
qk_attention.py (residual_carry='qk'). This file is the backend's record; the kernels are
imported when a model first runs through them."""

from typing import Optional

from realformer_jax.kernels.backends.registry import largest_block, pallas_backend


def plan_tiles(seq_len: int, interpret: bool) -> Optional[tuple[int, int, int]]:
  """Rows a multiple of 8, columns a multiple of 128 or the whole sequence: 256 x 512
  forward, 256 x 256 backward (the same in interpret mode)."""
  del interpret
  if seq_len % 8:
    return None
  if seq_len <= 256:
    return (seq_len, seq_len, seq_len)
  if seq_len % 128:
    return None
  return (
    largest_block(seq_len, 256, 128),
    largest_block(seq_len, 512, 128),
    largest_block(seq_len, 256, 128),
  )


BACKEND = pallas_backend(
  __name__,
  'mosaic',
  platform='tpu',
  platform_default=True,
  interpret=True,
  tiles=plan_tiles,
  tile_rule='a multiple of 8 up to 256, else a multiple of 128',
  odd_length=384,  # tiles of 128, not 256 x 512
  hlo_calls=('tpu_custom_call',),
  dropout_generators=('threefry', 'philox'),
)

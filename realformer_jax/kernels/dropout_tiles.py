"""Attention-dropout keep masks for one [rows, cols] tile, inside a kernel.

The einsum path draws its mask with `dropout_bits.keep_mask(key, keep, [B, H, L, L])`: element
(b, h, q, k) takes 16 bits of Threefry-2x32(key; row = (b H + h) L + q, word = k // 4), lane
k % 4 of the hash's four 16-bit halves. Both functions here compute exactly that stream for a
tile whose top-left element has global row `row0` and column `col0` (a multiple of 4), so the
fused kernels drop the same elements as the einsum path, bit for bit, and the backward pass
regenerates the forward's mask from the key alone.

Two layouts of the same computation, because the kernel compilers accept different ops:
  joined    one hash per 4 elements (the [rows, cols/4] words are hashed once and their halves
            interleaved with two joins and a reshape). Triton lowers it; Mosaic (TPU) pads the
            [.., 2, 2] intermediate to (8, 128) tiles and runs out of VMEM.
  selected  one hash per element (each element hashes its word and picks its half): 4x the
            integer work, but plain element-wise ops that Mosaic lowers.

`pack_bits` / `unpack_bits` store a mask at one bit per element (1/32 of a float32 score): the
GPU forward kernel writes the mask it drew, so the backward reads it instead of hashing again.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from realformer_jax.kernels.dropout_bits import MASK_BITS, threefry2x32

_LOW = np.uint32(2**MASK_BITS - 1)
_HALF = np.uint32(MASK_BITS)


def keep_tile_joined(
  k1: jax.Array,
  k2: jax.Array,
  row0: jax.Array,
  col0: jax.Array,
  shape: tuple[int, int],
  threshold: int,
) -> jax.Array:
  """Boolean keep mask [rows, cols]; one Threefry-2x32 per four elements."""
  rows, cols = shape
  words = cols // 4
  row = row0.astype(jnp.uint32) + lax.broadcasted_iota(jnp.uint32, (rows, words), 0)
  word = (col0.astype(jnp.uint32) >> np.uint32(2)) + lax.broadcasted_iota(
    jnp.uint32, (rows, words), 1
  )
  y1, y2 = threefry2x32(k1, k2, row, word)
  # Lanes 0..3 of a word are y1 low, y1 high, y2 low, y2 high: [[a, c], [b, d]] flattened
  # row-major over its last two axes gives a, b, c, d.
  first = jnp.stack([y1 & _LOW, y2 & _LOW], axis=-1)
  second = jnp.stack([y1 >> _HALF, y2 >> _HALF], axis=-1)
  draws = jnp.stack([first, second], axis=-1).reshape(rows, cols)
  return draws < np.uint32(threshold)


def keep_tile_selected(
  k1: jax.Array,
  k2: jax.Array,
  row0: jax.Array,
  col0: jax.Array,
  shape: tuple[int, int],
  threshold: int,
) -> jax.Array:
  """Boolean keep mask [rows, cols]; one Threefry-2x32 per element, same bits as joined."""
  rows, cols = shape
  row = row0.astype(jnp.uint32) + lax.broadcasted_iota(jnp.uint32, (rows, cols), 0)
  col = col0.astype(jnp.uint32) + lax.broadcasted_iota(jnp.uint32, (rows, cols), 1)
  y1, y2 = threefry2x32(k1, k2, row, col >> np.uint32(2))
  lane = col & np.uint32(3)
  y = jnp.where(lane < 2, y1, y2)
  draws = jnp.where((lane & np.uint32(1)) == 0, y & _LOW, y >> _HALF)
  return draws < np.uint32(threshold)


def pack_bits(keep: jax.Array, width: int) -> jax.Array:
  """[rows, cols] booleans -> [rows, cols / width] uint32, bit c % width of word c // width."""
  rows, cols = keep.shape
  lanes = lax.broadcasted_iota(jnp.uint32, (rows, cols // width, width), 2)
  bits = keep.astype(jnp.uint32).reshape(rows, cols // width, width) << lanes
  return jnp.sum(bits, axis=-1, dtype=jnp.uint32)  # disjoint bits: the sum is their or


def unpack_bits(words: jax.Array, width: int) -> jax.Array:
  """pack_bits's inverse: [rows, n] uint32 -> [rows, n * width] booleans."""
  rows, n = words.shape
  lanes = lax.broadcasted_iota(jnp.uint32, (rows, n, width), 2)
  bits = (words[:, :, None] >> lanes) & np.uint32(1)
  return bits.reshape(rows, n * width) == np.uint32(1)

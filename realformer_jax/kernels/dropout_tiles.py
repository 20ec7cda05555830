"""Attention-dropout keep masks for one [rows, cols] tile, inside a kernel.

The einsum path draws its mask with `dropout_bits.keep_mask(key, keep, [B, H, L, L])`: element
(b, h, q, k) takes 8 bits of Threefry-2x32(key; row = (b H + h) L + q, word = k // 8), byte
k % 8 of the hash's eight (bytes 0..3 of its first output word, then of its second). Both
functions here compute exactly that stream for a tile whose top-left element has global row
`row0` and column `col0` (a multiple of 8), so the fused kernels drop the same elements as the
einsum path, bit for bit, and the backward pass regenerates the forward's mask from the key
alone.

Two layouts of the same computation, because the kernel compilers accept different ops:
  joined    one hash per 8 elements (the [rows, cols/8] words are hashed once and their bytes
            interleaved with three joins and a reshape). Triton lowers it; Mosaic (TPU) pads the
            [.., 2, 2, 2] intermediate to (8, 128) tiles and runs out of VMEM.
  selected  one hash per element (each element hashes its word and picks its byte): 8x the
            integer work, but plain element-wise ops that Mosaic lowers.

`pack_bits` / `unpack_bits` store a mask at one bit per element (1/32 of a float32 score): the
GPU forward kernel writes the mask it drew, so the backward reads it instead of hashing again.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from realformer_jax.kernels.dropout_bits import DRAWS_PER_HASH, draw, threefry2x32

_LANE_SHIFT = int(DRAWS_PER_HASH).bit_length() - 1  # column -> word: a shift by 3


def keep_tile_joined(
  k1: jax.Array,
  k2: jax.Array,
  row0: jax.Array,
  col0: jax.Array,
  shape: tuple[int, int],
  threshold: int,
) -> jax.Array:
  """Boolean keep mask [rows, cols]; one Threefry-2x32 per eight elements."""
  rows, cols = shape
  words = cols // DRAWS_PER_HASH
  row = row0.astype(jnp.uint32) + lax.broadcasted_iota(jnp.uint32, (rows, words), 0)
  word = (col0.astype(jnp.uint32) >> np.uint32(_LANE_SHIFT)) + lax.broadcasted_iota(
    jnp.uint32, (rows, words), 1
  )
  y = threefry2x32(k1, k2, row, word)
  t = np.uint32(threshold)
  # Lane 4 w + 2 b1 + b0 is byte 2 b1 + b0 of output word w. Each stack adds a trailing axis
  # (a Triton join); flattened row-major, the axes must read (w, b1, b0), so the first stack
  # runs over w and the last over b0.
  keep = [
    jnp.stack([draw(y[0], 2 * b1 + b0) < t, draw(y[1], 2 * b1 + b0) < t], axis=-1)
    for b0 in range(2)
    for b1 in range(2)
  ]  # [rows, words, 2 (w)], indexed by 2 b0 + b1
  keep = [jnp.stack([keep[2 * b0], keep[2 * b0 + 1]], axis=-1) for b0 in range(2)]
  return jnp.stack(keep, axis=-1).reshape(rows, cols)


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
  y1, y2 = threefry2x32(k1, k2, row, col >> np.uint32(_LANE_SHIFT))
  lane = col & np.uint32(DRAWS_PER_HASH - 1)
  y = jnp.where(lane < 4, y1, y2)
  byte = lane & np.uint32(3)
  drawn = jnp.where(
    byte < 2,
    jnp.where(byte == 0, draw(y, 0), draw(y, 1)),
    jnp.where(byte == 2, draw(y, 2), draw(y, 3)),
  )
  return drawn < np.uint32(threshold)


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

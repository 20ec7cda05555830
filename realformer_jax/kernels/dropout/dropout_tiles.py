"""Attention-dropout keep masks for one [rows, cols] tile, inside a kernel.

The einsum path draws its mask with `dropout_bits.keep_mask(key, keep, [B, H, L, L],
generator)`: element (b, h, q, k) takes 8 bits of the generator's hash (key; row = (b H + h)
L + q, word = k // D), draw k % D of the hash's D = DRAWS_PER_GENERATOR (8 for threefry, 16 for
philox: bytes 0..3 of its first output word, then of the next). Both functions here compute
exactly that stream for a tile whose top-left element has global row `row0` and column `col0`
(a multiple of D), so the fused kernels drop the same elements as the einsum path, bit for bit,
and the backward pass regenerates the forward's mask from the key alone. A kernel's `row0` and
a per-element draw's byte come from dropout_bits.attention_row and select_draw, which every
path (these tiles, the Mosaic GPU kernels, the ring) shares. `mulhi` is how the
kernel's compiler forms a multiply's high word (philox only; dropout_bits.MulHi): every form
gives the same bits.

Two layouts of the same computation, because the kernel compilers accept different ops:
  joined    one hash per D elements (the [rows, cols/D] words are hashed once and their bytes
            interleaved with log2(D) joins and a reshape). Triton lowers it; Mosaic (TPU) pads
            the [.., 2, 2, 2] intermediate to (8, 128) tiles and runs out of VMEM.
  selected  one hash per element (each element hashes its word and picks its byte): D x the
            integer work, but plain element-wise ops that Mosaic lowers.

`pack_bits` / `unpack_bits` store a mask at one bit per element (1/32 of a float32 score): the
GPU forward kernel writes the mask it drew, so the backward reads it instead of hashing again.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from realformer_jax.kernels.dropout.dropout_bits import (
  DRAWS_PER_GENERATOR,
  MulHi,
  draw,
  hash_words,
  mulhi_limbs,
  select_draw,
)


def _lane_shift(generator: str) -> int:
  """log2 of the draws per hash: column -> word is a shift by 3 (threefry) or 4 (philox)."""
  return DRAWS_PER_GENERATOR[generator].bit_length() - 1


def keep_tile_joined(
  k1: jax.Array,
  k2: jax.Array,
  row0: jax.Array,
  col0: jax.Array,
  shape: tuple[int, int],
  threshold: int,
  generator: str = 'threefry',
  mulhi: MulHi = mulhi_limbs,
) -> jax.Array:
  """Boolean keep mask [rows, cols]; one hash per DRAWS_PER_GENERATOR[generator] elements."""
  rows, cols = shape
  per_hash = DRAWS_PER_GENERATOR[generator]
  words = cols // per_hash
  row = row0.astype(jnp.uint32) + lax.broadcasted_iota(jnp.uint32, (rows, words), 0)
  word = (col0.astype(jnp.uint32) >> np.uint32(_lane_shift(generator))) + lax.broadcasted_iota(
    jnp.uint32, (rows, words), 1
  )
  y = hash_words(generator, k1, k2, row, word, mulhi)
  t = np.uint32(threshold)
  lanes = [draw(w, byte) < t for w in y for byte in range(4)]  # lane 4 w + byte
  # Each stack adds a trailing axis (a Triton join); flattened row-major, the new axes must
  # read the lane's bits from the highest to the lowest, so the first stack pairs the lanes
  # that differ in the highest bit and the last those that differ in bit 0.
  bit = per_hash // 2
  while bit:
    lanes = [jnp.stack([lanes[i], lanes[i + bit]], axis=-1) for i in range(bit)]
    bit //= 2
  return lanes[0].reshape(rows, cols)


def keep_tile_selected(
  k1: jax.Array,
  k2: jax.Array,
  row0: jax.Array,
  col0: jax.Array,
  shape: tuple[int, int],
  threshold: int,
  generator: str = 'threefry',
  mulhi: MulHi = mulhi_limbs,
) -> jax.Array:
  """Boolean keep mask [rows, cols]; one hash per element, same bits as joined."""
  rows, cols = shape
  row = row0.astype(jnp.uint32) + lax.broadcasted_iota(jnp.uint32, (rows, cols), 0)
  col = col0.astype(jnp.uint32) + lax.broadcasted_iota(jnp.uint32, (rows, cols), 1)
  y = hash_words(generator, k1, k2, row, col >> np.uint32(_lane_shift(generator)), mulhi)
  lane = col & np.uint32(DRAWS_PER_GENERATOR[generator] - 1)
  return select_draw(y, lane) < np.uint32(threshold)


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

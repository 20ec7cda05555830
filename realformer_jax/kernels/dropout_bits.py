"""Dropout keep-masks from a fused, counter-based Threefry-2x32 hash: eight decisions per hash.

`jax.random.bernoulli` spends one Threefry-2x32 hash per element, keeps 32 of its 64 output bits
(partitionable mode XORs the two words), and on CPU JAX lowers the hash as a rolled 5-step loop
whose every step reads and writes the whole array. At BERT-Base (38M dropout decisions per
train step) that cost ~0.4 s of a ~2.5 s step on 2 CPU cores.

Here the same hash (20 rounds, Salmon et al. 2011; bit-identical to JAX's primitive) is written
as plain element-wise ops, so XLA fuses it with the comparison into one loop, and each hash's 64
output bits give eight 8-bit draws, as FlashAttention's Philox draws 8-bit thresholds: ~15
integer ops per decision for the hash instead of ~30 with 16-bit draws, which matters in the
attention kernels (one decision per score element and layer). The hash input is the element's
global position (row of the leading axes, word along the last axis), so a mask does not depend
on how the array is sharded, as with partitionable `jax.random`. The keep probability is
quantised to 2**-8: an element is kept with probability t / 256, t = round(256 keep_prob)
(`realised_keep_prob`; 0.9 -> 0.8984), and dropout divides by that realised probability, so
the expectation is exact. Every dropout of the model (hidden and attention) uses this stream.
"""

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

MASK_BITS = 8  # bits per dropout decision
DRAWS_PER_HASH = 64 // MASK_BITS
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(v: jax.Array, r: int) -> jax.Array:
  return (v << np.uint32(r)) | (v >> np.uint32(32 - r))


def threefry2x32(
  k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Threefry-2x32 with 20 rounds on uint32 key words (k1, k2) and counters (x1, x2)."""
  ks = (k1, k2, k1 ^ k2 ^ _PARITY)
  x1, x2 = x1 + ks[0], x2 + ks[1]
  for i in range(5):  # 5 x 4 rounds, a key injection after each group of 4
    for r in _ROTATIONS[i % 2]:
      x1 = x1 + x2
      x2 = _rotate_left(x2, r) ^ x1
    x1 = x1 + ks[(i + 1) % 3]
    x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x1, x2


def keep_threshold(keep_prob: float) -> int:
  """Integer t: an element is kept when its 8-bit draw is < t, so P(keep) = t / 2**8."""
  return min(max(round(keep_prob * 2**MASK_BITS), 1), 2**MASK_BITS - 1)


def realised_keep_prob(keep_prob: float) -> float:
  """The probability `keep_mask` keeps an element with (|error| <= 2**-9)."""
  return keep_threshold(keep_prob) / 2**MASK_BITS


def keep_mask(rng: jax.Array, keep_prob: float, shape: Sequence[int]) -> jax.Array:
  """Boolean mask of `shape`, each element True with probability realised_keep_prob(keep_prob).

  Element (i..., j) takes byte j % 8 of hash(key, row(i...), j // 8) (bytes 0..3 of the first
  output word, low to high, then of the second), where row is the flat index of the leading
  axes: a function of the global position only.
  """
  shape = tuple(shape)
  if not shape:
    return keep_mask(rng, keep_prob, (1,))[0]
  lead, last = shape[:-1], shape[-1]
  words = -(-last // DRAWS_PER_HASH)
  if math.prod(lead) >= 2**32 or words >= 2**32:
    raise ValueError(f'keep_mask: shape {shape} needs counters beyond 32 bits')
  grid = lead + (words,)
  row, stride = jnp.zeros(grid, jnp.uint32), 1
  for axis in reversed(range(len(lead))):
    row = row + lax.broadcasted_iota(jnp.uint32, grid, axis) * np.uint32(stride)
    stride *= lead[axis]
  column = lax.broadcasted_iota(jnp.uint32, grid, len(lead))
  k1, k2 = jax.random.bits(rng, (2,), jnp.uint32)  # any key implementation -> two words
  y1, y2 = threefry2x32(k1, k2, row, column)
  t = np.uint32(keep_threshold(keep_prob))
  draws = jnp.stack([draw(y, lane) < t for y in (y1, y2) for lane in range(4)], axis=-1)
  return draws.reshape(lead + (words * DRAWS_PER_HASH,))[..., :last]


def draw(word: jax.Array, lane: int) -> jax.Array:
  """Byte `lane` (0: lowest) of a uint32 hash word: one 8-bit draw."""
  shifted = word >> np.uint32(MASK_BITS * lane) if lane else word
  return shifted if lane == 3 else shifted & np.uint32(2**MASK_BITS - 1)

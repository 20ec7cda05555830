"""Dropout keep-masks from a fused, counter-based hash: eight or sixteen 8-bit decisions per hash.

`jax.random.bernoulli` spends one Threefry-2x32 hash per element, keeps 32 of its 64 output bits
(partitionable mode XORs the two words), and on CPU JAX lowers the hash as a rolled 5-step loop
whose every step reads and writes the whole array. At BERT-Base (38M dropout decisions per
train step) that cost ~0.4 s of a ~2.5 s step on 2 CPU cores.

Here the hash is written as plain element-wise ops, so XLA fuses it with the comparison into one
loop, and each hash's output bits give several 8-bit draws, as FlashAttention's Philox draws
8-bit thresholds. Two hashes (`model.dropout_generator`, GENERATORS), both counter-based:

  threefry  Threefry-2x32, 20 rounds (Salmon et al. 2011; bit-identical to JAX's primitive):
            64 output bits, eight draws. The default.
  philox    Philox-4x32-10 (the same paper; Random123's known answers, tests/model/
            test_dropout_bits.py): 128 output bits, sixteen draws, from 4 multiplies and 2
            three-way XORs a round. Where a multiply's high word is one instruction (a GPU's
            `mul.hi.u32`), about half Threefry's integer work per decision (the Triton
            kernels' PTX: docs/performance.md); XLA programs (the einsum path, interpret mode,
            sharded or not) and the TPU kernels build the high word from 16-bit limbs
            (`mulhi_limbs`: XLA's `mulhi` does not lower under a sharded jit), dearer there.

The two give different masks: a run keeps the generator it started with (a resume compares
the field, train/loop.py). Every implementation of one generator gives the same bits: the
einsum path (`keep_mask`), the kernels' tiles (dropout_tiles.py) compiled or interpreted.
The hash input is the element's global position (row of the leading axes, word along the last
axis), so a mask does not depend on how the array is sharded, as with partitionable
`jax.random`. The keep probability is quantised to 2**-8: an element is kept with probability
t / 256, t = round(256 keep_prob) (`realised_keep_prob`; 0.9 -> 0.8984), and dropout divides
by that realised probability, so the expectation is exact. Every dropout of the model (hidden
and attention) uses this stream.
"""

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from realformer_jax.config import DROPOUT_GENERATORS

MASK_BITS = 8  # bits per dropout decision
GENERATORS = DROPOUT_GENERATORS  # model.dropout_generator's values
# 8-bit draws per hash, by generator: 4 per uint32 output word (threefry: 2 words, philox: 4)
DRAWS_PER_GENERATOR = {'threefry': 64 // MASK_BITS, 'philox': 128 // MASK_BITS}
DRAWS_PER_HASH = DRAWS_PER_GENERATOR['threefry']  # the default generator's (threefry-only code)
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)
# Philox-4x32's round multipliers and key increments (Salmon et al. 2011, Random123).
PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_PHILOX_KEY_STEPS = (np.uint32(0x9E3779B9), np.uint32(0xBB67AE85))
PHILOX_ROUNDS = 10

# mulhi(x, m): the high 32 bits of the 64-bit product of uint32 `x` and the constant `m`.
MulHi = Callable[[jax.Array, int], jax.Array]


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


def mulhi_xla(x: jax.Array, m: int) -> jax.Array:
  """The high word of x * m by `lax.mulhi` (XLA's `mulhi`). Not the default: under a sharded
  jit (a mesh, shard_map) jax 0.10.2 fails to lower it ('Unable to convert MHLO to StableHLO'),
  so every XLA program forms the high word from limbs (`mulhi_limbs`, the same bits)."""
  return lax.mulhi(x, np.uint32(m))


def mulhi_limbs(x: jax.Array, m: int) -> jax.Array:
  """The high word of x * m from 16-bit limbs: four 16 x 16 -> 32-bit products, exact in
  uint32 arithmetic, for compilers without a 32 x 32 -> 64-bit multiply (Pallas Mosaic)."""
  mask = np.uint32(0xFFFF)
  x0, x1 = x & mask, x >> np.uint32(16)
  m0, m1 = np.uint32(m & 0xFFFF), np.uint32(m >> 16)
  low, cross0, cross1 = x0 * m0, x0 * m1, x1 * m0
  carry = ((low >> np.uint32(16)) + (cross0 & mask) + (cross1 & mask)) >> np.uint32(16)
  return x1 * m1 + (cross0 >> np.uint32(16)) + (cross1 >> np.uint32(16)) + carry


def philox4x32(
  k1: jax.Array,
  k2: jax.Array,
  counters: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
  mulhi: MulHi = mulhi_limbs,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Philox-4x32 with PHILOX_ROUNDS (10) rounds on uint32 key words (k1, k2) and four counter
  words; `mulhi` computes a multiply's high word (every form gives the same bits)."""
  x0, x1, x2, x3 = counters
  m0, m1 = PHILOX_MULTIPLIERS
  for i in range(PHILOX_ROUNDS):
    if i:  # the key is bumped before every round but the first
      k1, k2 = k1 + _PHILOX_KEY_STEPS[0], k2 + _PHILOX_KEY_STEPS[1]
    hi0, lo0 = mulhi(x0, m0), x0 * np.uint32(m0)
    hi1, lo1 = mulhi(x2, m1), x2 * np.uint32(m1)
    x0, x1, x2, x3 = hi1 ^ x1 ^ k1, lo1, hi0 ^ x3 ^ k2, lo0
  return x0, x1, x2, x3


def hash_words(
  generator: str,
  k1: jax.Array,
  k2: jax.Array,
  row: jax.Array,
  word: jax.Array,
  mulhi: MulHi = mulhi_limbs,
) -> tuple[jax.Array, ...]:
  """The uint32 output words of `generator`'s hash of (row, word): 2 for threefry (counters
  (row, word)), 4 for philox (counters (word, row, 0, 0)). Draw j of the hash (j <
  DRAWS_PER_GENERATOR[generator]) is byte j % 4 of word j // 4."""
  if generator == 'threefry':
    return threefry2x32(k1, k2, row, word)
  if generator == 'philox':
    zero = jnp.zeros_like(row)
    return philox4x32(k1, k2, (word, row, zero, zero), mulhi)
  raise ValueError(f'dropout generator {generator!r}: must be one of {", ".join(GENERATORS)}')


def keep_threshold(keep_prob: float) -> int:
  """Integer t: an element is kept when its 8-bit draw is < t, so P(keep) = t / 2**8."""
  return min(max(round(keep_prob * 2**MASK_BITS), 1), 2**MASK_BITS - 1)


def realised_keep_prob(keep_prob: float) -> float:
  """The probability `keep_mask` keeps an element with (|error| <= 2**-9)."""
  return keep_threshold(keep_prob) / 2**MASK_BITS


def keep_mask(
  rng: jax.Array, keep_prob: float, shape: Sequence[int], generator: str = 'threefry'
) -> jax.Array:
  """Boolean mask of `shape`, each element True with probability realised_keep_prob(keep_prob).

  Element (i..., j) takes draw j % D of hash(key, row(i...), j // D), D = DRAWS_PER_GENERATOR
  (`hash_words`: bytes 0..3 of the first output word, low to high, then of the next), where
  row is the flat index of the leading axes: a function of the global position only.
  """
  shape = tuple(shape)
  if not shape:
    return keep_mask(rng, keep_prob, (1,), generator)[0]
  per_hash = DRAWS_PER_GENERATOR[generator]
  lead, last = shape[:-1], shape[-1]
  words = -(-last // per_hash)
  if math.prod(lead) >= 2**32 or words >= 2**32:
    raise ValueError(f'keep_mask: shape {shape} needs counters beyond 32 bits')
  grid = lead + (words,)
  row, stride = jnp.zeros(grid, jnp.uint32), 1
  for axis in reversed(range(len(lead))):
    row = row + lax.broadcasted_iota(jnp.uint32, grid, axis) * np.uint32(stride)
    stride *= lead[axis]
  column = lax.broadcasted_iota(jnp.uint32, grid, len(lead))
  k1, k2 = jax.random.bits(rng, (2,), jnp.uint32)  # any key implementation -> two words
  y = hash_words(generator, k1, k2, row, column)
  t = np.uint32(keep_threshold(keep_prob))
  draws = jnp.stack([draw(w, lane) < t for w in y for lane in range(4)], axis=-1)
  return draws.reshape(lead + (words * per_hash,))[..., :last]


def draw(word: jax.Array, lane: int) -> jax.Array:
  """Byte `lane` (0: lowest) of a uint32 hash word: one 8-bit draw."""
  shifted = word >> np.uint32(MASK_BITS * lane) if lane else word
  return shifted if lane == 3 else shifted & np.uint32(2**MASK_BITS - 1)


def attention_row(batch, head, query, heads: int, length: int):
  """The hash row of element (batch, head, query, :) of an attention mask [B, H, L, L]: the flat
  index of its leading axes, (batch H + head) L + query, as `keep_mask` counts it (uint32,
  wrapping alike). `batch` and `head` are global (a shard's offset added). Every path that
  draws attention dropout in pieces (each backend's kernels, the ring) takes its rows here."""
  return (batch * heads + head) * length + query


def select_draw(words: Sequence[jax.Array], lane: jax.Array) -> jax.Array:
  """Draw `lane` (a uint32 array, < DRAWS_PER_GENERATOR) of the hash whose output `words`
  (hash_words) are given: byte lane % 4 of word lane // 4, element by element. Where-chains and
  constant shifts only, which every kernel compiler lowers (one hash per element: a tile whose
  columns are not whole hash words)."""
  word = lane >> np.uint32(2)
  picked = (
    jnp.where(word == 0, words[0], words[1])
    if len(words) == 2
    else jnp.where(
      word < 2, jnp.where(word == 0, words[0], words[1]), jnp.where(word == 2, words[2], words[3])
    )
  )
  byte = lane & np.uint32(3)
  return jnp.where(
    byte < 2,
    jnp.where(byte == 0, draw(picked, 0), draw(picked, 1)),
    jnp.where(byte == 2, draw(picked, 2), draw(picked, 3)),
  )

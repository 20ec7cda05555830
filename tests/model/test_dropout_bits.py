"""The fused Threefry hash and the dropout keep-masks built from it."""

import jax
import jax.extend.random
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.kernels.dropout.dropout_bits import (
  keep_mask,
  keep_threshold,
  realised_keep_prob,
  threefry2x32,
)
from realformer_jax.kernels.score_paths import ring_attention

# Known-answer vectors of Threefry-2x32-20 (Random123's kat_vectors, which list the counter
# before the key; JAX's own tests use them): (key1, key2, count1, count2) -> (out1, out2).
KNOWN_ANSWERS = [
  ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
  ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
  ((0x13198A2E, 0x03707344, 0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize('inputs,expected', KNOWN_ANSWERS)
def test_threefry_known_answers(inputs, expected):
  out = threefry2x32(*(jnp.uint32(v) for v in inputs))
  assert tuple(int(o) for o in out) == expected


def test_threefry_equals_jax_primitive_on_many_counters():
  k1, k2 = jnp.uint32(0xDEADBEEF), jnp.uint32(12345)
  x1 = jnp.arange(4096, dtype=jnp.uint32) * jnp.uint32(2654435761)
  x2 = jnp.arange(4096, dtype=jnp.uint32)
  ours = jax.jit(threefry2x32)(k1, k2, x1, x2)
  reference = jax.extend.random.threefry2x32_p.bind(k1, k2, x1, x2)
  for a, b in zip(ours, reference):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('keep_prob', [0.9, 0.5, 0.123])
def test_keep_rate_and_quantisation(keep_prob):
  mask = keep_mask(jax.random.key(1), keep_prob, (1000, 1000))
  realised = realised_keep_prob(keep_prob)
  assert abs(realised - keep_prob) <= 2.0**-9  # 8-bit draws: quantised to 2**-8
  assert realised * 256 == round(realised * 256)
  # 1e6 Bernoulli draws: within 5 standard errors.
  assert abs(float(mask.mean()) - realised) < 5 * np.sqrt(realised * (1 - realised) / 1e6)


def test_the_eight_draws_of_a_hash_are_uncorrelated_and_unbiased():
  """Positions j..j+7 of the last axis share one hash; no pair of them may be correlated, and
  no position along the axis (including the unused tail of a partial word) may be biased."""
  mask = np.asarray(keep_mask(jax.random.key(2), 0.5, (4000, 203)), np.float64)
  usable = mask[:, :200].reshape(4000, 25, 8)
  for a in range(8):
    for b in range(a + 1, 8):
      r = np.corrcoef(usable[..., a].ravel(), usable[..., b].ravel())[0, 1]
      assert abs(r) < 5 / np.sqrt(usable[..., a].size)
  assert np.all(np.abs(mask.mean(0) - 0.5) < 5 * 0.5 / np.sqrt(4000))
  assert np.all(np.abs(mask.mean(1) - 0.5) < 5 * 0.5 / np.sqrt(203))


def test_each_decision_is_one_byte_of_the_jax_threefry_output():
  # Independent of keep_mask's own arithmetic: element j of row r is kept when byte j % 8 of
  # jax's Threefry-2x32 primitive on counters (r, j // 8) (bytes 0..3 of the first word, low
  # to high, then the second word's) is below round(256 keep_prob).
  key = jax.random.key(4)
  mask = np.asarray(keep_mask(key, 0.7, (3, 24)))
  k1, k2 = (np.uint32(w) for w in jax.random.bits(key, (2,), jnp.uint32))
  rows, words = np.meshgrid(np.arange(3, dtype=np.uint32), np.arange(3, dtype=np.uint32))
  y1, y2 = jax.extend.random.threefry2x32_p.bind(
    k1, k2, jnp.asarray(rows.T.ravel()), jnp.asarray(words.T.ravel())
  )
  out = np.stack([np.asarray(y1), np.asarray(y2)], axis=-1).astype('<u4')  # [9, 2]
  draws = out.view(np.uint8).reshape(3, 24)  # little-endian: low byte first
  np.testing.assert_array_equal(mask, draws < round(256 * 0.7))


def test_keys_and_layers_give_different_masks():
  shape = (64, 64)
  a = keep_mask(jax.random.key(0), 0.5, shape)
  b = keep_mask(jax.random.key(1), 0.5, shape)
  c = keep_mask(jax.random.fold_in(jax.random.key(0), 1), 0.5, shape)
  agree = lambda x, y: float(jnp.mean(x == y))
  assert 0.4 < agree(a, b) < 0.6 and 0.4 < agree(a, c) < 0.6


def test_mask_is_a_function_of_the_global_position():
  """Rows are numbered over all leading axes, so any block of the mask (e.g. a data-parallel
  shard of the batch) depends only on its global position: the [2, 3, 10] mask equals the
  [6, 10] one reshaped (same flat rows, same columns), jitted or not."""
  key = jax.random.key(5)
  three = keep_mask(key, 0.7, (2, 3, 10))
  flat = keep_mask(key, 0.7, (6, 10))
  np.testing.assert_array_equal(three.reshape(6, 10), flat)
  np.testing.assert_array_equal(jax.jit(lambda k: keep_mask(k, 0.7, (2, 3, 10)))(key), three)
  assert keep_mask(key, 0.7, ()).shape == ()
  with pytest.raises(ValueError, match='beyond 32 bits'):
    jax.eval_shape(lambda k: keep_mask(k, 0.5, (2**16, 2**16, 2)), key)


@pytest.mark.sequence_parallel  # the ring's dropout blocks
@pytest.mark.parametrize(
  'generator',
  ['threefry', pytest.param('philox', marks=pytest.mark.slow)],  # ~3 s compiles each
)
def test_a_block_drawn_by_its_origin_is_the_masks_block(generator):
  # The ring draws each block from its origin (a shard's batch and head offsets, the first
  # row and column) through dropout_bits.attention_row and, at columns that are not whole hash
  # words, select_draw: bit for bit the block of the [B, H, L, L] mask.
  B, H, L = 2, 3, 32
  key = jax.random.key(9)
  full = jax.jit(keep_mask, static_argnums=(1, 2, 3))(key, 0.6, (B, H, L, L), generator)
  k1, k2 = jax.random.bits(key, (2,), jnp.uint32)
  threshold = keep_threshold(0.6)
  # Jitted (offsets traced): eagerly, every op compiles apart.
  keep_block = ring_attention._keep_block  # pylint: disable=protected-access
  draw_block = jax.jit(keep_block, static_argnums=(1, 2, 5, 6, 7))
  for b0, h0, row0, col0, cols in ((0, 0, 0, 0, 32), (1, 1, 8, 16, 16), (1, 2, 4, 5, 3)):
    iparams = jnp.asarray([k1, k2, b0, h0], jnp.uint32)
    shape = (B - b0, H - h0, 8, cols)
    got = draw_block(iparams, threshold, shape, jnp.uint32(row0), jnp.uint32(col0), H, L, generator)
    np.testing.assert_array_equal(got, full[b0:, h0:, row0 : row0 + 8, col0 : col0 + cols])


def test_sharded_mask_equals_the_unsharded_one():
  """Under jit with the batch axis sharded over all local devices (1 here; 8 in the scale-out
  tests, where whole train steps with dropout match across meshes)."""
  devices = np.array(jax.devices())
  mesh = jax.sharding.Mesh(devices, ('data',))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  key = jax.random.key(9)
  shape = (8 * len(devices), 5, 12)
  sharded = jax.jit(lambda k: keep_mask(k, 0.9, shape), out_shardings=sharding)(key)
  np.testing.assert_array_equal(sharded, keep_mask(key, 0.9, shape))

"""model.dropout_generator='philox': the Philox-4x32-10 hash (kernels/dropout/dropout_bits.py)
against
Random123's known answers and an independent NumPy implementation (64-bit products), and its
8-bit draws against statistical tests of randomness.

Each statistical test has a stated significance: alpha = 1e-6 per test (two-sided |z| < 4.89,
chi-square below its 1 - 1e-6 quantile), so with fixed seeds a failure means a defect, not bad
luck; the seeds and sizes are fixed, the outcome deterministic."""

import subprocess
import sys

import compile_settings
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from repo_paths import REPO
from scipy import stats

from realformer_jax.kernels.dropout.dropout_bits import (
  PHILOX_MULTIPLIERS,
  PHILOX_ROUNDS,
  keep_mask,
  keep_threshold,
  mulhi_limbs,
  mulhi_xla,
  philox4x32,
)

ALPHA = 1e-6
Z = stats.norm.isf(ALPHA / 2)  # 4.89

# Philox-4x32-10 known answers (Random123's kat_vectors: counter, key -> output).
KNOWN_ANSWERS = [
  ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000)),
  ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF)),
  ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)),
]
EXPECTED = [
  (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8),
  (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
  (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
]


def _numpy_philox(key, counters):
  """Philox-4x32-10 as Random123 writes it, in NumPy uint64 arithmetic (no shared code)."""
  k0, k1 = (np.uint64(k) for k in key)
  x = [np.asarray(c, np.uint64) for c in counters]
  mask = np.uint64(0xFFFFFFFF)
  for i in range(10):
    if i:
      k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    p0, p1 = x[0] * np.uint64(0xD2511F53), x[2] * np.uint64(0xCD9E8D57)
    x = [(p1 >> np.uint64(32)) ^ x[1] ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ x[3] ^ k1, p0 & mask]
  return [w.astype(np.uint32) for w in x]


@pytest.mark.parametrize('mulhi', [mulhi_xla, mulhi_limbs], ids=['xla', 'limbs'])
@pytest.mark.parametrize('case', range(len(KNOWN_ANSWERS)))
def test_philox_known_answers(mulhi, case):
  counters, key = KNOWN_ANSWERS[case]
  out = philox4x32(*(jnp.uint32(k) for k in key), tuple(jnp.uint32(c) for c in counters), mulhi)
  assert tuple(int(w) for w in out) == EXPECTED[case]
  assert PHILOX_ROUNDS == 10
  assert _numpy_philox(key, counters) == [np.uint32(w) for w in EXPECTED[case]]


def test_multiply_high_words_are_exact():
  # Every form (XLA's mulhi, 16-bit limbs) equals the high word of the 64-bit product, also
  # at the carries' extremes.
  x = np.concatenate(
    [
      np.asarray(jax.random.bits(jax.random.key(0), (65536,), jnp.uint32)),
      np.array([0, 1, 0xFFFF, 0x10000, 0xFFFFFFFF, 0xFFFF0000, 0x0000FFFF], np.uint32),
    ]
  )
  for m in PHILOX_MULTIPLIERS + (0xFFFFFFFF, 1):
    want = ((x.astype(np.uint64) * np.uint64(m)) >> np.uint64(32)).astype(np.uint32)
    for mulhi in (mulhi_xla, mulhi_limbs):
      np.testing.assert_array_equal(jax.jit(mulhi, static_argnums=1)(jnp.asarray(x), m), want)


def test_each_decision_is_one_byte_of_an_independent_philox():
  # Element j of row r is kept when byte j % 4 of word (j % 16) // 4 of Philox(key; counters
  # (j // 16, r, 0, 0)) is below round(256 keep_prob): the NumPy implementation above.
  key = jax.random.key(4)
  rows, cols = 5, 40  # a partial last hash (40 = 2 x 16 + 8)
  mask = np.asarray(keep_mask(key, 0.7, (rows, cols), 'philox'))
  words = [int(w) for w in jax.random.bits(key, (2,), jnp.uint32)]
  r, w = np.meshgrid(np.arange(rows), np.arange(3), indexing='ij')
  out = _numpy_philox(words, (w.ravel(), r.ravel(), np.zeros(r.size), np.zeros(r.size)))
  draws = np.stack(out, axis=-1).astype('<u4').view(np.uint8).reshape(rows, 48)[:, :cols]
  np.testing.assert_array_equal(mask, draws < keep_threshold(0.7))


def _draws(shape, seed=1):
  """The 8-bit draws behind a philox mask of `shape`, laid out as keep_mask lays them (the
  test above ties that layout to keep_mask's decisions)."""
  key = jax.random.key(seed)
  words = jax.random.bits(key, (2,), jnp.uint32)
  rows, cols = shape
  hashes = cols // 16
  r = jnp.repeat(jnp.arange(rows, dtype=jnp.uint32), hashes)
  w = jnp.tile(jnp.arange(hashes, dtype=jnp.uint32), rows)
  zero = jnp.zeros_like(r)
  out = jax.jit(philox4x32)(words[0], words[1], (w, r, zero, zero))
  stacked = np.stack([np.asarray(o) for o in out], axis=-1).astype('<u4')
  return stacked.view(np.uint8).reshape(rows, cols)


def test_philox_draws_are_uniform_and_serially_uncorrelated():
  draws = _draws((2048, 512))  # 1,048,576 draws from 65,536 hashes
  n = draws.size
  bits = np.unpackbits(draws.reshape(-1, 1), axis=1)  # [n, 8]
  # Frequency (monobit): the share of ones over all 8n bits.
  ones = int(bits.sum(dtype=np.int64))
  assert abs((ones - 4 * n) / np.sqrt(2 * n)) < Z
  # Each of the 128 output bit positions of the hash (Bonferroni over them).
  per_position = bits.reshape(-1, 128).mean(0)
  z = (per_position - 0.5) / np.sqrt(0.25 / (n // 16))
  assert np.all(np.abs(z) < stats.norm.isf(ALPHA / 2 / 128))
  # The 256 values of a draw: chi-square with 255 degrees of freedom.
  counts = np.bincount(draws.ravel(), minlength=256)
  assert stats.chisquare(counts).statistic < stats.chi2.isf(ALPHA, 255)
  # Serial correlation of consecutive draws along a row (inside a hash and across hashes),
  # and of the same column in consecutive rows (the counter's second word): |r| sqrt(n) < z.
  x = draws.astype(np.float64)
  for a, b in ((x[:, :-1], x[:, 1:]), (x[:-1], x[1:])):
    r = np.corrcoef(a.ravel(), b.ravel())[0, 1]
    assert abs(r) * np.sqrt(a.size) < Z, r
  # Every pair of lanes within a hash (Bonferroni over the 120 pairs).
  lanes = x.reshape(-1, 16)
  corr = np.corrcoef(lanes.T)[np.triu_indices(16, 1)]
  assert np.all(np.abs(corr) * np.sqrt(lanes.shape[0]) < stats.norm.isf(ALPHA / 2 / 120))


def test_philox_keep_rate_and_neighbouring_keys():
  mask = np.asarray(keep_mask(jax.random.key(3), 0.9, (1000, 1000), 'philox'))
  realised = keep_threshold(0.9) / 256
  assert abs(mask.mean() - realised) < Z * np.sqrt(realised * (1 - realised) / mask.size)
  # Keys one fold apart (consecutive layers, steps) give independent masks.
  other = np.asarray(
    keep_mask(jax.random.fold_in(jax.random.key(3), 1), 0.9, (1000, 1000), 'philox')
  )
  agree, expected = np.mean(mask == other), realised**2 + (1 - realised) ** 2
  assert abs(agree - expected) < Z * np.sqrt(expected * (1 - expected) / mask.size)
  # and a mask other than threefry's
  threefry = np.asarray(keep_mask(jax.random.key(3), 0.9, (1000, 1000)))
  assert abs(np.mean(mask == threefry) - expected) < Z * np.sqrt(
    expected * (1 - expected) / mask.size
  )


_SHARDED = r"""
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
from realformer_jax.kernels.dropout import dropout_bits
mesh = Mesh(np.array(jax.devices()), ('data',), axis_types=(AxisType.Auto,))
key = jax.random.key(3)
mask = lambda: dropout_bits.keep_mask(key, 0.9, (4, 2, 8, 32), 'philox')
sharded = jax.jit(mask, out_shardings=NamedSharding(mesh, P('data')))()
assert np.array_equal(np.asarray(sharded), np.asarray(jax.jit(mask)()))
print('SAME')
"""


def test_a_sharded_program_draws_the_philox_mask_of_one_device():
  """XLA's mulhi does not lower under a sharded jit (jax 0.10.2): the XLA form is the limbs'."""
  done = subprocess.run(
    [sys.executable, '-c', _SHARDED],
    cwd=REPO,
    env=compile_settings.cpu_devices_env(2),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0 and 'SAME' in done.stdout, done.stderr[-2000:]

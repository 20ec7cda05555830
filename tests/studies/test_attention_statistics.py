"""The attention analysis's entropy and adjacent-layer JSD (realformer_jax/studies/
attention_analysis.py: entropy_and_jsd) against a float64 NumPy reference written from the
definitions, on float32 softmaxes computed inside the same jit, as from a model (peaked ones
included: at the top of the 24-layer RealFormers the JSD came out inf). No matmul: float32
elementwise arithmetic on CPU; the reference works in float64 from the same logits."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.studies.attention_analysis import entropy_and_jsd


def _reference(logits: np.ndarray):
  logits = logits.astype(np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  plogq = lambda x, y: np.where(x > 0, x * np.log(np.where(x > 0, y, 1.0)), 0.0)
  entropy = -plogq(p, p).sum(-1)
  a, b = p[:-1], p[1:]
  m = 0.5 * (a + b)
  kl = lambda x: (plogq(x, x) - plogq(x, m)).sum(-1)
  return entropy, 0.5 * kl(a) + 0.5 * kl(b)


def test_entropy_and_jsd_match_the_definitions():
  """Logits 0.5 to 120 apart, one peakedness a batch row (at 30 and up many weights fall among
  float32's subnormals inside the fused softmax)."""
  scales = np.array([0.5, 8.0, 30.0, 60.0, 120.0])[None, :, None, None]
  logits = (scales * np.random.default_rng(0).standard_normal((4, 5, 3, 64))).astype(np.float32)
  stats = jax.jit(lambda x: entropy_and_jsd(jax.nn.softmax(x, axis=-1)))
  entropy, jsd = map(np.asarray, stats(jnp.asarray(logits)))  # [layers(-1), scales, heads]
  want_entropy, want_jsd = _reference(logits)
  np.testing.assert_allclose(entropy, want_entropy, atol=1e-5)
  np.testing.assert_allclose(jsd, want_jsd, atol=1e-5)
  assert np.all(np.isfinite(jsd)) and np.all((jsd >= -1e-7) & (jsd <= math.log(2) + 1e-6))


def test_a_subnormal_weight_beside_a_zero_keeps_the_jsd_finite():
  """The case that gave inf, built on purpose: layer 1 gives a key exp(-k) of the weight
  (subnormal in float32 for k in about 87.3-103.3), layer 2 gives it none."""
  logits = np.full((2, 20, 4), -300.0, np.float32)  # [layers, k, keys]
  logits[:, :, 0] = 0.0
  logits[0, :, 1] = -np.linspace(86, 105, 20)
  stats = jax.jit(lambda x: entropy_and_jsd(jax.nn.softmax(x, axis=-1)))
  entropy, jsd = map(np.asarray, stats(jnp.asarray(logits)))
  want_entropy, want_jsd = _reference(logits)
  assert np.all(np.isfinite(jsd)), jsd
  np.testing.assert_allclose(jsd, want_jsd, atol=1e-6)
  np.testing.assert_allclose(entropy, want_entropy, atol=1e-6)


def test_identical_layers_diverge_by_0_and_disjoint_ones_by_ln_2():
  a = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
  b = np.array([0.0, 0.0, 0.5, 0.5], np.float32)
  entropy, jsd = map(np.asarray, entropy_and_jsd(jnp.asarray(np.stack([a, b, b]))))
  assert jsd[0] == pytest.approx(math.log(2), abs=1e-6) and jsd[1] == 0.0
  assert entropy[0] == 0.0 and entropy[1] == pytest.approx(math.log(2))

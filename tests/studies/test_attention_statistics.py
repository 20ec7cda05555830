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


# Logits `scale` apart: at 30 and 60 many weights fall among float32's subnormals inside the
# fused softmax, where a weight beside a 0 of the next layer made the mixture 0 and the JSD inf.
@pytest.mark.parametrize('scale', [0.5, 8.0, 30.0, 60.0, 120.0])
def test_entropy_and_jsd_match_the_definitions(scale):
  logits = (scale * np.random.default_rng(0).standard_normal((4, 2, 3, 64))).astype(np.float32)
  stats = jax.jit(lambda x: entropy_and_jsd(jax.nn.softmax(x, axis=-1)))
  entropy, jsd = map(np.asarray, stats(jnp.asarray(logits)))  # [layers, batch, heads(, pairs)]
  want_entropy, want_jsd = _reference(logits)
  np.testing.assert_allclose(entropy, want_entropy, atol=1e-5)
  np.testing.assert_allclose(jsd, want_jsd, atol=1e-5)
  assert np.all(np.isfinite(jsd)) and np.all((jsd >= -1e-7) & (jsd <= math.log(2) + 1e-6))


def test_identical_layers_diverge_by_0_and_disjoint_ones_by_ln_2():
  a = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
  b = np.array([0.0, 0.0, 0.5, 0.5], np.float32)
  entropy, jsd = map(np.asarray, entropy_and_jsd(jnp.asarray(np.stack([a, b, b]))))
  assert jsd[0] == pytest.approx(math.log(2), abs=1e-6) and jsd[1] == 0.0
  assert entropy[0] == 0.0 and entropy[1] == pytest.approx(math.log(2))

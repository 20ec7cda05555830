"""Rotary position embeddings: relative positions only, a float64 reference, any length.
Float32 matmuls (tests/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model_fixtures import padded_batch, tiny_config
from realformer_jax import MaskedLM
from realformer_jax.config import ConfigError
from realformer_jax.params import stack_layers, unbox
from realformer_jax.rotary import apply_rotary


def _reference_rotary(x, base):
  """Explicit 2x2 rotation of every feature pair, float64 NumPy."""
  x = np.asarray(x, np.float64)
  out = np.empty_like(x)
  _, length, heads, dim = x.shape
  for m in range(length):
    for i in range(dim // 2):
      angle = m * base ** (-2.0 * i / dim)
      rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
      out[:, m, :, 2 * i:2 * i + 2] = x[:, m, :, 2 * i:2 * i + 2] @ rotation.T
  return out


def test_rotary_matches_a_float64_rotation():
  x = jax.random.normal(jax.random.key(0), (2, 7, 3, 8))
  np.testing.assert_allclose(apply_rotary(x, 100.0), _reference_rotary(x, 100.0), atol=2e-6)
  norms = lambda v: np.linalg.norm(np.asarray(v), axis=-1)
  np.testing.assert_allclose(norms(apply_rotary(x, 100.0)), norms(x), rtol=1e-5)


def test_rotated_scores_depend_only_on_the_offset():
  q = jax.random.normal(jax.random.key(1), (1, 1, 1, 16))
  k = jax.random.normal(jax.random.key(2), (1, 1, 1, 16))

  def score(m, n):  # q at position m, k at position n, in sequences of length 40
    qs = jnp.zeros((1, 40, 1, 16)).at[:, m].set(q[:, 0])
    ks = jnp.zeros((1, 40, 1, 16)).at[:, n].set(k[:, 0])
    return float(jnp.sum(apply_rotary(qs, 10000.0)[:, m] * apply_rotary(ks, 10000.0)[:, n]))

  for m, n in ((0, 3), (5, 1), (2, 2)):
    for shift in (1, 7, 30):
      assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-5, abs=1e-5)
  assert score(0, 3) != pytest.approx(score(0, 4), rel=1e-3)  # the offset does matter


@pytest.mark.parametrize('placement', ['post', 'realformer'])
def test_rope_models_have_no_position_table_and_run_past_max_len(placement):
  cfg = tiny_config(position_embedding='rope', ln_placement=placement, max_len=16)
  ids, mask, segments = padded_batch(length=40, vocab=cfg.vocab_size, real_lengths=(40, 25))
  variables = MaskedLM(cfg).init(jax.random.key(0), ids, mask, segments)
  assert 'position' not in variables['params']['encoder']['embeddings']
  logits = MaskedLM(cfg).apply(variables, ids, mask, segments)  # 40 > max_len = 16
  assert logits.shape == (2, 40, cfg.vocab_size) and np.isfinite(logits).all()
  # Scan and loop layouts compute the same function.
  loop_cfg = cfg.replace(scan_layers=False)
  loop_params = unbox(MaskedLM(loop_cfg).init(jax.random.key(0), ids, mask,
                                               segments)['params'])
  scan_params = stack_layers(loop_params)
  np.testing.assert_allclose(MaskedLM(cfg).apply({'params': scan_params}, ids, mask, segments),
                             MaskedLM(loop_cfg).apply({'params': loop_params}, ids, mask,
                                                      segments), rtol=1e-5, atol=1e-5)


def test_learned_positions_still_stop_at_their_table():
  cfg = tiny_config(max_len=16)
  ids, mask, segments = padded_batch(length=20, vocab=cfg.vocab_size, real_lengths=(20, 9))
  with pytest.raises(ValueError, match='sequence length 20 exceeds model.max_len=16'):
    MaskedLM(cfg).init(jax.random.key(0), ids, mask, segments)
  with pytest.raises(ConfigError, match='position_embedding=rope: .* must be even'):
    tiny_config(position_embedding='rope', hidden_size=36, num_heads=4)
  with pytest.raises(ConfigError, match="position_embedding='absolute'"):
    tiny_config(position_embedding='absolute')


def test_training_config_allows_sequences_past_max_len_only_under_rope():
  from train_fixtures import tiny_config as train_config  # pylint: disable=import-outside-toplevel
  from realformer_jax import train  # pylint: disable=import-outside-toplevel
  rope = train_config(model__position_embedding='rope', model__max_len=16, data__max_len=32)
  assert train.validate_config(rope).position_embedding == 'rope'
  with pytest.raises(ConfigError, match='data.max_len=32: sequence longer than the position'):
    train.validate_config(train_config(model__max_len=16, data__max_len=32))

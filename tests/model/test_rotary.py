"""Rotary position embeddings: relative positions only, float64 references, any length, every
layer layout. Float32 matmuls: the suite pins jax_default_matmul_precision='highest'
(tests/conftest.py); the sharded subprocess pins it too."""

import json
import subprocess
import sys

import compile_settings
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import repo_paths
import subprocesses
from model_fixtures import init_params, padded_batch, tiny_config

from realformer_jax import MaskedLM
from realformer_jax.config import ConfigError
from realformer_jax.model.params import stack_layers, unbox, unstack_layers
from realformer_jax.model.rotary import apply_rotary
from tests.numpy_reference import reference_mlm_logits

REPO = repo_paths.REPO


def _reference_rotary(x, base):
  """Explicit 2x2 rotation of every feature pair, float64 NumPy."""
  x = np.asarray(x, np.float64)
  out = np.empty_like(x)
  _, length, heads, dim = x.shape
  for m in range(length):
    for i in range(dim // 2):
      angle = m * base ** (-2.0 * i / dim)
      rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
      out[:, m, :, 2 * i : 2 * i + 2] = x[:, m, :, 2 * i : 2 * i + 2] @ rotation.T
  return out


def test_rotary_matches_a_float64_rotation():
  x = jax.random.normal(jax.random.key(0), (2, 7, 3, 8))
  np.testing.assert_allclose(apply_rotary(x, 100.0), _reference_rotary(x, 100.0), atol=2e-6)
  norms = lambda v: np.linalg.norm(np.asarray(v), axis=-1)
  np.testing.assert_allclose(norms(apply_rotary(x, 100.0)), norms(x), rtol=1e-5)
  # An offset continues the positions: the tail of a longer sequence.
  np.testing.assert_allclose(
    apply_rotary(x[:, 3:], 100.0, offset=3), _reference_rotary(x, 100.0)[:, 3:], atol=2e-6
  )


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


def _first_layer_logits(cfg, params, ids, mask, segments):
  _, state = MaskedLM(cfg).apply({'params': params}, ids, mask, segments, mutable=['intermediates'])
  logits = state['intermediates']['encoder']['layers']['attention']['attention_logits'][0]
  return np.asarray(logits[0])  # layer 0: [B, H, L, L]


@pytest.mark.slow  # 4-9 s CPU a case: a model init and apply; the float64 checks stay fast
@pytest.mark.parametrize('position_embedding', ['rope', 'learned'])
def test_first_layer_scores_of_a_constant_sequence_are_toeplitz_only_under_rope(position_embedding):
  """Every position holds the same token, so under rope the layer-0 score of (m, n) is a
  function of n - m alone (constant along diagonals); a learned table breaks that."""
  cfg = tiny_config(position_embedding=position_embedding, ln_placement='realformer')
  ids = jnp.full((1, 20), 7, jnp.int32)
  mask, segments = jnp.ones_like(ids), jnp.zeros_like(ids)
  params = init_params(cfg, ids, mask, segments, seed=3)
  logits_HxLxL = _first_layer_logits(cfg, params, ids, mask, segments)[0]
  deviation = max(
    float(np.ptp(np.diagonal(logits_HxLxL, offset, axis1=1, axis2=2), axis=1).max())
    for offset in range(-19, 20)
  )
  spread = float(np.ptp(logits_HxLxL))
  assert spread > 1e-4  # the scores do vary with the offset
  if position_embedding == 'rope':
    assert deviation <= 1e-5 * max(1.0, float(np.abs(logits_HxLxL).max()))
  else:
    assert deviation > 0.1 * spread


@pytest.mark.slow  # ~6 s CPU: two model applies
def test_no_positions_means_permuting_tokens_permutes_the_outputs():
  cfg = tiny_config(position_embedding='none', ln_placement='realformer')
  ids, mask, segments = padded_batch(vocab=cfg.vocab_size, real_lengths=(12, 12))
  segments = jnp.zeros_like(segments)
  params = init_params(cfg, ids, mask, segments)
  assert 'position' not in params['encoder']['embeddings']
  permutation = np.random.default_rng(0).permutation(ids.shape[1])
  logits = MaskedLM(cfg).apply({'params': params}, ids, mask, segments)
  permuted = MaskedLM(cfg).apply({'params': params}, ids[:, permutation], mask, segments)
  np.testing.assert_allclose(permuted, logits[:, permutation], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  'attention_scale', ['standard', pytest.param('entropy_invariant', marks=pytest.mark.slow)]
)
def test_rope_realformer_matches_a_float64_reference(attention_scale):
  cfg = tiny_config(
    position_embedding='rope', ln_placement='realformer', attention_scale=attention_scale
  )
  ids, mask, segments = padded_batch(vocab=cfg.vocab_size, real_lengths=(12, 9))
  params = init_params(cfg, ids, mask, segments, seed=1)
  rng = np.random.default_rng(7)
  params = jax.tree.map(
    lambda x: np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params
  )
  # Large query/key weights: peaked attention, so positions change the output a lot.
  qkv = params['encoder']['layers']['attention']['qkv']
  qkv['kernel'] = qkv['kernel'] * 25.0
  positions = np.array([[0, 3, 11], [1, 2, 6]], np.int32)
  ours = np.asarray(MaskedLM(cfg).apply({'params': params}, ids, mask, segments, positions))
  expected = reference_mlm_logits(params, cfg, ids, mask, segments, positions)
  np.testing.assert_allclose(ours, expected, atol=2e-4, rtol=2e-4)
  # The rotation matters at this size: the same weights without it are far off.
  unrotated = reference_mlm_logits(
    params, cfg.replace(position_embedding='none'), ids, mask, segments, positions
  )
  assert np.abs(unrotated - expected).max() > 100 * 2e-4


def _loss(cfg, params, ids, mask, segments):
  logits = MaskedLM(cfg).apply({'params': params}, ids, mask, segments)
  return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])


@pytest.mark.parametrize('ln_placement', ['post', 'pre', 'realformer'])
@pytest.mark.slow
def test_rope_runs_past_max_len_and_scan_with_remat_equals_the_loop(ln_placement):
  cfg = tiny_config(
    position_embedding='rope', ln_placement=ln_placement, max_len=16, remat_policy='full'
  )
  ids, mask, segments = padded_batch(length=40, vocab=cfg.vocab_size, real_lengths=(40, 25))
  scan_params = init_params(cfg, ids, mask, segments)  # 40 > max_len = 16
  assert 'position' not in scan_params['encoder']['embeddings']
  loop_cfg = cfg.replace(scan_layers=False, remat_policy='none')
  loop_params = unstack_layers(scan_params)
  scan_loss, scan_grads = jax.value_and_grad(lambda p: _loss(cfg, p, ids, mask, segments))(
    scan_params
  )
  loop_loss, loop_grads = jax.value_and_grad(lambda p: _loss(loop_cfg, p, ids, mask, segments))(
    loop_params
  )
  assert np.isfinite(scan_loss)
  np.testing.assert_allclose(scan_loss, loop_loss, rtol=1e-5, atol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
    scan_grads,
    stack_layers(loop_grads),
  )


def test_learned_positions_still_stop_at_their_table():
  cfg = tiny_config(max_len=16)
  ids, mask, segments = padded_batch(length=20, vocab=cfg.vocab_size, real_lengths=(20, 9))
  with pytest.raises(ValueError, match='sequence length 20 exceeds model.max_len=16'):
    MaskedLM(cfg).init(jax.random.key(0), ids, mask, segments)
  with pytest.raises(ConfigError, match='position_embedding=rope: .* must be even'):
    tiny_config(position_embedding='rope', hidden_size=36, num_heads=4)
  with pytest.raises(ConfigError, match="position_embedding='absolute'"):
    tiny_config(position_embedding='absolute')
  with pytest.raises(ConfigError, match='model.rope_base=0.0: must be positive'):
    tiny_config(position_embedding='rope', rope_base=0.0)


def test_training_config_allows_sequences_past_max_len_only_under_rope():
  from train_fixtures import tiny_config as train_config  # pylint: disable=import-outside-toplevel

  from realformer_jax import train  # pylint: disable=import-outside-toplevel

  rope = train_config(model__position_embedding='rope', model__max_len=16, data__max_len=32)
  assert train.validate_config(rope).model.position_embedding == 'rope'
  with pytest.raises(ConfigError, match='data.max_len=32: sequence longer than the position'):
    train.validate_config(train_config(model__max_len=16, data__max_len=32))


_SHARDED_SCRIPT = r"""
import json, sys
import jax
jax.config.update('jax_disable_most_optimizations', True)
jax.config.update('jax_default_matmul_precision', 'highest')
sys.path.insert(0, 'tests')
from train_fixtures import make_setup, synthetic_batch, tiny_config
from realformer_jax import train
from realformer_jax.train import build

losses = {}
for name, shape in [('dp', (8, 1, 1)), ('fsdp_tp', (2, 2, 2))]:
  config = tiny_config(mesh__shape=shape, model__position_embedding='rope',
                       model__attention_scale='entropy_invariant', model__remat_policy='full')
  setup = make_setup(config)
  key = jax.random.key(0)
  state = setup.init_state(key)
  compiled = build.compile_train_step(setup)
  rng = jax.device_put(key, setup.replicated)
  losses[name] = []
  for seed in range(2):
    batch = build.global_batch(synthetic_batch(config, seed), setup.batch_sharding)
    state, metrics = compiled(state, batch, rng)
    losses[name].append(float(metrics['mlm_loss_sum']))
print('RESULTS ' + json.dumps(losses))
"""


@pytest.mark.slow
def test_rope_trains_the_same_under_fsdp_and_tensor_parallel_sharding():
  """Heads split over the tensor axis: the rotation acts within a head (no communication)."""
  losses = subprocesses.script_results(_SHARDED_SCRIPT, devices=8, timeout=300)
  assert np.all(np.isfinite(losses['dp'])) and losses['dp'][0] != losses['dp'][1]
  np.testing.assert_allclose(losses['fsdp_tp'], losses['dp'], rtol=1e-5)

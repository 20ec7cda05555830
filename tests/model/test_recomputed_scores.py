"""residual_scores_backward='recomputed': the same gradients as autodiff, without saving any
layer's carried [B, H, L, L] sum (memory flat in depth). Float32 matmuls (tests/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_fixtures import padded_batch, tiny_config

from realformer_jax import MaskedLM, ModelConfig
from realformer_jax.config import ConfigError
from realformer_jax.kernels.score_paths.recomputed_scores import _forward, residual_stack
from realformer_jax.model.params import unbox


def _loss_and_grads(cfg, params, batch, rngs=None):
  ids, mask, segments = batch

  def loss(p):
    logits = MaskedLM(cfg).apply(
      {'params': p}, ids, mask, segments, deterministic=rngs is None, rngs=rngs
    )
    return jnp.mean(jnp.square(logits)) + jnp.mean(logits[..., 3])

  return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize(
  'overrides',
  [
    dict(ln_placement='realformer'),
    dict(ln_placement='realformer', running_mean=True),
    dict(ln_placement='pre', residual_attention=True, attention_scale='entropy_invariant'),
    dict(ln_placement='realformer', position_embedding='rope', attention_scale='entropy_invariant'),
  ],
)
@pytest.mark.slow
def test_recomputed_gradients_equal_the_saved_path(overrides):
  cfg = tiny_config(dropout_rate=0.0, attention_dropout_rate=0.0, **overrides)
  batch = padded_batch(vocab=cfg.vocab_size)
  params = unbox(MaskedLM(cfg).init(jax.random.key(0), *batch)['params'])
  saved = _loss_and_grads(cfg, params, batch)
  recomputed = _loss_and_grads(cfg.replace(residual_scores_backward='recomputed'), params, batch)
  np.testing.assert_allclose(recomputed[0], saved[0], rtol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6), recomputed[1], saved[1]
  )


@pytest.mark.slow  # 13-26 s CPU a case at load 6-9 (2026-11-26)
def test_custom_vjp_equals_autodiff_of_the_same_stack_with_dropout():
  # Same per-layer dropout keys on both sides, so the same masks: the VJP is exact.
  cfg = tiny_config(
    ln_placement='realformer',
    dropout_rate=0.2,
    attention_dropout_rate=0.2,
    residual_scores_backward='recomputed',
  )
  ids, mask, segments = padded_batch(vocab=cfg.vocab_size)
  variables = MaskedLM(cfg).init(jax.random.key(0), ids, mask, segments)
  params_N = unbox(variables['params']['encoder']['layers'])
  from realformer_jax.model.attention import mask_bias, score_scale  # pylint: disable=import-outside-toplevel
  from realformer_jax.model.block import EncoderLayer, LayerInputs  # pylint: disable=import-outside-toplevel

  layer = EncoderLayer(cfg)

  def layer_fn(p, x, acc, index, key, inputs):
    (y, acc_new), _ = layer.apply({'params': p}, (x, acc), index, inputs, rngs={'dropout': key})
    return y, acc_new

  x = jax.random.normal(jax.random.key(1), ids.shape + (cfg.hidden_size,))
  acc0 = jnp.zeros((ids.shape[0], cfg.num_heads, ids.shape[1], ids.shape[1]))
  keys = jax.random.split(jax.random.key(2), cfg.num_layers)
  aux = LayerInputs(mask_bias(mask), score_scale(cfg, mask), None, deterministic=False)
  cotangent = jax.random.normal(jax.random.key(3), x.shape)
  custom = jax.vjp(lambda p, x: residual_stack(layer_fn, p, x, acc0, keys, aux), params_N, x)
  plain = jax.vjp(lambda p, x: _forward(layer_fn, p, x, acc0, keys, aux)[0], params_N, x)
  np.testing.assert_array_equal(custom[0], plain[0])
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6),
    custom[1](cotangent),
    plain[1](cotangent),
  )


def _temp_bytes(cfg, length):
  ids = jnp.zeros((1, length), jnp.int32)
  params = jax.eval_shape(lambda: unbox(MaskedLM(cfg).init(jax.random.key(0), ids)['params']))

  def loss(p):
    return jnp.sum(MaskedLM(cfg).apply({'params': p}, ids, masked_positions_BxP=ids[:, :2]))

  return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_recomputed_memory_does_not_grow_with_depth():
  length, heads = 256, 2
  score_bytes = heads * length * length * 4
  growth = {}
  for mode, remat in (('saved', 'full'), ('recomputed', 'none')):
    temps = [
      _temp_bytes(
        tiny_config(
          ln_placement='realformer',
          num_layers=n,
          residual_scores_backward=mode,
          remat_policy=remat,
          max_len=length,
        ),
        length,
      )
      for n in (2, 8)
    ]
    growth[mode] = (temps[1] - temps[0]) / 6  # bytes per extra layer
  # Saving: about one carried float32 sum per layer; recomputing: a small fraction of one.
  assert growth['saved'] >= 0.9 * score_bytes, growth
  assert growth['recomputed'] < 0.1 * score_bytes, growth


def test_recomputed_needs_the_scan():
  with pytest.raises(
    ConfigError, match="residual_scores_backward='recomputed': needs model.scan_layers=True"
  ):
    ModelConfig(residual_scores_backward='recomputed', scan_layers=False)

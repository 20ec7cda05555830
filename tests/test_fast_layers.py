"""Speed-motivated layers compute exactly what the plain versions compute."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.block import FeedForward
from realformer_jax.dropout_bits import keep_mask, realised_keep_prob
from realformer_jax.layers import Dropout
from tests.model_fixtures import tiny_config


def _plain_dropout(x, mask, keep):
  """The textbook inverted dropout the fast layer must equal, given its mask."""
  return jnp.where(mask, x / keep, 0.0)


@pytest.mark.parametrize('rate', [0.1, 0.5])
def test_dropout_values_and_gradients_equal_plain_dropout_with_its_mask(rate):
  x = jax.random.normal(jax.random.key(0), (3, 4, 5, 7))  # odd last axis: half a word unused
  rngs = {'dropout': jax.random.key(7)}
  keep = realised_keep_prob(1.0 - rate)
  mask = Dropout(rate).apply({}, jnp.ones_like(x), deterministic=False, rngs=rngs) != 0

  @jax.jit
  def value_and_vjp(x):
    y, vjp = jax.vjp(lambda x: Dropout(rate).apply({}, x, deterministic=False, rngs=rngs), x)
    return y, vjp(jnp.cos(y))[0]

  y, dx = value_and_vjp(x)
  np.testing.assert_allclose(y, _plain_dropout(x, mask, keep), rtol=1e-6)
  np.testing.assert_allclose(dx, _plain_dropout(jnp.cos(y), mask, keep), rtol=1e-6)
  assert 0 < int(mask.sum()) < mask.size
  assert Dropout(rate).apply({}, x, deterministic=True) is x
  assert Dropout(0.0).apply({}, x, deterministic=False, rngs=rngs) is x


def test_dropout_keeps_flax_auto_names_and_rng_stream():
  """Same auto-names as flax (so checkpoints and RNG folding line up), distinct masks for two
  layers in one module, and the layer's mask is keep_mask of flax's per-layer RNG."""
  class Two(nn.Module):
    cls: type

    @nn.compact
    def __call__(self, x):
      return self.cls(0.3)(x, deterministic=False), self.cls(0.3)(x, deterministic=False)

  x = jnp.ones((4, 8))
  rngs = {'dropout': jax.random.key(3)}
  a, b = Two(Dropout).apply({}, x, rngs=rngs)
  assert not np.array_equal(a, b)

  class Probe(nn.Module):  # what make_rng returns for each flax Dropout
    @nn.compact
    def __call__(self):
      return [nn.Dropout(0.3, name=f'Dropout_{i}').make_rng('dropout') for i in range(2)]

  keys = Probe().apply({}, rngs=rngs)
  for out, key in zip((a, b), keys):
    np.testing.assert_array_equal(out != 0, keep_mask(key, 0.7, x.shape))


def test_feed_forward_recomputed_activation_gives_plain_values_and_gradients():
  cfg = tiny_config()
  x = jax.random.normal(jax.random.key(1), (2, 5, cfg.hidden_size))
  layer = FeedForward(cfg)
  params = layer.init(jax.random.key(0), x, jnp.asarray(0))['params']
  params = jax.tree.map(lambda p: p + 0.1, nn.meta.unbox(params))  # non-zero biases

  def plain(p, x):
    h = x @ p['wi']['kernel'] + p['wi']['bias']
    return jax.nn.gelu(h, approximate=False) @ p['wo']['kernel'] + p['wo']['bias']

  def ours(p, x):
    return layer.apply({'params': p}, x, jnp.asarray(0))

  loss = lambda f: lambda p, x: jnp.sum(jnp.sin(f(p, x)))
  np.testing.assert_allclose(ours(params, x), plain(params, x), rtol=1e-6, atol=1e-6)
  g_ours = jax.grad(loss(ours), argnums=(0, 1))(params, x)
  g_plain = jax.grad(loss(plain), argnums=(0, 1))(params, x)
  for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_plain)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

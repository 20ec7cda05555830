"""Speed-motivated layers compute exactly what the plain versions compute."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.block import FeedForward
from realformer_jax.layers import Dropout
from tests.model_fixtures import tiny_config


@pytest.mark.parametrize('rate', [0.0, 0.1, 0.5])
def test_dropout_matches_flax_masks_values_and_gradients(rate):
  x = jax.random.normal(jax.random.key(0), (3, 4, 5, 6))
  rngs = {'dropout': jax.random.key(7)}

  def run(layer):
    @jax.jit  # as in training (run eagerly, XLA may fold x / keep differently: 1 ulp)
    def value_and_vjp(x):
      y, vjp = jax.vjp(lambda x: layer.apply({}, x, deterministic=False, rngs=rngs), x)
      return y, vjp(jnp.cos(y))[0]
    return value_and_vjp(x)

  ours, flax_ = run(Dropout(rate)), run(nn.Dropout(rate))
  for a, b in zip(ours, flax_):
    np.testing.assert_array_equal(a, b)
  assert Dropout(rate).apply({}, x, deterministic=True) is x


def test_dropout_keeps_flax_auto_names_so_rng_streams_match():
  class Two(nn.Module):
    cls: type

    @nn.compact
    def __call__(self, x):
      return self.cls(0.3)(x, deterministic=False) + self.cls(0.3)(x, deterministic=False)

  x = jnp.ones((4, 8))
  rngs = {'dropout': jax.random.key(3)}
  np.testing.assert_array_equal(Two(Dropout).apply({}, x, rngs=rngs),
                                Two(nn.Dropout).apply({}, x, rngs=rngs))


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

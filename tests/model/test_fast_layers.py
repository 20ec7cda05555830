"""Speed-motivated layers compute exactly what the plain versions compute."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.kernels.dropout.dropout_bits import keep_mask, realised_keep_prob
from realformer_jax.model.block import FeedForward
from realformer_jax.model.layers import Dropout
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
  # Jitted: eagerly, every primitive of the forward and backward compiles apart.
  g_ours = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(params, x)
  g_plain = jax.jit(jax.grad(loss(plain), argnums=(0, 1)))(params, x)
  for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_plain)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('dtype', ['float32', pytest.param('bfloat16', marks=pytest.mark.slow)])
def test_embeddings_lookups_equal_plain_gathers_with_their_gradients(dtype):
  # The segment table goes through a one-hot matmul and the position table through a slice:
  # values and table gradients must be those of plain row gathers (scatter-add gradients).
  from realformer_jax.model.embeddings import Embeddings  # pylint: disable=import-outside-toplevel
  from realformer_jax.model.normalization import Norm  # pylint: disable=import-outside-toplevel
  from realformer_jax.model.params import unbox  # pylint: disable=import-outside-toplevel

  cfg = tiny_config(dtype=dtype, type_vocab_size=3, norm='rmsnorm', dropout_rate=0.0)
  ids = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
  segments = jax.random.randint(jax.random.key(2), (2, 9), 0, 3)
  module = Embeddings(cfg)
  params = unbox(module.init(jax.random.key(0), ids, segments)['params'])
  rng = np.random.default_rng(3)  # NumPy: no eager compile per leaf shape
  params = jax.tree.map(
    lambda p: (np.asarray(p, np.float32) + rng.standard_normal(p.shape, np.float32)).astype(
      p.dtype
    ),
    params,
  )

  def fast(params):
    return module.apply({'params': params}, ids, segments).astype(jnp.float32)

  def plain(params):
    tables = {
      k: params[k]['embedding'].astype(cfg.compute_dtype) for k in ('word', 'position', 'segment')
    }
    x = tables['word'][ids] + tables['position'][jnp.arange(9)][None] + tables['segment'][segments]
    return Norm(cfg).apply({'params': params['norm']}, x).astype(jnp.float32)

  with jax.default_matmul_precision('highest'):  # only the plain path has matmuls to pin
    np.testing.assert_array_equal(fast(params), plain(params))
    cotangent = jax.random.normal(jax.random.key(4), (2, 9, cfg.hidden_size))
    fast_grads = jax.vjp(fast, params)[1](cotangent)[0]
    plain_grads = jax.vjp(plain, params)[1](cotangent)[0]
  # The row gradients are the same sums in another order: equal to rounding.
  tolerance = 1e-5 if dtype == 'float32' else 2e-2
  for name in ('position', 'segment'):
    np.testing.assert_allclose(
      fast_grads[name]['embedding'], plain_grads[name]['embedding'], rtol=tolerance, atol=tolerance
    )


def _plain_softmax_dropout_values(scores, bias, divisor, v, key, keep_prob, dtype):
  """What autodiff of the textbook form differentiates (same dropout mask)."""
  p = jax.nn.softmax(scores / divisor + bias, axis=-1)
  p_c = p.astype(dtype)
  if key is not None:
    p_c = _plain_dropout(
      p_c, keep_mask(key, keep_prob, p.shape), jnp.asarray(realised_keep_prob(keep_prob), dtype)
    )
  return jnp.einsum('bhqv,bvhk->bqhk', p_c, v.astype(dtype)), p


@pytest.mark.parametrize(
  'dtype, dropout', [('float32', True), ('float32', False), ('bfloat16', True)]
)
def test_softmax_dropout_values_match_autodiff_of_the_plain_form(dtype, dropout):
  from realformer_jax.model.softmax_attention import softmax_dropout_values  # pylint: disable=g-import-not-at-top

  dtype = jnp.dtype(dtype)
  keys = jax.random.split(jax.random.key(0), 5)
  scores = 3.0 * jax.random.normal(keys[0], (2, 3, 5, 5))
  bias = jnp.where(jnp.arange(5) < jnp.array([[5], [3]]), 0.0, -1e9)[:, None, None, :]
  v = jax.random.normal(keys[1], (2, 5, 3, 4)).astype(dtype)
  divisor = jnp.asarray(3.0)
  key = keys[2] if dropout else None
  cotangents = (
    jax.random.normal(keys[3], (2, 5, 3, 4)).astype(dtype),
    jax.random.normal(keys[4], (2, 3, 5, 5)),
  )  # also a user of the returned p

  def run(fn):
    out, vjp = jax.vjp(lambda s, b, v: fn(s, b, divisor, v, key, 0.75, dtype), scores, bias, v)
    return out, vjp(cotangents)

  # One jitted program for both forms: eager dispatch compiles each primitive separately.
  with jax.default_matmul_precision('highest'):
    (fast_out, fast_grads), (plain_out, plain_grads) = jax.jit(
      lambda: (run(softmax_dropout_values), run(_plain_softmax_dropout_values))
    )()
  # float32: the same arithmetic up to summation order; bfloat16: p read back in bfloat16.
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  for fast, plain in zip(fast_out + fast_grads, plain_out + plain_grads):
    assert fast.dtype == plain.dtype
    np.testing.assert_allclose(
      np.asarray(fast, np.float32), np.asarray(plain, np.float32), rtol=tol, atol=tol
    )

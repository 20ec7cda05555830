"""RMSNorm / LayerNorm formulas, `use_bias=False`, and second-moment-normalised activations."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax import MaskedLM, SequenceClassifier
from realformer_jax.model import params as params_lib
from realformer_jax.model.activations import get_activation
from realformer_jax.model.normalization import Norm
from tests.model_fixtures import padded_batch, tiny_config


def _norm_with_random_params(cfg, x):
  params = Norm(cfg).init(jax.random.key(0), x)['params']
  params = jax.tree.map(
    lambda p: p + jax.random.normal(jax.random.key(1), p.shape), params_lib.unbox(params)
  )
  return params, np.asarray(Norm(cfg).apply({'params': params}, x), np.float64)


def test_rmsnorm_matches_its_formula_and_has_no_bias():
  cfg = tiny_config(norm='rmsnorm', norm_epsilon=1e-6)
  x = 3.0 + 2.0 * jax.random.normal(jax.random.key(2), (2, 5, 32))  # nonzero mean on purpose
  params, y = _norm_with_random_params(cfg, x)
  assert set(params) == {'scale'}
  x64 = np.asarray(x, np.float64)
  expected = x64 / np.sqrt(np.mean(x64**2, -1, keepdims=True) + 1e-6) * np.asarray(params['scale'])
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
  # Without centring the mean survives: this is not LayerNorm.
  _, layer_norm = _norm_with_random_params(cfg.replace(norm='layernorm'), x)
  assert np.abs(layer_norm - y).max() > 0.1


def test_layernorm_matches_its_formula():
  cfg = tiny_config(norm='layernorm', norm_epsilon=1e-6)
  x = 3.0 + 2.0 * jax.random.normal(jax.random.key(2), (2, 5, 32))
  params, y = _norm_with_random_params(cfg, x)
  x64 = np.asarray(x, np.float64)
  centred = x64 - x64.mean(-1, keepdims=True)
  expected = centred / np.sqrt(np.mean(centred**2, -1, keepdims=True) + 1e-6) * np.asarray(
    params['scale']
  ) + np.asarray(params['bias'])
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def _param_paths(variables) -> list[str]:
  leaves = jax.tree_util.tree_leaves_with_path(params_lib.unbox(variables['params']))
  return ['/'.join(str(getattr(k, 'key', k)) for k in path) for path, _ in leaves]


@pytest.mark.parametrize(
  'ln_placement,norm', [('post', 'layernorm'), ('pre', 'layernorm'), ('realformer', 'rmsnorm')]
)
def test_use_bias_false_leaves_no_bias_parameter_anywhere(ln_placement, norm):
  ids, mask, segments = padded_batch()
  cfg = tiny_config(ln_placement=ln_placement, norm=norm, num_layers=1)
  models = {'mlm': MaskedLM, 'classifier': lambda c: SequenceClassifier(c, 3)}
  init = lambda build, c: jax.eval_shape(
    lambda: build(c).init(jax.random.key(0), ids, mask, segments)
  )
  for name, build in models.items():
    with_bias = _param_paths(init(build, cfg))
    without = _param_paths(init(build, cfg.replace(use_bias=False)))
    assert any('bias' in p for p in with_bias), name  # sanity: the default has biases
    assert not [p for p in without if 'bias' in p], (name, without)
    # Exactly the biases went: dense biases, LayerNorm biases and the MLM output bias.
    assert set(without) == {p for p in with_bias if 'bias' not in p}, name
  mlm_paths = _param_paths(init(MaskedLM, cfg))
  assert 'mlm_head/output_bias' in mlm_paths


@pytest.mark.parametrize('name', ['normalized_sigmoid', 'selu'])
def test_normalised_activations_have_unit_second_moment(name):
  z = jax.random.normal(jax.random.key(0), (10**6,), jnp.float32)
  second_moment = float(jnp.mean(jnp.square(get_activation(name)(z))))
  np.testing.assert_allclose(second_moment, 1.0, rtol=0.02)


def test_plain_activations_are_not_normalised():
  """Control: GELU / ReLU / sigmoid lose second moment, which is what the variants fix."""
  z = jax.random.normal(jax.random.key(0), (10**6,), jnp.float32)
  for name in ('gelu', 'relu'):
    assert float(jnp.mean(jnp.square(get_activation(name)(z)))) < 0.5
  np.testing.assert_allclose(float(jnp.mean(jnp.square(jax.nn.sigmoid(z)))), 0.293379, rtol=0.01)


def test_gelu_is_exact_erf_gelu_with_its_derivative():
  """'gelu' (erf form) against float64 x * Phi(x) and Phi(x) + x * phi(x), and jax's erfc form."""
  x = np.linspace(-12.0, 12.0, 4001).astype(np.float32)
  x64 = x.astype(np.float64)
  phi_cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x64 / math.sqrt(2.0)))
  density = np.exp(-0.5 * x64**2) / math.sqrt(2.0 * math.pi)
  gelu = get_activation('gelu')
  np.testing.assert_allclose(np.asarray(gelu(jnp.asarray(x))), x64 * phi_cdf, atol=2e-6, rtol=1e-6)
  grad = jax.vmap(jax.grad(gelu))(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(grad), phi_cdf + x64 * density, atol=2e-6, rtol=1e-6)
  np.testing.assert_allclose(
    np.asarray(gelu(jnp.asarray(x))),
    np.asarray(jax.nn.gelu(jnp.asarray(x), approximate=False)),
    atol=2e-6,
  )

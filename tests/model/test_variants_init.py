"""Initialisers and parameterisations: realised statistics against their formulas
(docs/design.md §4)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax import MaskedLM, SequenceClassifier
from realformer_jax.model import initializers
from realformer_jax.model import params as params_lib
from tests.model_fixtures import init_params, padded_batch, tiny_config

N_SAMPLES = 10**6
FAN_IN, FAN_OUT = 500, 2000  # asymmetric, so fan-in and fan-out rules differ
XAVIER_STD = math.sqrt(2.0 / (FAN_IN + FAN_OUT))


def _sample(init, shape=(FAN_IN, FAN_OUT), seed=0):
  assert math.prod(shape) == N_SAMPLES
  return np.asarray(init(jax.random.key(seed), shape, jnp.float32), np.float64)


@pytest.mark.parametrize(
  'name,target_std',
  [
    ('bert', 0.8796256 * 0.02),  # TF1 truncated normal: the +-2 sigma cut is not corrected
    ('truncated_normal', 0.02),
    ('lecun', math.sqrt(1.0 / FAN_IN)),
    ('he', math.sqrt(2.0 / FAN_IN)),
    ('xavier', XAVIER_STD),
    ('ds_init', XAVIER_STD),  # layer 1: DS-Init is Xavier
  ],
)
@pytest.mark.parametrize('parameterization', ['standard', 'ntk'])
def test_each_initialiser_realises_its_target_std(name, target_std, parameterization):
  cfg = tiny_config(init=name, parameterization=parameterization)
  w = _sample(initializers.kernel_init(cfg, fan_in=FAN_IN, fan_out=FAN_OUT, layer=1))
  if parameterization == 'ntk':
    target_std *= math.sqrt(FAN_IN)  # stored sqrt(m) larger, scaled back at run time
  assert abs(w.mean()) < 0.01 * target_std
  np.testing.assert_allclose(w.std(), target_std, rtol=0.03)


def test_ds_init_std_shrinks_as_one_over_sqrt_depth_with_gamma_alpha():
  cfg = tiny_config(init='ds_init', ds_init_gamma=1.5, ds_init_alpha=0.5)
  w = _sample(initializers.kernel_init(cfg, fan_in=FAN_IN, fan_out=FAN_OUT, layer=9))
  np.testing.assert_allclose(w.std(), 1.5 * 0.5 * XAVIER_STD / 3.0, rtol=0.03)


def test_truncated_normal_correction():
  """Corrected: sampled with 1.1368472 sigma, realises sigma; uncorrected realises 0.8796 sigma."""
  sigma = 0.05
  np.testing.assert_allclose(1.0 / initializers.TRUNCATED_NORMAL_STD, 1.1368472, rtol=1e-6)
  corrected = _sample(initializers.truncated_normal(sigma, corrected=True), (1000, 1000))
  uncorrected = _sample(initializers.truncated_normal(sigma, corrected=False), (1000, 1000))
  np.testing.assert_allclose(corrected.std(), sigma, rtol=0.01)
  np.testing.assert_allclose(uncorrected.std(), 0.8796 * sigma, rtol=0.01)
  # Both are cut at +-2 of the std they were sampled with.
  assert np.abs(uncorrected).max() <= 2 * sigma
  assert 1.99 * sigma / 0.8796 < np.abs(corrected).max() <= 2 * sigma / 0.8796 + 1e-7


@pytest.mark.slow  # ~11 s CPU: a d=128 model init; the per-initialiser std tests stay fast
def test_fused_qkv_slices_and_all_model_kernels_use_their_own_fans():
  """LeCun in a real model: every Q/K/V slice and the FFN matrices have std 1/sqrt(fan_in)."""
  d, f = 128, 512
  cfg = tiny_config(hidden_size=d, num_heads=4, mlp_dim=f, num_layers=2, init='lecun')
  params = init_params(cfg, *padded_batch())
  layers = params['encoder']['layers']
  qkv = np.asarray(layers['attention']['qkv']['kernel'])  # [layers, d, 3, heads, kv]
  for i in range(3):
    np.testing.assert_allclose(qkv[:, :, i].std(), d**-0.5, rtol=0.03)
  np.testing.assert_allclose(np.std(layers['attention']['out']['kernel']), d**-0.5, rtol=0.03)
  np.testing.assert_allclose(np.std(layers['mlp']['wi']['kernel']), d**-0.5, rtol=0.03)
  np.testing.assert_allclose(np.std(layers['mlp']['wo']['kernel']), f**-0.5, rtol=0.03)


@pytest.mark.slow  # ~10 s CPU: a 6-layer model init
def test_ds_init_bound_per_layer_of_the_scanned_stack():
  d, f, num_layers = 64, 256, 6
  cfg = tiny_config(
    hidden_size=d, num_heads=4, mlp_dim=f, num_layers=num_layers, init='ds_init', ds_init_alpha=0.8
  )
  params = init_params(cfg, *padded_batch())
  layers = params['encoder']['layers']
  kernels = {  # name: (stacked kernel, fan_in, fan_out of one matrix)
    'q': (layers['attention']['qkv']['kernel'][:, :, 0], d, d),
    'k': (layers['attention']['qkv']['kernel'][:, :, 1], d, d),
    'v': (layers['attention']['qkv']['kernel'][:, :, 2], d, d),
    'out': (layers['attention']['out']['kernel'], d, d),
    'wi': (layers['mlp']['wi']['kernel'], d, f),
    'wo': (layers['mlp']['wo']['kernel'], f, d),
  }
  for name, (stacked, fan_in, fan_out) in kernels.items():
    stacked = np.asarray(stacked)
    assert stacked.shape[0] == num_layers
    for index in range(num_layers):
      bound = 0.8 * math.sqrt(6.0 / (fan_in + fan_out)) / math.sqrt(index + 1)
      peak = np.abs(stacked[index]).max()
      # >= 4096 uniform draws: the largest is within 1% of the bound.
      assert 0.99 * bound < peak <= bound * (1 + 1e-6), (name, index + 1, peak, bound)
  # Outside the stack (MLM transform) there is no depth: plain Xavier bound times alpha.
  transform = np.asarray(params['mlm_head']['transform']['kernel'])
  bound = 0.8 * math.sqrt(6.0 / (2 * d))
  assert 0.99 * bound < np.abs(transform).max() <= bound * (1 + 1e-6)


def _fan_in(path: tuple, kernel: np.ndarray, scanned: bool) -> int:
  """Fan-in of a DenseGeneral kernel from its name (the contracted input axes)."""
  shape = kernel.shape[1:] if scanned else kernel.shape
  return shape[0] * shape[1] if path[-2] == 'out' else shape[0]


@pytest.mark.parametrize('model_kind', ['mlm', 'classifier'])
@pytest.mark.slow
def test_ntk_and_standard_compute_the_same_function(model_kind):
  """Standard weights = NTK weights / sqrt(fan_in) (embeddings shared) -> identical outputs."""
  ids, mask, segments = padded_batch()
  ntk = tiny_config(
    parameterization='ntk', init='lecun', ln_placement='pre', activation='gelu_tanh'
  )
  standard = ntk.replace(parameterization='standard')
  build = {'mlm': lambda c: MaskedLM(c), 'classifier': lambda c: SequenceClassifier(c, 3)}
  variables = build[model_kind](ntk).init(jax.random.key(0), ids, mask, segments)
  ntk_params = jax.tree.map(np.asarray, params_lib.unbox(variables['params']))

  def to_standard(path, leaf):
    names = tuple(p.key for p in path)
    if names[-1] != 'kernel':
      return leaf  # embeddings, biases, norms: the same in both parameterisations
    scanned = 'layers' in names
    return leaf / math.sqrt(_fan_in(names, leaf, scanned))

  std_params = jax.tree_util.tree_map_with_path(to_standard, ntk_params)
  # The textbook NTK form: LeCun kernels are stored as N(0, 1).
  wi = ntk_params['encoder']['layers']['mlp']['wi']['kernel']
  assert abs(np.std(wi) - 1.0) < 0.1
  run = lambda cfg, p: np.asarray(build[model_kind](cfg).apply({'params': p}, ids, mask, segments))
  out_ntk, out_std = run(ntk, ntk_params), run(standard, std_params)
  np.testing.assert_allclose(out_ntk, out_std, rtol=2e-5, atol=2e-5)
  assert np.abs(out_std).max() > 1e-2  # not trivially zero
  # And the NTK model is not the standard model applied to the same stored weights.
  assert np.abs(run(standard, ntk_params) - out_ntk).max() > 1e-2

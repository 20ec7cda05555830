"""RealFormer forward pass against an independent NumPy reference (docs/design.md §1).

The reference is written from the paper's official TF1 modeling.py semantics with plain NumPy,
sharing nothing with the Flax code but the weights. Tolerances are for float32 matmuls: the
suite pins jax_default_matmul_precision='highest' (tests/conftest.py), without which a GPU's
TF32 default misses them (4e-4 > 2e-4 measured on an H100).
"""

import math

import numpy as np
import pytest

from realformer_jax import MaskedLM
from realformer_jax.model import params as params_lib
from tests.model_fixtures import init_params, padded_batch, tiny_config
from tests.numpy_reference import reference_mlm_logits


@pytest.mark.parametrize(
  'scan_layers, running_mean',
  [
    (True, False),
    (False, False),
    (False, True),
    pytest.param(True, True, marks=pytest.mark.slow),  # ~5 s CPU; each option is fast above
  ],
)
def test_three_layer_realformer_matches_numpy_reference(running_mean, scan_layers):
  cfg = tiny_config(ln_placement='realformer', running_mean=running_mean, scan_layers=scan_layers)
  ids, mask, segments = padded_batch()
  params = init_params(cfg, ids, mask, segments, seed=1)
  # Non-zero biases and norm offsets so that every parameter matters.
  params = _perturb(params)
  positions = np.array([[0, 3, 11], [1, 2, 6]], np.int32)
  ours = MaskedLM(cfg).apply({'params': params}, ids, mask, segments, positions)
  expected = reference_mlm_logits(params, cfg, ids, mask, segments, positions)
  np.testing.assert_allclose(np.asarray(ours), expected, atol=2e-4, rtol=2e-4)


def _perturb(params, seed=7, scale=0.05):
  import jax

  leaves, treedef = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  leaves = [
    np.asarray(x) + scale * rng.standard_normal(np.shape(x)).astype(np.float32) for x in leaves
  ]
  return jax.tree.unflatten(treedef, leaves)

"""model.residual_carry='qk': attention from the stacked queries and keys of the layers below
(kernels/qk_reference.py, kernels/qk_carry.py) equals the carried-sum path. Matmuls in float32
(tests/conftest.py pins 'highest')."""

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax.config import ModelConfig
from realformer_jax.kernels import qk_reference
from realformer_jax.model.attention import score_scale
from realformer_jax.model.rotary import apply_rotary


def _layers_qk(layers=3, batch=2, seq_len=16, heads=2, head_dim=8, seed=0):
  keys = jax.random.split(jax.random.key(seed), 2)
  shape = (layers, batch, seq_len, heads, head_dim)
  return jax.random.normal(keys[0], shape), jax.random.normal(keys[1], shape)


def test_sum_of_layer_scores_is_one_product_over_stacked_features():
  # The identity, with the model's details: rotary-rotated q and k, a per-row
  # (entropy-invariant) scale, and a sequence with padding (its own scale).
  q_N, k_N = _layers_qk()
  q_N, k_N = (jax.vmap(lambda x: apply_rotary(x, 10000.0))(x) for x in (q_N, k_N))
  mask = np.ones((2, 16), np.int32)
  mask[1, 5:] = 0
  config = ModelConfig(hidden_size=16, num_heads=2, attention_scale='entropy_invariant')
  scale = score_scale(config, jnp.asarray(mask))
  stack = jnp.zeros((2,) + q_N.shape, jnp.float32)
  acc = None
  for layer in range(q_N.shape[0]):
    s = qk_reference.layer_scores(q_N[layer], k_N[layer], scale)
    acc = s if acc is None else acc + s  # model/attention.py's carried sum
    stack = qk_reference.push(stack, jnp.asarray(layer), q_N[layer], k_N[layer])
    from_stack = qk_reference.summed_scores(stack, jnp.asarray(layer + 1), scale, jnp.float32)
    np.testing.assert_allclose(from_stack, acc, rtol=1e-5, atol=1e-5)
  # Slots above the bound are never read, whatever they hold.
  poisoned = stack.at[:, 2].set(jnp.inf)
  np.testing.assert_array_equal(
    qk_reference.summed_scores(poisoned, jnp.asarray(2), scale, jnp.float32),
    qk_reference.summed_scores(stack, jnp.asarray(2), scale, jnp.float32),
  )
  assert not np.any(qk_reference.summed_scores(stack, jnp.asarray(0), scale, jnp.float32))

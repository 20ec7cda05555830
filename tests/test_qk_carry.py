"""model.residual_carry='qk': attention from the stacked queries and keys of the layers below
(kernels/qk_reference.py, kernels/qk_carry.py) equals the carried-sum path. Matmuls in float32
(tests/conftest.py pins 'highest')."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.config import ModelConfig
from realformer_jax.kernels import qk_carry, qk_reference
from realformer_jax.kernels.select import AttentionPlan
from realformer_jax.model.attention import mask_bias, score_scale
from realformer_jax.model.encoder import Encoder
from realformer_jax.model.rotary import apply_rotary
from realformer_jax.model.softmax_attention import softmax_dropout_values


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


def _op_inputs(layers=3, batch=2, seq_len=32, heads=2, head_dim=8, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(1), 3)
  stack = jax.random.normal(keys[0], (2, layers, batch, seq_len, heads, head_dim))
  stack = stack.astype(dtype).astype(jnp.float32)  # values computed in the compute dtype
  v = jax.random.normal(keys[1], (batch, seq_len, heads, head_dim), dtype)
  mask = np.ones((batch, seq_len), np.int32)
  mask[0, 20:] = 0  # padding
  mask[1, :] = 0  # a sequence with no real key: a uniform softmax, no nan
  weights = jax.random.normal(keys[2], v.shape)
  return stack, v, jnp.asarray(mask), weights


def _reference_context(stack, v, index, bias, scale, divisor, key, keep_prob, dtype):
  acc = qk_reference.summed_scores(stack, index + 1, scale, dtype)
  return softmax_dropout_values(acc, bias, divisor, v, key, keep_prob, dtype)[0]


@pytest.mark.parametrize(
  'running_mean, dropout, scale_kind',
  [
    (False, False, 'standard'),
    (True, False, 'entropy_invariant'),
    (True, True, 'entropy_invariant'),
    (False, True, 'standard'),
  ],
)
def test_kernel_op_equals_einsum_identity_float32(running_mean, dropout, scale_kind):
  stack, v, mask, weights = _op_inputs()
  index = jnp.asarray(1)
  stack = stack.at[:, 2].set(1e30)  # a slot above the layer: never read
  config = ModelConfig(hidden_size=16, num_heads=2, attention_scale=scale_kind)
  scale = score_scale(config, mask)
  bias = mask_bias(mask)
  divisor = jnp.asarray(2.0) if running_mean else None
  key = jax.random.key(7) if dropout else None
  plan = AttentionPlan('pallas', 'triton', True, 16, 16, 16)
  w_stack = jax.random.normal(jax.random.key(3), stack.shape)

  def kernel_loss(stack, v):
    context, passed = qk_carry.kernel_attention(
      plan, stack, v, index, bias, scale, divisor, key, 0.75
    )
    return jnp.sum(context * weights) + jnp.sum(jnp.where(passed < 1e29, passed, 0) * w_stack)

  def reference_loss(stack, v):
    context = _reference_context(stack, v, index, bias, scale, divisor, key, 0.75, jnp.float32)
    return jnp.sum(context * weights) + jnp.sum(jnp.where(stack < 1e29, stack, 0) * w_stack)

  loss, grads = jax.value_and_grad(kernel_loss, argnums=(0, 1))(stack, v)
  ref_loss, ref_grads = jax.value_and_grad(reference_loss, argnums=(0, 1))(stack, v)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for got, want in zip(grads, ref_grads):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))
  assert not np.any(grads[0][:, 2])  # no gradient for a layer above


# --- The encoder: residual_carry='qk' equals 'scores' ------------------------------------------

SEQ = 32


def _encoder_config(**overrides):
  base = dict(
    vocab_size=50,
    hidden_size=32,
    num_layers=3,
    num_heads=2,
    mlp_dim=48,
    max_len=SEQ,
    ln_placement='realformer',
    dropout_rate=0.1,
    attention_dropout_rate=0.2,
    residual_carry='scores',
    attention_impl='xla',
  )
  return ModelConfig(**{**base, **overrides})


def _encoder_inputs():
  ids = jax.random.randint(jax.random.key(1), (2, SEQ), 1, 50)
  mask = jnp.ones((2, SEQ), jnp.int32).at[1, 21:].set(0)
  return ids, mask


def _loss_and_grads(cfg, params, ids, mask, deterministic=False):
  def loss(p):
    h = Encoder(cfg).apply(
      p, ids, mask, deterministic=deterministic, rngs={'dropout': jax.random.key(5)}
    )
    return jnp.sum(jnp.sin(h) * jnp.linspace(-1, 1, h.shape[-1]))

  return jax.value_and_grad(loss)(params)


def _assert_trees_close(actual, expected, rtol):
  def close(a, b):
    scale = float(np.max(np.abs(b))) if np.size(b) else 0.0
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)

  jax.tree.map(close, actual, expected)


@pytest.mark.parametrize(
  'impl, overrides',
  [
    ('xla', dict()),
    ('xla', dict(running_mean=True, attention_scale='entropy_invariant')),
    ('xla', dict(position_embedding='rope', scan_layers=False)),
    ('xla', dict(remat_policy='full')),
    ('pallas_triton', dict(running_mean=True, attention_scale='entropy_invariant')),
    ('pallas_triton', dict(position_embedding='rope', attention_scale='t5')),
  ],
)
def test_encoder_qk_carry_equals_carried_sum_float32(impl, overrides):
  # Values and gradients of a 3-layer RealFormer with dropout and a padded sequence; the
  # reference is the carried-sum einsum path. The qk einsum path and the interpret-mode
  # Triton kernels (tiles of 16: several per sequence). A scanned qk stack in training is
  # qk_carry.qk_stack, which draws per-layer dropout keys as the recomputed-scores stack does
  # (not as nn.scan splits them): that is its reference there, the plain scan's elsewhere.
  cfg = _encoder_config(**overrides)
  ids, mask = _encoder_inputs()
  params = Encoder(cfg).init(jax.random.key(0), ids, mask)
  reference = cfg.replace(residual_scores_backward='recomputed') if cfg.scan_layers else cfg
  loss, grads = _loss_and_grads(reference, params, ids, mask)
  qk = cfg.replace(residual_carry='qk', attention_impl=impl, attention_platform='cpu')
  qk_loss, qk_grads = _loss_and_grads(qk, params, ids, mask)
  np.testing.assert_allclose(qk_loss, loss, rtol=1e-5)
  _assert_trees_close(qk_grads, grads, 1e-5)

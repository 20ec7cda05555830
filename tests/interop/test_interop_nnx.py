"""The encoder and heads in a Flax NNX program (realformer_jax/interop/nnx.py): trained with
nnx.Optimizer, they give the numbers linen gives. Matmuls at float32 'highest' (conftest)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from model_fixtures import padded_batch, tiny_config

from realformer_jax import MaskedLM
from realformer_jax.interop.nnx import logical_specs, to_nnx
from realformer_jax.model import params as params_lib
from realformer_jax.model.encoder import Encoder

STEPS = 3


def _loss(logits_BxLxV, ids_BxL, mask_BxL):
  losses = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, ids_BxL)
  return jnp.sum(losses * mask_BxL) / jnp.sum(mask_BxL)


@pytest.mark.slow
def test_nnx_training_matches_linen():
  cfg = tiny_config(ln_placement='realformer', num_layers=2)
  ids, mask, segments = padded_batch()
  tx = optax.adamw(1e-2)

  model = to_nnx(MaskedLM(cfg), ids, mask, segments, rngs=nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))  # linen's starting point
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @nnx.jit
  def nnx_step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: _loss(m(ids, mask, segments), ids, mask))(model)
    optimizer.update(model, grads)
    return loss

  linen = MaskedLM(cfg)

  @jax.jit
  def linen_step(params, opt_state):
    loss_fn = lambda p: _loss(linen.apply({'params': p}, ids, mask, segments), ids, mask)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = tx.init(params)
  nnx_losses, linen_losses = [], []
  for _ in range(STEPS):
    nnx_losses.append(float(nnx_step(model, optimizer)))
    params, opt_state, loss = linen_step(params, opt_state)
    linen_losses.append(float(loss))

  np.testing.assert_allclose(nnx_losses, linen_losses, rtol=1e-6)
  assert nnx_losses[-1] < nnx_losses[0]  # it trained
  trained = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), trained, params)


@pytest.mark.slow  # ~6 s CPU: NNX model build and sharding
def test_nnx_keeps_logical_axes_for_sharding():
  cfg = tiny_config(num_layers=2)
  ids, mask, segments = padded_batch()
  model = to_nnx(Encoder(cfg), ids, mask, segments, rngs=nnx.Rngs(0))
  specs = logical_specs(model)
  linen_specs = nn_logical_specs(cfg, ids, mask, segments)
  assert specs == linen_specs
  assert specs['layers']['attention']['qkv']['kernel'] == jax.sharding.PartitionSpec(
    'layers', 'embed', None, 'heads', 'kv'
  )


def nn_logical_specs(cfg, ids, mask, segments):
  variables = jax.eval_shape(lambda: Encoder(cfg).init(jax.random.key(0), ids, mask, segments))
  return nn.get_partition_spec(variables)['params']


@pytest.mark.slow
def test_nnx_params_are_linen_params_and_dropout_draws_from_rngs():
  cfg = tiny_config(num_layers=2, dropout_rate=0.5)
  ids, mask, segments = padded_batch()
  model = to_nnx(MaskedLM(cfg), ids, mask, segments, rngs=nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  linen = MaskedLM(cfg).apply({'params': params}, ids, mask, segments)
  np.testing.assert_array_equal(model(ids, mask, segments), linen)
  assert jax.tree.structure(params) == jax.tree.structure(
    params_lib.unbox(MaskedLM(cfg).init(jax.random.key(0), ids, mask, segments)['params'])
  )
  first = model(ids, mask, segments, deterministic=False)
  second = model(ids, mask, segments, deterministic=False)
  assert not np.allclose(first, second)  # the Rngs' dropout stream advances

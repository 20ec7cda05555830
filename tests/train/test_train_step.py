"""The compiled train step: gradient accumulation equals one big batch; the optimizer follows
the recipe (warmup then linear decay to 0, decay only on kernels and embeddings)."""

import jax
import numpy as np
import optax
import pytest
from train_fixtures import make_setup, synthetic_batch, tiny_config

from realformer_jax import train
from realformer_jax.model import losses
from realformer_jax.train import build


def _first_step(config):
  """(setup, initial state, state after one step, metrics); states and metrics on the host."""
  setup = make_setup(config)
  key = jax.random.key(0)
  state = setup.init_state(key)
  initial = jax.device_get(state)  # before the step donates it
  step = build.compile_train_step(setup)
  batch = build.global_batch(synthetic_batch(config), setup.batch_sharding)
  new_state, metrics = jax.device_get(step(state, batch, jax.device_put(key, setup.replicated)))
  return setup, initial, new_state, metrics


def _one_step(config):
  return _first_step(config)[2:]


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch():
  # No dropout: microbatches would otherwise draw different masks than the big batch.
  overrides = dict(
    model__dropout_rate=0.0, model__attention_dropout_rate=0.0, train__warmup_steps=0
  )
  big_state, big_metrics = _one_step(tiny_config(**overrides))
  acc_state, acc_metrics = _one_step(tiny_config(train__grad_accum_steps=4, **overrides))
  for name in ('mlm_loss_sum', 'mlm_correct_sum', 'mlm_weight', 'grad_norm'):
    assert acc_metrics[name] == pytest.approx(big_metrics[name], rel=1e-5), name
  moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), big_state.params, acc_state.params)
  assert max(jax.tree.leaves(moved)) < 1e-6
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
    big_state.opt_state[1][0].mu,
    acc_state.opt_state[1][0].mu,
  )


def test_schedule_warms_up_then_decays_linearly_to_zero():
  config = tiny_config(
    train__num_train_steps=100, train__warmup_steps=10, train__learning_rate=1e-3
  )
  schedule = build.learning_rate_schedule(config.train)
  values = [float(schedule(s)) for s in (0, 5, 10, 55, 100)]
  np.testing.assert_allclose(values, [0.0, 5e-4, 1e-3, 5e-4, 0.0], atol=1e-9)


def test_weight_decay_only_on_kernels_and_embeddings():
  setup = make_setup(tiny_config())
  mask = build.weight_decay_mask(setup.layout.abstract.params)
  flat = {
    jax.tree_util.keystr(path): decayed
    for path, decayed in jax.tree_util.tree_leaves_with_path(mask)
  }
  assert flat["['encoder']['embeddings']['word']['embedding']"]
  assert flat["['encoder']['layers']['attention']['qkv']['kernel']"]
  assert not flat["['encoder']['layers']['attention']['qkv']['bias']"]
  assert not flat["['encoder']['layers']['attention_norm']['scale']"]
  assert not flat["['mlm_head']['output_bias']"]
  # With zero gradients only decayed parameters move.
  tx = optax.adamw(1.0, weight_decay=0.5, mask=build.weight_decay_mask)
  params = {'dense': {'kernel': np.ones(3), 'bias': np.ones(3)}}
  updates, _ = tx.update(jax.tree.map(np.zeros_like, params), tx.init(params), params)
  assert np.all(updates['dense']['kernel'] < 0) and np.all(updates['dense']['bias'] == 0)


@pytest.mark.slow
def test_per_layer_gradient_norms_are_opt_in_metrics():
  config = tiny_config(train__log_layer_grad_norms=True)
  _, metrics = _one_step(config)
  norms = metrics['layer_grad_norms']
  assert {'attention', 'mlp'} <= set(norms)
  for name, values in norms.items():
    assert values.shape == (config.model.num_layers,) and np.all(values > 0), name
  # The per-layer pieces are a partition of part of the gradient: their squares sum to at most
  # the squared global norm.
  assert sum(float(np.sum(v**2)) for v in norms.values()) <= metrics['grad_norm'] ** 2 * 1.0001
  assert 'layer_grad_norms' not in _one_step(tiny_config())[1]


@pytest.mark.parametrize('max_norm', [1e-3, 1.0, 1e3])
def test_clip_by_global_norm_matches_optax(max_norm):
  tree = {
    'a': np.linspace(-2.0, 3.0, 12, dtype=np.float32).reshape(3, 4),
    'b': {'c': np.full((5,), 0.25, np.float32)},
  }
  ours = build.clip_by_global_norm(max_norm)
  reference = optax.clip_by_global_norm(max_norm)
  got, got_state = ours.update(tree, ours.init(tree))
  want, want_state = reference.update(tree, reference.init(tree))
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6), got, want)
  assert type(got_state) is type(want_state)  # checkpoints keep the same opt_state tree
  zeros = jax.tree.map(np.zeros_like, tree)  # a zero gradient stays zero (no 0/0)
  assert all(np.all(leaf == 0) for leaf in jax.tree.leaves(ours.update(zeros, None)[0]))


@pytest.mark.slow
def test_train_step_is_clipped_adamw_on_the_mean_gradient():
  """One step against optax's own clip + AdamW applied to jax.grad of the mean MLM loss."""
  config = tiny_config(
    model__dropout_rate=0.0,
    model__attention_dropout_rate=0.0,
    train__warmup_steps=0,
    train__clip_grad_norm=0.05,
  )
  setup, state, new_state, metrics = _first_step(config)
  batch = synthetic_batch(config)

  def mean_loss(params):
    logits = setup.model.apply(
      {'params': params},
      batch['input_ids'],
      batch['input_mask'],
      batch['segment_ids'],
      batch['masked_positions'],
      deterministic=True,
      step=0,
    )
    return losses.mlm_loss_and_metrics(logits, batch['masked_ids'], batch['masked_weights'])[0]

  grads = jax.grad(mean_loss)(state.params)
  assert metrics['grad_norm'] == pytest.approx(float(optax.tree.norm(grads)), rel=1e-5)
  assert metrics['grad_norm'] > config.train.clip_grad_norm  # clipping is active
  tx = optax.chain(
    optax.clip_by_global_norm(config.train.clip_grad_norm),
    optax.adamw(
      build.learning_rate_schedule(config.train),
      b1=config.train.adam_b1,
      b2=config.train.adam_b2,
      eps=config.train.adam_eps,
      weight_decay=config.train.weight_decay,
      mask=build.weight_decay_mask,
    ),
  )
  updates, opt_state = tx.update(grads, tx.init(state.params), state.params)
  # The moments carry the gradient's scale (the first Adam step itself is nearly sign(g)).
  for got, want in (
    (new_state.opt_state[1][0].mu, opt_state[1][0].mu),
    (new_state.opt_state[1][0].nu, opt_state[1][0].nu),
  ):
    jax.tree.map(
      lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max()),
      got,
      want,
    )
  # Entries with |g| near eps are sensitive to summation order: compare at 1% of a step.
  step_size = config.train.learning_rate
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, w, atol=1e-2 * step_size),
    new_state.params,
    optax.apply_updates(state.params, updates),
  )

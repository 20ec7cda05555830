"""Diagnostics: per-layer gradient norms, residual second moments, DS-Init beta ratios against a
hand-wired computation of one layer, and the grad-norm script in --quick mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax import MaskedLM
from realformer_jax.analysis import diagnostics
from realformer_jax.model import params as params_lib
from realformer_jax.model.attention import ResidualSelfAttention, mask_bias, score_scale
from realformer_jax.model.block import FeedForward
from realformer_jax.model.embeddings import Embeddings
from realformer_jax.model.heads import MaskedLMHead, gather_positions
from realformer_jax.model.losses import mlm_loss_and_metrics
from tests.model_fixtures import init_params, padded_batch, tiny_config

POSITIONS = jnp.array([[0, 3, 11], [1, 2, 6]], jnp.int32)
TARGETS = jnp.array([[7, 8, 9], [10, 11, 12]], jnp.int32)
WEIGHTS = jnp.ones((2, 3), jnp.float32)


def _setup(cfg):
  ids, mask, segments = padded_batch()
  # jit everywhere below: one compile is much cheaper than eager op-by-op compiles.
  params = jax.jit(lambda: init_params(cfg, ids, mask, segments))()
  model = MaskedLM(cfg)
  inputs = (ids, mask, segments, POSITIONS)

  def loss_fn(variables):
    logits = model.apply(variables, *inputs)
    return mlm_loss_and_metrics(logits, TARGETS, WEIGHTS)[0]

  return model, params, inputs, loss_fn


@pytest.mark.parametrize('ln_placement', ['post', 'pre'])
@pytest.mark.slow  # 13-26 s CPU a case at load 6-9 (2026-11-26)
def test_grad_norms_and_second_moments_per_layer_in_scan_and_loop_layouts(ln_placement):
  cfg = tiny_config(ln_placement=ln_placement, init='xavier')
  model, params, inputs, loss_fn = _setup(cfg)
  grads = jax.jit(jax.grad(lambda p: loss_fn({'params': p})))(params)
  norms = diagnostics.per_layer_grad_norms(grads)
  assert set(norms) >= {'attention', 'mlp'}
  for name, value in norms.items():
    assert value.shape == (cfg.num_layers,), name
    assert np.all(np.asarray(value) > 0), name
  # The loop layout gives the same numbers.
  loop_norms = diagnostics.per_layer_grad_norms(params_lib.unstack_layers(grads))
  for name in norms:
    np.testing.assert_allclose(loop_norms[name], norms[name], rtol=1e-6)
  # Hand check of one entry: layer 1's FFN = both kernels and both biases.
  mlp = jax.tree.map(lambda g: g[1], grads['encoder']['layers']['mlp'])
  expected = np.sqrt(sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(mlp)))
  np.testing.assert_allclose(norms['mlp'][1], expected, rtol=1e-5)

  _, state = jax.jit(lambda p: model.apply({'params': p}, *inputs, mutable=['intermediates']))(
    params
  )
  moments = np.asarray(diagnostics.residual_second_moments(state['intermediates']))
  assert moments.shape == (cfg.num_layers,)
  if ln_placement == 'post':  # each layer ends in a unit-scale, zero-bias LayerNorm at init
    np.testing.assert_allclose(moments, 1.0, rtol=1e-4)
  else:  # Pre-LN's trunk accumulates every branch: its second moment grows with depth
    assert np.all(np.diff(moments) > 0)


def test_probes_are_free_when_off():
  cfg = tiny_config(ln_placement='realformer')
  model, params, inputs, loss_fn = _setup(cfg)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))
  assert set(variables) == {'params'}  # init creates no perturbation variables
  zeros = diagnostics.zero_perturbations(model, params, *inputs)
  shapes = jax.tree.map(jnp.shape, params_lib.stack_layers(zeros))['encoder']['layers']
  assert shapes == {
    name: (cfg.num_layers, 2, 12, cfg.hidden_size)
    for name in (
      'attention_input',
      'attention_residual',
      'attention_output',
      'mlp_residual',
      'mlp_output',
    )
  }
  run = jax.jit(lambda v: model.apply(v, *inputs))
  plain = run({'params': params})
  probed = run({'params': params, 'perturbations': zeros})
  np.testing.assert_array_equal(plain, probed)


def _layer_norm(v, p, eps):
  """LayerNorm written out (not the Norm module)."""
  centred = v - jnp.mean(v, -1, keepdims=True)
  return (
    centred / jnp.sqrt(jnp.mean(centred**2, -1, keepdims=True) + eps) * p['scale'] + (p['bias'])
  )


@pytest.mark.slow  # 13-26 s CPU a case at load 6-9 (2026-11-26)
def test_beta_ratios_match_a_hand_wired_post_ln_layer():
  """One Post-LN layer wired by hand from its modules and a written-out LayerNorm; dL/dz, dL/dr,
  dL/dx of each sublayer by the chain rule, piece by piece, against the probes."""
  cfg = tiny_config(ln_placement='post', num_layers=1, init='xavier')
  model, params, inputs, loss_fn = _setup(cfg)
  ids, mask, segments, positions = inputs
  zeros = diagnostics.zero_perturbations(model, params, *inputs)
  _, probe_grads = jax.jit(lambda p, z: diagnostics.param_and_probe_grads(loss_fn, p, z))(
    params, zeros
  )
  ratios = diagnostics.beta_ratios(probe_grads)
  probes = diagnostics.layer_tree(probe_grads)

  emb_p = params['encoder']['embeddings']
  layer_p = jax.tree.map(lambda a: a[0], params['encoder']['layers'])
  layer0 = jnp.asarray(0)
  eps = cfg.norm_epsilon
  attn = lambda v: ResidualSelfAttention(cfg).apply(
    {'params': layer_p['attention']}, v, mask_bias(mask), score_scale(cfg, mask), None, layer0
  )[0]
  ffn = lambda v: FeedForward(cfg).apply({'params': layer_p['mlp']}, v, layer0)
  decode = lambda h: Embeddings(cfg).apply({'params': emb_p}, h, method='attend')
  head = lambda z: MaskedLMHead(cfg).apply(
    {'params': params['mlm_head']}, gather_positions(z, positions), decode
  )

  @jax.jit
  def hand_grads():
    # Forward by hand, then the chain rule backwards one piece at a time (a vjp per piece).
    x = Embeddings(cfg).apply({'params': emb_p}, ids, segments)
    r1, attn_vjp = jax.vjp(lambda v: v + attn(v), x)
    z1, norm1_vjp = jax.vjp(lambda v: _layer_norm(v, layer_p['attention_norm'], eps), r1)
    r2, ffn_vjp = jax.vjp(lambda v: v + ffn(v), z1)
    z2, norm2_vjp = jax.vjp(lambda v: _layer_norm(v, layer_p['mlp_norm'], eps), r2)
    loss, dz2 = jax.value_and_grad(lambda z: mlm_loss_and_metrics(head(z), TARGETS, WEIGHTS)[0])(z2)
    (dr2,) = norm2_vjp(dz2)
    (dz1,) = ffn_vjp(dr2)
    (dr1,) = norm1_vjp(dz1)
    (dx,) = attn_vjp(dr1)
    return loss, {
      'attention_input': dx,
      'attention_residual': dr1,
      'attention_output': dz1,
      'mlp_residual': dr2,
      'mlp_output': dz2,
    }

  hand_loss, hand = hand_grads()
  np.testing.assert_allclose(hand_loss, loss_fn({'params': params}), rtol=1e-5)
  for name, grad in hand.items():
    np.testing.assert_allclose(probes[name][0], grad, rtol=1e-4, atol=1e-7, err_msg=name)

  norm = lambda g: float(jnp.sqrt(jnp.sum(g**2)))
  expected = {
    'attention': {
      'beta_ln': norm(hand['attention_residual']) / norm(hand['attention_output']),
      'beta_rc': norm(hand['attention_input']) / norm(hand['attention_residual']),
    },
    'mlp': {
      'beta_ln': norm(hand['mlp_residual']) / norm(hand['mlp_output']),
      'beta_rc': norm(hand['attention_output']) / norm(hand['mlp_residual']),
    },
  }
  for sublayer, values in expected.items():
    for name, value in values.items():
      got = float(ratios[sublayer][name][0])
      assert np.isfinite(got) and got > 0
      np.testing.assert_allclose(got, value, rtol=1e-4, err_msg=f'{sublayer} {name}')
    np.testing.assert_allclose(
      ratios[sublayer]['beta'][0], values['beta_ln'] * values['beta_rc'], rtol=1e-4
    )
  # The LayerNorm backward shrinks the gradient here (Xavier init: |r| > |z|).
  assert float(ratios['mlp']['beta_ln'][0]) < 1.0


@pytest.mark.parametrize(
  'ln_placement,residual_branch',
  [
    # ~8-10 s CPU a case: all slow; test_probes_are_free_when_off keeps the probes fast.
    pytest.param('pre', 'plain', marks=pytest.mark.slow),
    pytest.param('realformer', 'plain', marks=pytest.mark.slow),
    pytest.param('none', 'rezero', marks=pytest.mark.slow),
  ],
)
def test_beta_ratios_are_finite_on_tiny_models(ln_placement, residual_branch):
  cfg = tiny_config(ln_placement=ln_placement, residual_branch=residual_branch, init='xavier')
  model, params, inputs, loss_fn = _setup(cfg)
  zeros = diagnostics.zero_perturbations(model, params, *inputs)
  grads_fn = jax.jit(lambda p, z: diagnostics.param_and_probe_grads(loss_fn, p, z))
  _, probe_grads = grads_fn(params, zeros)
  ratios = diagnostics.beta_ratios(probe_grads)
  for sublayer in ('attention', 'mlp'):
    for name, value in ratios[sublayer].items():
      assert value.shape == (cfg.num_layers,)
      assert np.all(np.isfinite(value)) and np.all(np.asarray(value) > 0), (sublayer, name)
    if ln_placement != 'post' and ln_placement != 'realformer':
      # No norm on the trunk: z is r, so beta_LN is exactly 1.
      np.testing.assert_array_equal(ratios[sublayer]['beta_ln'], 1.0)
  flat = diagnostics.flatten_metrics(jax.device_get(ratios), 'beta')
  assert len(flat) == 2 * 3 * cfg.num_layers and 'beta/mlp/beta_rc/layer_02' in flat


@pytest.mark.slow  # ~9 s CPU: a model init and its layer outputs compiled
def test_layer_outputs_and_token_cosine():
  # Identical tokens -> 1; orthogonal tokens -> 0; padded tokens do not count.
  same = jnp.ones((1, 4, 8))
  onehot = jnp.eye(8)[None, :4]
  mask = jnp.array([[1, 1, 1, 0]])
  np.testing.assert_allclose(diagnostics.token_cosine(same, jnp.ones((1, 4))), 1.0, rtol=1e-6)
  np.testing.assert_allclose(diagnostics.token_cosine(onehot, jnp.ones((1, 4))), 0.0, atol=1e-7)
  mixed = onehot.at[0, 3].set(onehot[0, 0])  # only the padded token repeats token 0
  np.testing.assert_allclose(diagnostics.token_cosine(mixed, mask), 0.0, atol=1e-7)

  # A ReZero stack at init: every layer's output is the embeddings' output.
  cfg = tiny_config(residual_branch='rezero', ln_placement='realformer')
  model, params, inputs, _ = _setup(cfg)
  ids, mask, segments, positions = inputs
  outputs = jax.jit(lambda p: diagnostics.layer_outputs(model, {'params': p}, *inputs))(params)
  embedded = Embeddings(cfg).apply({'params': params['encoder']['embeddings']}, ids, segments)
  assert outputs.shape == (cfg.num_layers,) + embedded.shape
  for layer_out in outputs:
    np.testing.assert_allclose(layer_out, embedded, atol=1e-6)

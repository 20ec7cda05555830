"""Residual-branch variants (ReZero, SkipInit, fixed schedule) and their combinations with the
norm placements and residual attention (block.py docstring)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax import Embeddings, Encoder, MaskedLM
from realformer_jax.analysis import diagnostics
from realformer_jax.config import LN_PLACEMENTS, RESIDUAL_BRANCHES
from realformer_jax.model import params as params_lib
from realformer_jax.model.encoder import residual_gate_value
from tests.model_fixtures import init_params, padded_batch, tiny_config


def _stack_input_and_layer_outputs(cfg, params, ids, mask, segments, step=None):
  """(embeddings output, [output of each layer]) of the encoder, loop layout."""
  _, state = Encoder(cfg).apply(
    {'params': params},
    ids,
    mask,
    segments,
    step=step,
    capture_intermediates=True,
    mutable=['intermediates'],
  )
  captured = state['intermediates']
  stack_in = captured['embeddings']['__call__'][0]
  outs = [captured[f'layers_{i}']['__call__'][0][0][0] for i in range(cfg.num_layers)]
  return stack_in, outs


@pytest.mark.parametrize('ln_placement', ['post', 'realformer', 'pre', 'none'])
def test_rezero_every_layer_is_the_identity_at_init(ln_placement):
  cfg = tiny_config(residual_branch='rezero', ln_placement=ln_placement, scan_layers=False)
  ids, mask, segments = padded_batch()
  params = params_lib.unbox(Encoder(cfg).init(jax.random.key(0), ids, mask, segments)['params'])
  stack_in, outs = _stack_input_and_layer_outputs(cfg, params, ids, mask, segments)
  for layer_out in outs:
    np.testing.assert_array_equal(layer_out, stack_in)
  # No norm inside the layers, whatever the placement; the gates start at exactly 0.
  for i in range(cfg.num_layers):
    layer = params[f'layers_{i}']
    assert set(layer) == {'attention', 'mlp', 'attention_gate', 'mlp_gate'}
    assert float(layer['attention_gate']) == 0.0 == float(layer['mlp_gate'])
  # The branches themselves are not zero: moving a gate off 0 changes the output.
  moved = jax.tree_util.tree_map_with_path(
    lambda p, x: x + 0.5 if p[-1].key.endswith('_gate') else x, params
  )
  _, moved_outs = _stack_input_and_layer_outputs(cfg, moved, ids, mask, segments)
  assert np.abs(moved_outs[-1] - stack_in).max() > 1e-3


@pytest.mark.slow  # ~10 s CPU; the fast tier keeps the per-layer ReZero identity
def test_rezero_scanned_stack_output_equals_embeddings_and_gates_get_gradients():
  cfg = tiny_config(residual_branch='rezero', ln_placement='realformer')
  ids, mask, segments = padded_batch()
  params = init_params(cfg, ids, mask, segments)
  encoder_out = Encoder(cfg).apply({'params': params['encoder']}, ids, mask, segments)
  embedded = Embeddings(cfg).apply({'params': params['encoder']['embeddings']}, ids, segments)
  np.testing.assert_array_equal(encoder_out, embedded)

  def loss(p):
    logits = MaskedLM(cfg).apply({'params': p}, ids, mask, segments)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 1])

  grads = jax.jit(jax.grad(loss))(params)  # one compile beats eager op-by-op compiles
  norms = diagnostics.per_layer_grad_norms(grads)
  # Training can start: every gate has a gradient; branch weights have none until it moves.
  assert np.all(np.asarray(norms['attention_gate']) > 0)
  assert np.all(np.asarray(norms['mlp_gate']) > 0)
  assert np.all(np.asarray(norms['attention']) == 0)


@pytest.mark.parametrize(
  'ln_placement,layer_norms',
  [
    ('post', {'attention_norm', 'mlp_norm'}),
    ('realformer', {'attention_norm', 'mlp_norm'}),
    ('pre', set()),
    ('none', set()),
  ],
)
def test_skipinit_removes_only_the_norms_on_the_branch(ln_placement, layer_norms):
  cfg = tiny_config(residual_branch='skipinit', ln_placement=ln_placement, scan_layers=False)
  ids, mask, segments = padded_batch()
  params = params_lib.unbox(Encoder(cfg).init(jax.random.key(0), ids, mask, segments)['params'])
  layer = params['layers_0']
  assert set(layer) == {'attention', 'mlp', 'attention_gate', 'mlp_gate'} | layer_norms
  assert ('final_norm' in params) == (ln_placement == 'pre')
  stack_in, outs = _stack_input_and_layer_outputs(cfg, params, ids, mask, segments)
  if layer_norms:
    # Post-LN keeps its trunk norm: at init each layer re-normalises its (normalised) input.
    for layer_out in outs:
      np.testing.assert_allclose(layer_out, stack_in, atol=1e-4)
  else:
    for layer_out in outs:
      np.testing.assert_array_equal(layer_out, stack_in)


def test_fixed_schedule_gate_values():
  cfg = tiny_config(residual_branch='fixed_schedule', gate_schedule_steps=400)
  assert float(residual_gate_value(cfg, 0)) == 0.0
  np.testing.assert_allclose(float(residual_gate_value(cfg, 100)), 0.25, rtol=1e-7)
  np.testing.assert_allclose(
    float(residual_gate_value(cfg, jnp.asarray(399))), 399 / 400, rtol=1e-7
  )
  assert float(residual_gate_value(cfg, 400)) == 1.0
  assert float(residual_gate_value(cfg, 10**6)) == 1.0
  assert residual_gate_value(tiny_config(), 5) is None
  with pytest.raises(ValueError, match='step'):
    residual_gate_value(cfg, None)


def test_fixed_schedule_gate_scales_every_branch_and_is_not_trained():
  cfg = tiny_config(
    residual_branch='fixed_schedule',
    gate_schedule_steps=100,
    ln_placement='none',
    scan_layers=False,
  )
  ids, mask, segments = padded_batch()
  params = params_lib.unbox(
    Encoder(cfg).init(jax.random.key(0), ids, mask, segments, step=0)['params']
  )
  assert not any('gate' in k for k in params['layers_0'])
  stack_in, outs = _stack_input_and_layer_outputs(cfg, params, ids, mask, segments, step=0)
  np.testing.assert_array_equal(outs[-1], stack_in)  # a = 0 at step 0
  # At step 30 of 100: y = x + 0.3 * Attn(x) + 0.3 * FFN(h), h = x + 0.3 * Attn(x).
  _, state = Encoder(cfg).apply(
    {'params': params},
    ids,
    mask,
    segments,
    step=30,
    capture_intermediates=True,
    mutable=['intermediates'],
  )
  layer = state['intermediates']['layers_0']
  x = state['intermediates']['embeddings']['__call__'][0]
  attn = layer['attention']['__call__'][0][0]
  ffn = layer['mlp']['__call__'][0]
  y = layer['__call__'][0][0][0]
  np.testing.assert_allclose(y, x + 0.3 * attn + 0.3 * ffn, rtol=1e-5, atol=1e-6)
  assert np.abs(np.asarray(attn)).mean() > 1e-3 and np.abs(np.asarray(ffn)).mean() > 1e-3
  with pytest.raises(ValueError, match='step'):
    Encoder(cfg).apply({'params': params}, ids, mask, segments)


@pytest.mark.parametrize('residual_branch', RESIDUAL_BRANCHES)
@pytest.mark.slow
def test_every_branch_combines_with_every_placement_and_residual_attention(residual_branch):
  """Builds and runs (finite outputs) for all placements, with residual attention on and off;
  residual attention changes the output whenever the branches are live."""
  ids, mask, segments = padded_batch()
  step = 30 if residual_branch == 'fixed_schedule' else None
  for placement in LN_PLACEMENTS:
    outputs = {}
    for residual_attention in (False, True):
      # Loop layout: runs op by op without compiling a scan (fast for a 2-layer model).
      cfg = tiny_config(
        residual_branch=residual_branch,
        ln_placement=placement,
        residual_attention=residual_attention,
        num_layers=2,
        hidden_size=16,
        mlp_dim=16,
        gate_schedule_steps=40,
        scan_layers=False,
      )
      params = params_lib.unbox(
        MaskedLM(cfg).init(jax.random.key(0), ids, mask, segments, step=step)['params']
      )
      if residual_branch in ('rezero', 'skipinit'):  # make the gated branches live
        params = jax.tree_util.tree_map_with_path(
          lambda p, x: x + 0.7 if p[-1].key.endswith('_gate') else x, params
        )
      logits = MaskedLM(cfg).apply({'params': params}, ids, mask, segments, step=step)
      assert bool(jnp.all(jnp.isfinite(logits))), (placement, residual_attention)
      outputs[residual_attention] = np.asarray(logits)
    assert np.abs(outputs[True] - outputs[False]).max() > 1e-6, placement

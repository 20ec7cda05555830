"""Model properties: scan == loop, layout equivalences, padding, scaling, dtypes, sizes."""

import inspect
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax import Encoder, MaskedLM, ModelConfig, ResidualSelfAttention
from realformer_jax.config import ConfigError
from realformer_jax.model import params as params_lib
from realformer_jax.model.attention import mask_bias, score_scale
from tests.model_fixtures import init_params, padded_batch, tiny_config

POSITIONS = jnp.array([[0, 3, 11], [1, 2, 6]], jnp.int32)


def _loss(config, params, ids, mask, segments):
  logits = MaskedLM(config).apply({'params': params}, ids, mask, segments, POSITIONS)
  return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])


@pytest.mark.parametrize('remat_policy', ['none', 'full'])
@pytest.mark.parametrize('ln_placement', ['realformer', 'pre'])
@pytest.mark.slow
def test_scan_and_loop_agree_on_outputs_and_gradients(remat_policy, ln_placement):
  ids, mask, segments = padded_batch()
  scan_cfg = tiny_config(ln_placement=ln_placement, remat_policy=remat_policy)
  loop_cfg = scan_cfg.replace(scan_layers=False)
  scan_params = init_params(scan_cfg, ids, mask, segments)
  loop_params = params_lib.unstack_layers(scan_params)
  assert 'layers_2' in loop_params['encoder'] and 'layers' not in loop_params['encoder']

  scan_loss, scan_grads = jax.value_and_grad(lambda p: _loss(scan_cfg, p, ids, mask, segments))(
    scan_params
  )
  loop_loss, loop_grads = jax.value_and_grad(lambda p: _loss(loop_cfg, p, ids, mask, segments))(
    loop_params
  )
  np.testing.assert_allclose(scan_loss, loop_loss, atol=1e-5, rtol=1e-5)
  restacked = params_lib.stack_layers(loop_grads)
  for (path, a), b in zip(
    jax.tree_util.tree_leaves_with_path(scan_grads), jax.tree.leaves(restacked)
  ):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=str(path))
  # And the gradients are not trivially zero.
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(scan_grads)) > 1e-3


@pytest.mark.slow
def test_unrolled_scan_is_the_rolled_scan_with_and_without_dropout():
  """scan_unroll changes only how XLA executes the stack: same params, numbers and masks."""
  ids, mask, segments = padded_batch()
  rolled = tiny_config(ln_placement='realformer', dropout_rate=0.1, attention_dropout_rate=0.1)
  unrolled = rolled.replace(scan_unroll=rolled.num_layers)
  params = init_params(rolled, ids, mask, segments)
  rngs = {'dropout': jax.random.key(4)}

  def loss(cfg, p):
    logits = MaskedLM(cfg).apply(
      {'params': p}, ids, mask, segments, POSITIONS, deterministic=False, rngs=rngs
    )
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])

  a_loss, a_grads = jax.value_and_grad(lambda p: loss(rolled, p))(params)
  b_loss, b_grads = jax.value_and_grad(lambda p: loss(unrolled, p))(params)
  np.testing.assert_allclose(a_loss, b_loss, rtol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), a_grads, b_grads
  )
  with pytest.raises(ConfigError, match=r'^model.scan_unroll=2: must divide model.num_layers=3$'):
    rolled.replace(scan_unroll=2)


def test_layer_layouts_round_trip():
  # The model's parameter tree with distinct random values: the layouts are tree surgery, so an
  # initialised model (a compile) is not needed to check them.
  ids, mask, segments = padded_batch()
  shapes = jax.eval_shape(lambda: init_params(tiny_config(), ids, mask, segments))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype), shapes)
  back = params_lib.stack_layers(params_lib.unstack_layers(params))
  jax.tree.map(np.testing.assert_array_equal, params, back)


def test_realformer_without_residual_attention_is_post_exactly():
  ids, mask, segments = padded_batch()
  post = tiny_config(ln_placement='post')
  params = init_params(post, ids, mask, segments)
  off = tiny_config(ln_placement='realformer', residual_attention=False)
  on = tiny_config(ln_placement='realformer')
  run = lambda cfg: np.asarray(
    MaskedLM(cfg).apply({'params': params}, ids, mask, segments, POSITIONS)
  )
  np.testing.assert_array_equal(run(off), run(post))
  # Residual attention does change the output (slightly at init: BERT-init scores are tiny).
  assert np.abs(run(on) - run(post)).max() > 1e-6


@pytest.mark.parametrize(
  'ln_placement',
  [
    'realformer',
    pytest.param('post', marks=pytest.mark.slow),
    pytest.param('pre', marks=pytest.mark.slow),
  ],
)
# The running mean once per placement in the fast tier would double it: the slow tier has it.
@pytest.mark.parametrize('running_mean', [False, pytest.param(True, marks=pytest.mark.slow)])
def test_appended_padding_leaves_real_positions_unchanged(ln_placement, running_mean):
  cfg = tiny_config(ln_placement=ln_placement, running_mean=running_mean)
  ids, mask, segments = padded_batch(length=12, real_lengths=(12, 7))
  params = init_params(cfg, ids, mask, segments)
  extra = 9
  pad = lambda x: jnp.pad(x, ((0, 0), (0, extra)))
  model = MaskedLM(cfg)
  short, short_vars = model.apply(
    {'params': params}, ids, mask, segments, mutable=['intermediates']
  )
  long, long_vars = model.apply(
    {'params': params}, pad(ids), pad(mask), pad(segments), mutable=['intermediates']
  )
  for b, n in enumerate((12, 7)):
    np.testing.assert_allclose(long[b, :n], short[b, :n], atol=2e-5, rtol=2e-5)
  # The mask enters each layer's softmax exactly once: had it been carried, padded keys of
  # layer l would sit near (l + 1) * bias.
  logits_NxBxHxLxL = long_vars['intermediates']['encoder']['layers']['attention'][
    'attention_logits'
  ][0]
  padded_keys = logits_NxBxHxLxL[..., 12:]
  assert padded_keys.shape[0] == cfg.num_layers
  assert float(padded_keys.min()) > 1.5 * float(mask_bias(jnp.zeros((1, 1)))[0, 0, 0, 0])


def test_entropy_invariant_scale_equals_standard_at_base_length():
  cfg = tiny_config(attention_scale='entropy_invariant', entropy_base_len=512, max_len=512)
  full = jnp.ones((2, 512), jnp.int32)
  np.testing.assert_allclose(score_scale(cfg, full), cfg.head_dim**-0.5, rtol=1e-6)


def test_entropy_invariant_scale_uses_unpadded_key_count_per_row():
  cfg = tiny_config(attention_scale='entropy_invariant', entropy_base_len=512)
  mask = jnp.zeros((3, 100), jnp.int32).at[0, :64].set(1).at[1, :100].set(1).at[2, :1].set(1)
  scale = np.asarray(score_scale(cfg, mask)).reshape(-1)
  expected = [math.log(n, 512) / math.sqrt(cfg.head_dim) for n in (64, 100, 1)]
  np.testing.assert_allclose(scale, expected, rtol=1e-6)


def test_entropy_invariant_attention_uses_that_scale():
  """Inside the attention module: softmax input = log_512(n)/sqrt(d) * q.k for real keys."""
  cfg = tiny_config(attention_scale='entropy_invariant')
  std_cfg = tiny_config()
  ids, mask, segments = padded_batch()
  x = jax.random.normal(jax.random.key(0), (2, 12, cfg.hidden_size))
  attention = ResidualSelfAttention(cfg)
  variables = attention.init(
    jax.random.key(1), x, mask_bias(mask), score_scale(cfg, mask), None, jnp.asarray(0)
  )
  get_logits = lambda c: ResidualSelfAttention(c).apply(
    variables,
    x,
    mask_bias(mask),
    score_scale(c, mask),
    None,
    jnp.asarray(0),
    mutable=['intermediates'],
  )[1]['intermediates']['attention_logits'][0]
  ratio = get_logits(cfg)[1, :, :, :7] / get_logits(std_cfg)[1, :, :, :7]
  np.testing.assert_allclose(ratio, math.log(7, 512), rtol=1e-4)


@pytest.mark.slow
def test_t5_scaling_folds_one_over_sqrt_d_into_query_init():
  ids, mask, segments = padded_batch()
  std = init_params(tiny_config(hidden_size=256, num_heads=4, mlp_dim=32), ids, mask, segments)
  t5 = init_params(
    tiny_config(hidden_size=256, num_heads=4, mlp_dim=32, attention_scale='t5'), ids, mask, segments
  )
  std_q = std['encoder']['layers']['attention']['qkv']['kernel'][:, :, 0]
  t5_q = t5['encoder']['layers']['attention']['qkv']['kernel'][:, :, 0]
  t5_k = t5['encoder']['layers']['attention']['qkv']['kernel'][:, :, 1]
  np.testing.assert_allclose(np.std(t5_q) / np.std(std_q), 64**-0.5, rtol=0.03)
  np.testing.assert_allclose(np.std(t5_k), np.std(std_q), rtol=0.03)


@pytest.mark.slow
def test_bfloat16_keeps_carried_scores_float32_and_24_layers_stay_finite():
  cfg = tiny_config(num_layers=24, dtype='bfloat16', ln_placement='realformer')
  ids, mask, segments = padded_batch()
  x = jnp.ones((2, 12, cfg.hidden_size), jnp.bfloat16)
  attention = ResidualSelfAttention(cfg)
  prev = jnp.zeros((2, cfg.num_heads, 12, 12), jnp.float32)
  variables = attention.init(
    jax.random.key(0), x, mask_bias(mask), score_scale(cfg, mask), prev, jnp.asarray(3)
  )
  out, carried = attention.apply(
    variables, x, mask_bias(mask), score_scale(cfg, mask), prev, jnp.asarray(3)
  )
  assert out.dtype == jnp.bfloat16 and carried.dtype == jnp.float32

  params = init_params(cfg, ids, mask, segments)
  hidden = MaskedLM(cfg).apply({'params': params}, ids, mask, segments)
  assert hidden.dtype == jnp.float32  # MLM logits are float32
  assert bool(jnp.all(jnp.isfinite(hidden)))
  carry_shapes = jax.eval_shape(
    lambda: MaskedLM(cfg).apply({'params': params}, ids, mask, segments, mutable=['intermediates'])[
      1
    ]
  )
  logits = carry_shapes['intermediates']['encoder']['layers']['attention']['attention_logits'][0]
  assert logits.dtype == jnp.float32 and logits.shape == (24, 2, cfg.num_heads, 12, 12)


@pytest.mark.slow  # ~7 s CPU; test_kernels.py checks sown maps in the fast tier
def test_attention_maps_are_opt_in():
  cfg = tiny_config(ln_placement='realformer')
  ids, mask, segments = padded_batch()
  params = init_params(cfg, ids, mask, segments)
  plain = MaskedLM(cfg).apply({'params': params}, ids, mask, segments, POSITIONS)
  with_maps, state = MaskedLM(cfg).apply(
    {'params': params}, ids, mask, segments, POSITIONS, mutable=['intermediates']
  )
  np.testing.assert_array_equal(plain, with_maps)
  probs = state['intermediates']['encoder']['layers']['attention']['attention_probs'][0]
  assert probs.shape == (3, 2, 4, 12, 12)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


def _analytic_mlm_params(layers, d, heads, ffn, vocab=30522, max_len=512, types=2):
  del heads  # the head count does not change the parameter count
  embeddings = vocab * d + max_len * d + types * d + 2 * d
  attention = 3 * d * d + 3 * d + d * d + d
  feed_forward = d * ffn + ffn + ffn * d + d
  layer = attention + feed_forward + 2 * (2 * d)
  mlm_head = d * d + d + 2 * d + vocab
  return embeddings + layers * layer + mlm_head


@pytest.mark.parametrize(
  'name,shape,paper_millions',
  [
    ('small', (4, 512, 8, 2048), 30),
    ('base', (12, 768, 12, 3072), 110),
    ('large', (24, 1024, 16, 4096), 340),
    ('xlarge', (36, 1536, 24, 6144), 1000),
  ],
)
def test_parameter_counts_of_paper_shapes(name, shape, paper_millions):
  layers, d, heads, ffn = shape
  cfg = ModelConfig(num_layers=layers, hidden_size=d, num_heads=heads, mlp_dim=ffn)
  ids = jnp.zeros((1, 8), jnp.int32)
  abstract = jax.eval_shape(lambda: MaskedLM(cfg).init(jax.random.key(0), ids))
  count = params_lib.count_params(abstract['params'])
  assert count == _analytic_mlm_params(layers, d, heads, ffn), name
  # Within 10% of the paper's rounded figure (it counts BERT's pooler and NSP head too).
  assert abs(count / 1e6 - paper_millions) / paper_millions < 0.1, (name, count)


def test_the_encoder_call_documents_each_argument():
  """Issue 59: `Encoder.__call__`, the model's entry point, had no docstring; `help()` shows
  what each argument is (shape, range, default)."""
  doc = inspect.getdoc(Encoder.__call__) or ''
  arguments = [name for name in inspect.signature(Encoder.__call__).parameters if name != 'self']
  assert arguments, 'no arguments found'
  for name in arguments:
    assert re.search(rf'^  {name}: \S', doc, re.M), (name, doc)
  assert re.search(r'^Returns:\n  \S', doc, re.M), doc

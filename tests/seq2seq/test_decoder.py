"""The decoder: average attention is uniform causal attention, incremental decoding equals
teacher forcing for every decoder kind (and the variants that change a decoder layer),
DS-Init scales decoder layers by their depth, merged attention against a float64 NumPy
layer, beam search against exhaustive search and greedy search. Float32 matmuls
('highest' precision, tests/conftest.py). Everything model-sized is jitted: eager dispatch
of a whole Seq2Seq costs more than compiling it."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_fixtures import TINY, seq2seq_config, tiny_config

from realformer_jax.config import ConfigError
from realformer_jax.model.params import unbox
from realformer_jax.seq2seq import Seq2Seq, decoding
from realformer_jax.seq2seq.average_attention import AverageAttention, uniform_prefix_average
from realformer_jax.seq2seq.decoder import causal_bias
from realformer_jax.seq2seq.model_config import Seq2SeqModelConfig


def _init(model, source, mask, target, seed=0):
  return unbox(jax.jit(model.init)(jax.random.key(seed), source, mask, target)['params'])


def _batch(vocab, batch=2, source_len=7, target_len=6, seed=0):
  rng = np.random.default_rng(seed)
  source = rng.integers(5, vocab, (batch, source_len)).astype(np.int32)
  mask = (np.arange(source_len)[None] < np.array([[source_len], [4]])[:batch]).astype(np.int32)
  target = rng.integers(5, vocab, (batch, target_len)).astype(np.int32)
  return jnp.asarray(source * mask), jnp.asarray(mask), jnp.asarray(target)


def test_prefix_average_is_uniform_causal_attention():
  y = jax.random.normal(jax.random.key(0), (2, 5, 3))
  weights = jax.nn.softmax(jnp.zeros((5, 5)) + causal_bias(5)[0, 0], axis=-1)
  np.testing.assert_allclose(
    uniform_prefix_average(y), jnp.einsum('qk,bkd->bqd', weights, y), rtol=1e-6, atol=1e-6
  )


def test_average_attention_ffn_and_gating_by_hand():
  cfg = tiny_config(activation='relu')
  y = jax.random.normal(jax.random.key(1), (2, 4, cfg.hidden_size))
  module = AverageAttention(cfg, layer=1)
  params = unbox(module.init(jax.random.key(2), y)['params'])
  p = jax.tree.map(np.asarray, params)
  a = np.cumsum(np.asarray(y, np.float64), 1) / np.arange(1, 5)[None, :, None]
  g = (
    np.maximum(a @ p['ffn_in']['kernel'] + p['ffn_in']['bias'], 0) @ p['ffn_out']['kernel']
    + p['ffn_out']['bias']
  )
  gates = (
    np.concatenate([np.asarray(y, np.float64), g], -1) @ p['gates']['kernel'] + p['gates']['bias']
  )
  sigmoid = 1 / (1 + np.exp(-gates))
  expected = sigmoid[..., : cfg.hidden_size] * np.asarray(y) + sigmoid[..., cfg.hidden_size :] * g
  np.testing.assert_allclose(module.apply({'params': params}, y), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
  'overrides',
  [
    # Each decoder kind, with every option that changes what a decoder layer computes.
    dict(
      decoder_attention='standard',
      ln_placement='realformer',
      running_mean=True,
      attention_scale='entropy_invariant',
      entropy_base_len=4,
      position_embedding='rope',
      norm='rmsnorm',
      use_bias=False,
    ),
    dict(decoder_attention='aan', ln_placement='pre', residual_branch='rezero'),
    dict(
      decoder_attention='merged', init='ds_init', residual_branch='skipinit', attention_scale='t5'
    ),
  ],
)
def test_incremental_decoding_equals_teacher_forcing(overrides):
  """Logits of one-token steps through the cache equal the teacher-forced forward pass to
  2e-5 (float32, 'highest' matmul precision)."""
  cfg = seq2seq_config(**overrides)
  model = Seq2Seq(cfg)
  source, mask, target = _batch(cfg.vocab_size)
  params = _init(model, source, mask, target)
  if cfg.residual_branch != 'plain':  # gates start at 0: move them so the branches count
    params = jax.tree_util.tree_map_with_path(
      lambda path, p: p + 0.5 if path[-1].key.endswith('_gate') else p, params
    )
  full = jax.jit(model.apply)({'params': params}, source, mask, target)  # [B, T, V]
  encoded = jax.jit(functools.partial(model.apply, method='encode'))(
    {'params': params}, source, mask
  )
  cache = jax.jit(lambda p, e, m: decoding.init_cache(model, p, e, m, max_len=cfg.max_len))(
    params, encoded, mask
  )
  step = jax.jit(functools.partial(decoding.decode_step, model))
  for t in range(target.shape[1]):
    log_probs, cache = step(params, cache, target[:, t], encoded, mask)
    expected = jax.nn.log_softmax(full[:, t].at[:, 0].set(-1e30))  # [PAD] is never decoded
    np.testing.assert_allclose(
      log_probs[:, 1:], expected[:, 1:], rtol=2e-5, atol=2e-5, err_msg=f'step {t}'
    )


def test_fixed_schedule_residual_branch_is_refused():
  model = Seq2Seq(seq2seq_config(residual_branch='fixed_schedule'))
  source, mask, target = _batch(50)
  with pytest.raises(ConfigError, match="model.residual_branch='fixed_schedule'"):
    model.init(jax.random.key(0), source, mask, target)


@pytest.mark.slow
def test_ds_init_scales_each_decoder_layer_by_its_depth():
  cfg = seq2seq_config(init='ds_init', num_decoder_layers=4, hidden_size=64, mlp_dim=128)
  source, mask, target = _batch(cfg.vocab_size)
  params = _init(Seq2Seq(cfg), source, mask, target)
  for layer in range(4):
    kernel = np.asarray(params['decoder'][f'layers_{layer}']['mlp']['wi']['kernel'])
    bound = (6.0 / (64 + 128)) ** 0.5 / np.sqrt(layer + 1)
    assert np.abs(kernel).max() <= bound
    assert np.abs(kernel).max() > 0.95 * bound  # uniform on the whole interval


def _layer_norm(x, scale, bias, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


@pytest.mark.slow  # ~9 s CPU: three Seq2Seq compiles; the AAN sublayer by hand stays fast
def test_merged_attention_layer_against_a_float64_reference():
  cfg = seq2seq_config(decoder_attention='merged', num_decoder_layers=1, norm_epsilon=1e-6)
  model = Seq2Seq(cfg)
  source, mask, target = _batch(cfg.vocab_size)
  params = _init(model, source, mask, target)
  # Perturbed away from init in NumPy: an eager jax.random call per leaf shape compiles ~40 tiny
  # programs (most of this test's time).
  rng = np.random.default_rng(3)
  params = jax.tree.map(
    lambda p: np.asarray(p) + np.float32(0.1) * rng.standard_normal(p.shape, np.float32), params
  )
  encoded = jax.jit(functools.partial(model.apply, method='encode'))(
    {'params': params}, source, mask
  )
  # The decoder's layer input: the embedding sum through its norm (checked separately by the
  # end-to-end logits below).
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params['decoder'])
  x = p['word']['embedding'][np.asarray(target)] + p['position']['embedding'][None, :6]
  x = _layer_norm(x, p['embedding_norm']['scale'], p['embedding_norm']['bias'], 1e-6)
  h = np.asarray(encoded, np.float64)
  layer = p['layers_0']
  att = layer['merged_attention']
  proj = lambda z, w: np.einsum('btd,dhk->bthk', z, w['kernel']) + w['bias']
  q, k_src, v_src, v_own = (
    proj(x, att['query']),
    proj(h, att['key']),
    proj(h, att['value']),
    proj(x, att['value']),
  )
  scores = np.einsum('bqhk,bvhk->bhqv', q, k_src) / np.sqrt(cfg.head_dim)
  scores = scores + np.where(np.asarray(mask)[:, None, None, :] > 0, 0.0, -1e9)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  context = np.einsum('bhqv,bvhk->bqhk', weights, v_src)
  context += np.cumsum(v_own, 1) / np.arange(1, 7)[None, :, None, None]  # prefix average
  matt = np.einsum('bqhk,hkd->bqd', context, att['out']['kernel']) + att['out']['bias']
  y = _layer_norm(
    x + matt, layer['merged_attention_norm']['scale'], layer['merged_attention_norm']['bias'], 1e-6
  )
  mlp = layer['mlp']
  erf = np.frompyfunc(math.erf, 1, 1)
  gelu = lambda z: 0.5 * z * (1 + erf(z / np.sqrt(2)).astype(np.float64))
  ffn = gelu(y @ mlp['wi']['kernel'] + mlp['wi']['bias']) @ mlp['wo']['kernel'] + mlp['wo']['bias']
  y = _layer_norm(y + ffn, layer['mlp_norm']['scale'], layer['mlp_norm']['bias'], 1e-6)
  expected = y @ p['word']['embedding'].T + p['output_bias']
  logits = jax.jit(model.apply)({'params': params}, source, mask, target)
  np.testing.assert_allclose(logits, expected, rtol=2e-4, atol=2e-4)  # float32 vs float64


def _all_finished_sequences(vocab, max_len, eos_id, banned=(0,)):
  """Every sequence of up to max_len tokens ending in EOS (no EOS or banned token before)."""
  regular = [t for t in range(vocab) if t != eos_id and t not in banned]
  found = [[eos_id]]
  prefixes = [[]]
  for _ in range(max_len - 1):
    prefixes = [p + [t] for p in prefixes for t in regular]
    found += [p + [eos_id] for p in prefixes]
  return np.asarray([f + [0] * (max_len - len(f)) for f in found], np.int32)


@pytest.mark.parametrize('kind, alpha', [('standard', 0.0), ('merged', 0.6)])
@pytest.mark.slow
def test_beam_search_finds_the_exhaustive_best_and_beam_one_is_greedy(kind, alpha):
  cfg = seq2seq_config(decoder_attention=kind, vocab_size=9)
  model = Seq2Seq(cfg)
  source, mask, _ = _batch(cfg.vocab_size)
  params = _init(model, source, mask, source, seed=1)
  params = jax.tree.map(lambda p: 3.0 * p, params)  # peakier distributions
  bos, eos, max_len = 2, 3, 3
  apply = jax.jit(model.apply)

  def log_prob(tokens_BxT):  # the model's log-probability of each whole sequence
    target_in = jnp.concatenate([jnp.full((tokens_BxT.shape[0], 1), bos), tokens_BxT[:, :-1]], 1)
    rows = tokens_BxT.shape[0] // source.shape[0]
    logits = apply(
      {'params': params}, jnp.repeat(source, rows, 0), jnp.repeat(mask, rows, 0), target_in
    )
    lp = jax.nn.log_softmax(logits.at[..., 0].set(-1e30))  # [PAD] is never decoded
    picked = jnp.take_along_axis(lp, tokens_BxT[..., None], -1)[..., 0]
    return jnp.sum(jnp.where(tokens_BxT != 0, picked, 0.0), -1)

  # Exhaustive: every finished sequence of up to 3 tokens, penalised as beam search does.
  candidates = _all_finished_sequences(cfg.vocab_size, max_len, eos)
  n = len(candidates)
  tiled = jnp.asarray(np.concatenate([candidates] * source.shape[0]))  # [B * n, T] by source
  scores = np.asarray(log_prob(tiled)).reshape(source.shape[0], n)
  lengths = (candidates != 0).sum(-1)
  penalised = scores / decoding.length_penalty(jnp.asarray(lengths), alpha)
  best = candidates[np.argmax(penalised, axis=1)]

  # A beam as wide as every prefix (7 * 7 alive after two steps, 8 extensions each): nothing
  # is pruned, so the result must be the exhaustive optimum.
  beam, beam_scores = decoding.beam_search(
    model,
    params,
    source,
    mask,
    beam_size=7 * 7 * 8,
    max_len=max_len,
    bos_id=bos,
    eos_id=eos,
    alpha=alpha,
  )
  np.testing.assert_array_equal(beam, best)
  np.testing.assert_allclose(beam_scores, np.max(penalised, axis=1), rtol=1e-5)

  # Greedy follows the argmax path: each of its tokens is the most likely next token.
  greedy, greedy_lengths = decoding.greedy_search(
    model, params, source, mask, max_len=4, bos_id=bos, eos_id=eos
  )
  target_in = jnp.concatenate([jnp.full((source.shape[0], 1), bos), greedy[:, :-1]], 1)
  logits = apply({'params': params}, source, mask, target_in)
  argmax = np.asarray(jnp.argmax(logits.at[..., 0].set(-1e30), -1))
  real = np.asarray(greedy) != 0
  np.testing.assert_array_equal(np.asarray(greedy)[real], argmax[real])
  assert np.all(np.asarray(greedy_lengths) == real.sum(-1))
  if alpha == 0.0:  # without a length penalty, a beam of one is greedy search
    beam_one, _ = decoding.beam_search(
      model, params, source, mask, beam_size=1, max_len=4, bos_id=bos, eos_id=eos, alpha=0.0
    )
    np.testing.assert_array_equal(beam_one, greedy)

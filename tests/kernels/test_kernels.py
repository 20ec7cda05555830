"""Fused attention kernels (realformer_jax/kernels) against the einsum path.

The GPU (Triton) and TPU (Mosaic) kernels run in Pallas interpret mode on CPU: forward values
and gradients (qkv, carried sum) against attention.py's einsum path with the same dropout mask
(the kernels regenerate `dropout_bits.keep_mask`'s stream tile by tile), float32 tight, with
padding, per-sequence and running-mean scales, several tiles per row and column. Float32
matmuls (tests/conftest.py). Tiny shapes: interpret mode runs every grid step as XLA ops.
"""

import dataclasses
import functools
import itertools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_platform import attention_platform, blocks, interpret, rtol
from model_fixtures import kernel_config

from realformer_jax import Encoder, ModelConfig, ResidualSelfAttention, kernels
from realformer_jax.config import ConfigError
from realformer_jax.kernels.backends.cudnn.attention import cudnn_attention
from realformer_jax.kernels.backends.triton import attention as triton_attention
from realformer_jax.kernels.dropout import dropout_tiles
from realformer_jax.kernels.dropout.dropout_bits import (
  GENERATORS,
  keep_mask,
  keep_threshold,
  mulhi_limbs,
  mulhi_xla,
)
from realformer_jax.kernels.plumbing import fused
from realformer_jax.model.softmax_attention import softmax_dropout_values

B, L, H, K = 2, 32, 2, 16
KEEP = 0.8


def _inputs(dtype=jnp.float32, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  qkv = jax.random.normal(keys[0], (B, L, 3, H, K), jnp.float32).astype(dtype)
  acc = jax.random.normal(keys[1], (B, H, L, L), jnp.float32)
  mask = jnp.ones((B, L), jnp.int32).at[1, 21:].set(0)  # one padded sequence
  bias = jnp.where(mask > 0, 0.0, -1e9).astype(jnp.float32)
  scale = jnp.array([0.25, 0.3], jnp.float32)  # per sequence, as entropy_invariant gives
  return qkv, acc, bias, scale


def _reference(qkv, acc, bias, scale, inv_div, key, carry, dtype, generator='threefry'):
  """attention.py's einsum path: (context, carried sum)."""
  q, k, v = (qkv[:, :, part] for part in range(3))
  s = jnp.einsum('bqhk,bvhk->bhqv', q, k, preferred_element_type=jnp.float32)
  s = s * scale[:, None, None, None]
  if carry:
    s = acc + s
  context, _ = softmax_dropout_values(
    s, bias[:, None, None, :], jnp.float32(1 / inv_div), v, key, KEEP, dtype, generator
  )
  return context, s


def _params(scale, inv_div, key):
  """The kernels' (fparams [B, 2] float32, iparams [4] uint32) for a per-sequence `scale`."""
  fparams = jnp.stack([scale, jnp.full((B,), inv_div, jnp.float32)], -1)
  words = jnp.zeros((2,), jnp.uint32) if key is None else jax.random.bits(key, (2,), jnp.uint32)
  return fparams, jnp.concatenate([words, jnp.zeros((2,), jnp.uint32)])


def _fused(qkv, acc, bias, scale, inv_div, key, carry, spec):
  fparams, iparams = _params(scale, inv_div, key)
  return kernels.fused_attention(qkv, acc if carry else None, bias, fparams, iparams, spec)


def _values_and_grads(fn, qkv, acc, carry):
  weights = jnp.cos(jnp.arange(B * L * H * K, dtype=jnp.float32)).reshape(B, L, H, K)

  def loss(qkv, acc):
    context, scores = fn(qkv, acc)
    total = jnp.sum(context.astype(jnp.float32) * weights)
    if carry:  # a gradient arriving through the carried sum too
      total = total + 0.1 * jnp.sum(jnp.sin(scores))
    return total, (context, scores)

  # One jitted program: eagerly, the forward and backward kernels and the loss compile apart.
  (_, outputs), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(qkv, acc)
  return outputs, grads


def _kernel_and_einsum(spec, inputs, inv_div, key, carry, dtype=jnp.float32):
  """((context, scores), grads) of the kernel and of the einsum path on the same inputs (the
  einsum path's dropout drawn by the spec's generator)."""
  qkv, acc, bias, scale = inputs
  fused = lambda x, a: _fused(x, a, bias, scale, inv_div, key, carry, spec)
  einsum = lambda x, a: _reference(x, a, bias, scale, inv_div, key, carry, dtype, spec.generator)
  return _values_and_grads(fused, qkv, acc, carry), _values_and_grads(einsum, qkv, acc, carry)


def _assert_kernel_matches(kernel, einsum, tolerance, carry):
  """The context and the gradients (of qkv; of the carried sum where there is one)."""
  ((out, _), grads), ((ref_out, _), ref_grads) = kernel, einsum
  _assert_close(out, ref_out, tolerance)
  _assert_close(grads[0], ref_grads[0], tolerance)
  if carry:
    _assert_close(grads[1], ref_grads[1], tolerance)


def _spec(backend, carry, dropout, generator='threefry', for_remat=False, **tiles):
  sizes = (
    dict(block_q=16, block_k=16, block_bwd=16)
    if backend == 'triton'
    else dict(block_q=8, block_k=16, block_bwd=16)
  )
  sizes.update(tiles)
  return kernels.KernelSpec(
    backend,
    carry_in=carry,
    carry_out=carry,
    keep_threshold=keep_threshold(KEEP) if dropout else 0,
    heads_total=H,
    interpret=interpret(backend),
    generator=generator,
    for_remat=for_remat,
    **blocks(backend, L, sizes),
  )


def _assert_close(actual, expected, tolerance, atol=0.0):
  actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
  scale = np.max(np.abs(expected))
  tol = rtol(tolerance)  # the platform's when compiled (tests/kernel_platform.py)
  np.testing.assert_allclose(actual, expected, rtol=tol, atol=atol + tol * scale)


# Each backend and each feature set once in the fast tier; the other two pairings are slow.
@pytest.mark.parametrize(
  'backend,carry,dropout,inv_div',
  [
    ('triton', False, True, 1.0),
    ('mosaic', True, False, 1 / 3),
    pytest.param('mosaic', False, True, 1.0, marks=pytest.mark.slow),
    pytest.param('triton', True, False, 1 / 3, marks=pytest.mark.slow),
  ],
)
def test_kernel_equals_einsum_path_float32(backend, carry, dropout, inv_div):
  key = jax.random.key(7) if dropout else None
  spec = _spec(backend, carry, dropout)
  kernel, einsum = _kernel_and_einsum(spec, _inputs(), inv_div, key, carry)
  _assert_kernel_matches(kernel, einsum, 1e-5, carry)
  if carry:  # the carried sum itself
    _assert_close(kernel[0][1], einsum[0][1], 1e-6)


# Philox dropout (model.dropout_generator='philox') through every kernel: the einsum path's
# bits (Triton's joined tiles, Mosaic's selected tiles with limb multiplies), padding and a
# per-sequence scale as above. for_remat: the forward stores no mask and the backward draws
# it (Post-LN under a remat policy).
@pytest.mark.parametrize(
  'backend,carry,for_remat',
  [
    ('triton', False, True),
    pytest.param('triton', False, False, marks=pytest.mark.slow),
    pytest.param('triton', True, False, marks=pytest.mark.slow),
    pytest.param('mosaic', False, False, marks=pytest.mark.slow),
    pytest.param('mosaic', True, False, marks=pytest.mark.slow),
  ],
)
def test_philox_dropout_kernels_equal_einsum_path_float32(backend, carry, for_remat):
  spec = _spec(backend, carry, True, generator='philox', for_remat=for_remat)
  kernel, einsum = _kernel_and_einsum(spec, _inputs(), 1.0, jax.random.key(9), carry)
  _assert_kernel_matches(kernel, einsum, 1e-5, carry)


# Plain attention's Triton backward on tiles that are not square (tiles.py's bwd_keys x
# bwd_rows): programs own 32 keys and step 16 query rows (dK / dV) or 16 keys (dQ), and the
# other way round; the mask is read in 16-bit words either way.
@pytest.mark.parametrize('keys,rows', [(32, 16), pytest.param(16, 32, marks=pytest.mark.slow)])
def test_triton_backward_on_tiles_that_are_not_square_float32(keys, rows):
  if not interpret('triton'):
    pytest.skip('the toy tiles are for interpret mode; compiled, the device check covers it')
  spec = _spec('triton', False, True, block_bwd=keys, block_bwd_rows=rows)
  kernel, einsum = _kernel_and_einsum(spec, _inputs(), 1.0, jax.random.key(5), False)
  _assert_kernel_matches(kernel, einsum, 1e-5, False)


# The carried backward as the layer stack calls it (score_paths/carried.py): carries in and
# out, acc_{l-1} rebuilt, threefry dropout, a padded sequence; dQ read back from g_{l-1} by
# `query_gradient` (no atomic update left) or added atomically, whichever the estimate picks.
@pytest.mark.parametrize('path', ['read_back', pytest.param('atomic', marks=pytest.mark.slow)])
def test_triton_carried_backward_either_dq_path_equals_einsum_path_float32(path):
  spec = _spec('triton', True, True)
  qkv, acc, bias, scale = _inputs()
  key, inv_div = jax.random.key(4), 1 / 3
  fparams, iparams = _params(scale, inv_div, key)
  g_out = jnp.cos(jnp.arange(B * L * H * K, dtype=jnp.float32)).reshape(B, L, H, K)
  g_acc = 0.1 * jnp.sin(jnp.arange(B * H * L * L, dtype=jnp.float32)).reshape(B, H, L, L)

  def kernel(qkv, acc):
    out, lse, acc_out, bits = fused.kernel_forward(qkv, acc, bias, fparams, iparams, spec)
    grads = fused.attention_backward(
      qkv, acc_out, g_acc, bias, fparams, iparams, out, lse, bits, g_out, spec, rebuild=True
    )
    return out, acc_out, grads

  def einsum(qkv, acc):
    outputs, vjp = jax.vjp(
      lambda x, a: _reference(x, a, bias, scale, inv_div, key, True, jnp.float32), qkv, acc
    )
    return outputs, vjp((g_out, g_acc))

  with triton_attention.dq_path(path):
    out, acc_out, (dqkv, g_acc_in, acc_in) = jax.jit(kernel)(qkv, acc)
    jaxpr = str(jax.make_jaxpr(kernel)(qkv, acc))
  (ref_out, ref_acc), (ref_dqkv, ref_g_acc_in) = jax.jit(einsum)(qkv, acc)
  _assert_close(out, ref_out, 1e-5)
  _assert_close(acc_out, ref_acc, 1e-6)
  for part in range(3):  # dQ, dK, dV each against its own scale
    _assert_close(dqkv[:, :, part], ref_dqkv[:, :, part], 1e-5)
  _assert_close(g_acc_in, ref_g_acc_in, 1e-5)
  _assert_close(acc_in, acc, 1e-6)  # acc_{l-1} = acc_l - s
  read_back = path == 'read_back'
  assert ('realformer_attention_dq' in jaxpr) == read_back
  assert ('atomic_rmw' in jaxpr) == (not read_back)


@pytest.mark.parametrize('backend', ['triton', pytest.param('mosaic', marks=pytest.mark.slow)])
def test_kernel_bfloat16_within_stated_tolerance(backend):
  # bfloat16 q, k, v: the kernels round exp(z - m) to bfloat16 before P V and normalise
  # after; the einsum path rounds the normalised p. Stated tolerance: 2e-2 of the largest
  # value, outputs and gradients (measured: ~4e-3).
  spec = _spec(backend, True, True)
  inputs = _inputs(jnp.bfloat16)
  kernel, einsum = _kernel_and_einsum(spec, inputs, 1.0, jax.random.key(3), True, jnp.bfloat16)
  _assert_kernel_matches(kernel, einsum, 2e-2, True)


@pytest.mark.parametrize('generator', GENERATORS)
def test_dropout_tiles_reproduce_keep_mask(generator):
  # Both layouts, and philox with either form of a multiply's high word (XLA's mulhi: the
  # einsum path and interpret mode; 16-bit limbs: the Mosaic kernels), give keep_mask's bits.
  key = jax.random.key(11)
  k1, k2 = jax.random.bits(key, (2,), jnp.uint32)
  full = keep_mask(key, 0.9, (6, 64), generator)  # rows: flattened leading axes, as [B, H, L, L]
  threshold = keep_threshold(0.9)
  forms = (mulhi_xla, mulhi_limbs) if generator == 'philox' else (mulhi_xla,)
  for tile, mulhi in itertools.product(
    (dropout_tiles.keep_tile_joined, dropout_tiles.keep_tile_selected), forms
  ):
    # Jitted once per tile function (the offsets are traced): eagerly, every op compiles apart.
    tile = jax.jit(functools.partial(tile, generator=generator, mulhi=mulhi), static_argnums=(4, 5))
    for row0, col0 in ((0, 0), (2, 16), (4, 48)):
      got = tile(k1, k2, jnp.uint32(row0), jnp.uint32(col0), (2, 16), threshold)
      np.testing.assert_array_equal(got, full[row0 : row0 + 2, col0 : col0 + 16])
  for width in (16, 32):  # the GPU forward stores the mask at one bit per element
    packed = dropout_tiles.pack_bits(full, width)
    assert packed.shape == (6, 64 // width) and packed.dtype == jnp.uint32
    np.testing.assert_array_equal(dropout_tiles.unpack_bits(packed, width), full)


# --- The model: every path of Encoder with kernels equals attention_impl='xla' -------------


def _encoder_loss_and_grads(cfg, params, ids, mask):
  def loss(p):
    h = Encoder(cfg).apply(p, ids, mask, deterministic=False, rngs={'dropout': jax.random.key(5)})
    return jnp.sum(jnp.sin(h) * jnp.linspace(-1, 1, h.shape[-1]))

  return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize(
  'impl,overrides',
  [
    # (sum, shadow) carried through nn.scan, sealed at the top (kernels/score_paths/carried.py)
    ('pallas_triton', dict(running_mean=True, attention_scale='entropy_invariant')),
    # the same through the Python loop, RoPE's q and k stacked back into qkv
    ('pallas_mosaic', dict(scan_layers=False, position_embedding='rope', attention_scale='t5')),
    # the recomputed stack: layers re-run top-down from their sums (recomputed_stack.py)
    ('pallas_triton', dict(residual_scores_backward='recomputed')),
  ],
)
@pytest.mark.slow
def test_encoder_with_kernels_equals_einsum_path(impl, overrides):
  cfg = kernel_config(L, **{'dropout_rate': 0.1, 'attention_dropout_rate': 0.2, **overrides})
  ids = jax.random.randint(jax.random.key(1), (B, L), 1, 50)
  mask = jnp.ones((B, L), jnp.int32).at[1, 21:].set(0)
  params = Encoder(cfg).init(jax.random.key(0), ids, mask)
  loss, grads = _encoder_loss_and_grads(cfg.replace(attention_impl='xla'), params, ids, mask)
  backend = impl.split('_')[1]
  fused_loss, fused_grads = _encoder_loss_and_grads(
    cfg.replace(attention_impl=impl, attention_platform=attention_platform(backend)),
    params,
    ids,
    mask,
  )
  np.testing.assert_allclose(fused_loss, loss, rtol=rtol(1e-5))
  jax.tree.map(lambda a, b: _assert_close(a, b, 1e-5), fused_grads, grads)


@pytest.mark.slow
def test_the_dropout_generator_reaches_every_mask_of_the_encoder():
  # model.dropout_generator='philox' on the einsum path (hidden and attention dropout) and
  # through the kernels (Post-LN under remat: the forward stores no mask, the backward draws
  # it) gives the same loss and gradients; threefry's masks give another loss.
  cfg = kernel_config(
    L,
    dropout_rate=0.1,
    attention_dropout_rate=0.2,
    ln_placement='post',
    remat_policy='full',
    dropout_generator='philox',
  )
  ids = jax.random.randint(jax.random.key(1), (B, L), 1, 50)
  mask = jnp.ones((B, L), jnp.int32).at[1, 21:].set(0)
  params = Encoder(cfg).init(jax.random.key(0), ids, mask)
  run = lambda c: jax.jit(lambda p: _encoder_loss_and_grads(c, p, ids, mask))(params)
  loss, grads = run(cfg.replace(attention_impl='xla'))
  fused_loss, fused_grads = run(
    cfg.replace(attention_impl='pallas_triton', attention_platform=attention_platform('triton'))
  )
  np.testing.assert_allclose(fused_loss, loss, rtol=rtol(1e-5))
  jax.tree.map(lambda a, b: _assert_close(a, b, 1e-5), fused_grads, grads)
  threefry_loss, _ = run(cfg.replace(attention_impl='xla', dropout_generator='threefry'))
  assert abs(float(threefry_loss) - float(loss)) > 1e-3 * abs(float(loss))


def test_a_backend_without_the_generator_refuses_it_in_one_line():
  # A backend's record lists the generators its kernels draw (Triton and Mosaic: both); a
  # backend that draws only threefry never draws it in philox's place.
  threefry_only = dataclasses.replace(
    kernels.backends.get('triton'), dropout_generators=('threefry',)
  )
  config = ModelConfig(dropout_generator='philox', attention_impl='pallas_triton')
  with pytest.raises(ConfigError, match="model.dropout_generator='philox': the triton backend"):
    kernels.plumbing.select._check_support(config, threefry_only, 'scores')
  kernels.plumbing.select._check_support(
    config.replace(attention_dropout_rate=0.0), threefry_only, 'scores'
  )
  for name in ('triton', 'mosaic'):
    assert kernels.backends.get(name).dropout_generators == GENERATORS


def test_sown_attention_maps_take_the_einsum_path():
  cfg = kernel_config(L, attention_impl='pallas')
  ids = jnp.ones((1, L), jnp.int32)
  # Jitted: an eager Encoder init / apply compiles every primitive apart.
  params = jax.jit(Encoder(cfg.replace(attention_impl='xla')).init)(jax.random.key(0), ids)
  _, state = jax.jit(lambda p: Encoder(cfg).apply(p, ids, mutable=['intermediates']))(params)
  probs = state['intermediates']['layers']['attention']['attention_probs'][0]
  assert probs.shape == (2, 1, 2, L, L)
  np.testing.assert_allclose(np.sum(probs, -1), 1.0, rtol=1e-6)


# --- Which path a config takes ------------------------------------------------------------


def _devices(platform):
  return [types.SimpleNamespace(platform=platform)]


def test_auto_follows_the_platform_of_the_devices_not_the_host():
  cfg = ModelConfig()
  assert kernels.plan(kernels.resolve_platform(cfg, _devices('cpu')), 512) is None
  gpu = kernels.plan(kernels.resolve_platform(cfg, _devices('cuda')), 512)
  assert (gpu.path, gpu.backend, gpu.interpret) == ('pallas', 'triton', False)
  tpu = kernels.plan(kernels.resolve_platform(cfg, _devices('tpu')), 512)
  assert (tpu.path, tpu.backend, tpu.interpret) == ('pallas', 'mosaic', False)
  # A length the kernels cannot tile: 'auto' falls back, an explicit kernel says why.
  gpu_cfg = cfg.replace(attention_platform='gpu')
  assert kernels.plan(gpu_cfg, 100) is None
  with pytest.raises(ConfigError, match="attention_impl='pallas': sequence length 100"):
    kernels.plan(gpu_cfg.replace(attention_impl='pallas'), 100)
  cpu = cfg.replace(attention_impl='pallas', attention_platform='cpu')
  assert kernels.plan(cpu, 32).interpret  # CPU: interpret


@pytest.mark.parametrize(
  'overrides,message',
  [
    (dict(attention_impl='cudnn', ln_placement='realformer'), 'cannot carry residual scores'),
    (dict(attention_impl='cudnn'), 'no attention dropout'),
    (dict(attention_impl='flash'), "attention_impl='flash': must be one of auto, xla, pallas, "),
  ],
)
def test_the_backend_record_refuses_what_a_kernel_cannot_do(overrides, message):
  # The named backend's record (kernels/backends/) says what it supports: checked by the train
  # setup before any data is built (validate_config) and whenever the model is traced (plan).
  cfg = ModelConfig(**overrides)
  with pytest.raises(ConfigError, match=message):
    kernels.plumbing.select.check(cfg)
  with pytest.raises(ConfigError, match=message):
    kernels.plan(cfg.replace(attention_platform='gpu'), 512)


@pytest.mark.parametrize(
  'overrides,message',
  [
    (dict(attention_impl='flash attention'), "attention_impl='flash attention': must be one of"),
    (dict(attention_platform='npu'), "attention_platform='npu'"),
  ],
)
def test_config_refuses_a_value_of_the_wrong_form(overrides, message):
  with pytest.raises(ConfigError, match=message):
    ModelConfig(**overrides)


def test_kernel_on_the_wrong_platform_is_refused_before_tracing():
  cfg = ModelConfig(attention_platform='tpu', attention_impl='pallas_triton')
  with pytest.raises(ConfigError, match='triton kernels do not run on tpu'):
    kernels.plan(cfg, 512)
  with pytest.raises(ConfigError, match="'cudnn': needs a GPU"):
    kernels.plan(dataclasses.replace(cfg, attention_impl='cudnn', attention_dropout_rate=0.0), 512)


def test_cudnn_wrapper_arithmetic_through_jax_xla_implementation():
  # The cuDNN custom call needs a GPU; its wrapper (scale folded into q, additive bias) is
  # checked through the same jax call with implementation='xla'.
  qkv, _, bias, scale = _inputs()
  q, k, v = (qkv[:, :, part] for part in range(3))
  got = jax.jit(functools.partial(cudnn_attention, implementation='xla'))(
    q, k, v, bias[:, None, None, :], scale
  )
  want, _ = jax.jit(_reference, static_argnums=(4, 5, 6, 7))(
    qkv, None, bias, scale, 1.0, None, False, jnp.float32
  )
  _assert_close(got, want, 1e-5)


def test_a_run_resumes_with_another_attention_implementation(tmp_path):
  from realformer_jax.train import default_config, resume_checks  # pylint: disable=import-outside-toplevel

  saved = default_config()
  saved.model.attention_impl = 'xla'
  (tmp_path / 'config.json').write_text(saved.to_json_best_effort())
  resumed = default_config()
  resumed.model.attention_impl = 'pallas'
  resumed.model.attention_platform = 'gpu'
  model = ModelConfig.from_mapping(resumed.model)
  resume_checks.check_resumable(model, str(tmp_path), latest_step=2)  # same model: no error
  with pytest.raises(ConfigError, match='model.num_layers=13'):
    resume_checks.check_resumable(model.replace(num_layers=13), str(tmp_path), latest_step=2)


# --- Cases the kernels once answered wrong: now correct, or refused in one line -----------


@pytest.mark.parametrize(
  'backend,carry', [('triton', False), pytest.param('mosaic', True, marks=pytest.mark.slow)]
)
def test_all_padding_sequence_gets_the_einsum_path_gradients(backend, carry):
  # Every key of sequence 1 is padding, and its outputs carry loss weight: p is 1 / L in each
  # row. The backward must not lose log l against the row max m ~ -1e9 (tile_math.py).
  qkv, acc, _, scale = _inputs()
  bias = jnp.zeros((B, L), jnp.float32).at[1].set(-1e9)
  spec = _spec(backend, carry, False)
  kernel, einsum = _kernel_and_einsum(spec, (qkv, acc, bias, scale), 1.0, None, carry)
  _assert_kernel_matches(kernel, einsum, 1e-5, carry)


def _tiny_encoder(**overrides):
  cfg = kernel_config(16, **{'attention_impl': 'pallas_triton', **overrides})
  ids = jnp.ones((1, 16), jnp.int32)
  # Shapes only: these tests trace (eval_shape), they never run the model.
  params = jax.eval_shape(Encoder(cfg.replace(attention_impl='xla')).init, jax.random.key(0), ids)
  return cfg, params, ids


@pytest.mark.parametrize(
  'overrides',
  [
    dict(),
    pytest.param(dict(ln_placement='post'), marks=pytest.mark.slow),
    pytest.param(dict(residual_scores_backward='recomputed'), marks=pytest.mark.slow),
  ],
)
def test_grad_of_grad_on_the_kernels_is_refused_in_one_line(overrides):
  cfg, params, ids = _tiny_encoder(**overrides)

  def loss(p):
    return jnp.sum(jnp.square(Encoder(cfg).apply(p, ids)))

  def grad_norm(p):
    return sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(jax.grad(loss)(p)))

  jax.eval_shape(jax.grad(loss), params)  # first order: fine
  with pytest.raises(ConfigError, match=r"higher-order derivatives .* attention_impl='xla'"):
    jax.eval_shape(jax.grad(grad_norm), params)


@pytest.mark.parametrize('impl', ['xla', 'pallas_triton'])
def test_gradient_for_attention_scale_or_bias_is_given_or_refused(impl):
  # The kernels cannot differentiate the score scale or the additive bias (the model derives
  # both from the padding mask); a gradient asked of them is refused, the einsum path gives it.
  cfg = ModelConfig(
    hidden_size=32, num_heads=2, mlp_dim=48, ln_placement='realformer', attention_impl=impl
  )
  x = jax.random.normal(jax.random.key(0), (1, 16, 32))
  bias = jnp.zeros((1, 1, 1, 16), jnp.float32)
  attention = ResidualSelfAttention(cfg)
  # Jitted: eager dispatch of the layer compiles every primitive apart.
  variables = jax.jit(attention.init)(
    jax.random.key(1), x, bias, jnp.float32(0.2), None, jnp.asarray(0)
  )

  def loss(scale, bias):
    out, _ = attention.apply(variables, x, bias, scale, None, jnp.asarray(0))
    return jnp.sum(jnp.sin(out))

  if impl == 'xla':
    d_scale, d_bias = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.float32(0.2), bias)
    assert float(jnp.abs(d_scale)) > 0 and float(jnp.max(jnp.abs(d_bias))) > 0
    return
  for argnum in (0, 1):
    with pytest.raises(ConfigError, match='no gradient for the attention bias or score scale'):
      jax.eval_shape(jax.grad(loss, argnums=argnum), jnp.float32(0.2), bias)


def test_a_pair_carry_cannot_be_left_unsealed():
  # The (sum, shadow) pair's VJP is right only under a seal at the top of the stack. Only
  # SealedPairPath.run_stack makes the pair, and it seals it: the package exports no way to
  # make one, and the path's layer refuses any other carry instead of computing with it.
  for name in ('initial_carry', 'seal', 'CarriedScores', 'TopDown', 'pair_carry'):
    assert not hasattr(kernels, name)
  cfg, _, ids = _tiny_encoder()
  path = kernels.stack_path(cfg, 16, einsum=None)
  assert type(path).__name__ == 'SealedPairPath'
  qkv = jnp.zeros((1, 16, 3, 2, 16))
  bias = jnp.zeros((1, 1, 1, 16))
  for carried in (None, jnp.zeros((1, 2, 16, 16))):
    with pytest.raises(TypeError, match='must come from its run_stack'):
      path.attend(qkv, carried, bias, jnp.float32(0.25), None, None, 1.0, None)

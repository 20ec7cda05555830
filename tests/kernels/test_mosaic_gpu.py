"""The Hopper kernels (realformer_jax/kernels/backends/mosaic_gpu/, Pallas Mosaic GPU): the same
numbers as the einsum path in Mosaic GPU's interpret mode (bfloat16: the kernels take 16-bit
operands; dropout, padding and a per-sequence scale), lowered and compiled for sm_90a without a
device, and taken by 'auto' only where a device check passed on that device kind. Matmuls of
the references at 'highest' (tests/conftest.py)."""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax import kernels
from realformer_jax.analysis import device_checks
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels.dropout.dropout_bits import keep_threshold
from realformer_jax.kernels.plumbing import select
from realformer_jax.kernels.plumbing.select import AttentionPlan
from realformer_jax.kernels.score_paths import qk_carry, qk_reference
from realformer_jax.model.attention import mask_bias
from realformer_jax.model.softmax_attention import softmax_dropout_values
from tests import scale_out_support as support

B, L, H, K = 2, 128, 2, 64  # two 64-row tiles per row and column: the smallest wgmma tiles
KEEP = 0.8
TOLERANCE = 2e-2  # of the largest value: the kernels' stated bfloat16 tolerance (test_kernels.py)


def _close(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * np.max(np.abs(want)))


def _inputs():
  keys = jax.random.split(jax.random.key(0), 2)
  qkv = jax.random.normal(keys[0], (B, L, 3, H, K), jnp.float32).astype(jnp.bfloat16)
  mask = np.ones((B, L), np.int32)
  mask[1, 90:] = 0  # a padded sequence
  bias = jnp.where(jnp.asarray(mask) > 0, 0.0, -1e9).astype(jnp.float32)
  scale = jnp.array([0.125, 0.2], jnp.float32)  # per sequence (entropy_invariant's kind)
  weights = jnp.cos(jnp.arange(B * L * H * K, dtype=jnp.float32)).reshape(B, L, H, K)
  return qkv, bias, scale, weights


@pytest.mark.slow  # ~10 s: Mosaic GPU's interpreter runs every program of three kernels
def test_post_attention_forward_and_backward_equal_the_einsum_path_in_interpret_mode():
  qkv, bias, scale, weights = _inputs()
  key = jax.random.key(7)
  spec = kernels.KernelSpec(
    'mosaic_gpu', carry_in=False, carry_out=False, keep_threshold=keep_threshold(KEEP),
    heads_total=H, block_q=64, block_k=64, block_bwd=64, interpret=True,
  )  # fmt: skip
  fparams = jnp.stack([scale, jnp.ones((B,), jnp.float32)], -1)
  iparams = jnp.concatenate([jax.random.bits(key, (2,), jnp.uint32), jnp.zeros((2,), jnp.uint32)])

  def kernel(qkv):
    return kernels.fused_attention(qkv, None, bias, fparams, iparams, spec)[0]

  def einsum(qkv):
    q, k, v = (qkv[:, :, part] for part in range(3))
    s = jnp.einsum('bqhk,bvhk->bhqv', q, k, preferred_element_type=jnp.float32)
    s = s * scale[:, None, None, None]
    bias_4d = bias[:, None, None, :]
    return softmax_dropout_values(s, bias_4d, jnp.float32(1.0), v, key, KEEP, jnp.bfloat16)[0]

  @functools.partial(jax.jit, static_argnums=0)
  def value_and_grad(fn, qkv):
    return jax.value_and_grad(lambda x: jnp.sum(fn(x).astype(jnp.float32) * weights))(qkv)

  (_, grads), (_, ref_grads) = value_and_grad(kernel, qkv), value_and_grad(einsum, qkv)
  _close(jax.jit(kernel)(qkv), einsum(qkv))
  for part in range(3):  # dq, dk, dv: each its own kernel's
    _close(grads[:, :, part], ref_grads[:, :, part])


@pytest.mark.slow  # ~15 s: the interpreter, and Triton's backward in interpret mode
def test_qk_forward_equals_the_einsum_identity_and_its_backward_is_tritons():
  layers = 3
  keys = jax.random.split(jax.random.key(1), 3)
  stack = jax.random.normal(keys[0], (2, layers, B, L, H, K)).astype(jnp.bfloat16)
  stack = stack.at[:, 2].set(1e4)  # a slot above the layer: never read
  v = jax.random.normal(keys[1], (B, L, H, K), jnp.bfloat16)
  mask = np.ones((B, L), np.int32)
  mask[0, 100:] = 0
  bias, scale, index, key = mask_bias(jnp.asarray(mask)), jnp.asarray(K**-0.5), 1, keys[2]
  plan = AttentionPlan('pallas', 'mosaic_gpu', True, 64, 64, 64)

  def kernel(stack, v):
    layer = jnp.asarray(index)
    return qk_carry.kernel_attention(plan, stack, v, layer, bias, scale, None, key, 0.8)[0]

  def reference(stack, v):
    acc = qk_reference.summed_scores(stack, jnp.asarray(index + 1), scale, jnp.bfloat16)
    return softmax_dropout_values(acc, bias, None, v, key, 0.8, jnp.bfloat16)[0]

  g = jax.random.normal(jax.random.key(9), v.shape).astype(jnp.bfloat16)

  @functools.partial(jax.jit, static_argnums=0)
  def value_and_vjp(fn, stack, v):
    context, vjp = jax.vjp(fn, stack, v)
    return context, vjp(g)

  (context, cotangents), (ref_context, ref_cotangents) = (
    value_and_vjp(kernel, stack, v),
    value_and_vjp(reference, stack, v),
  )
  _close(context, ref_context)
  _close(cotangents[1], ref_cotangents[1])  # dV
  _close(cotangents[0][:, :2], ref_cotangents[0][:, :2])  # the stack's layers 0 .. l
  assert not np.any(np.asarray(cotangents[0][:, 2], np.float32))  # none for a layer above


@pytest.mark.slow  # ~20 s: deviceless compiles for an H100 in a subprocess
def test_the_hopper_kernels_lower_and_compile_for_sm90a_without_a_device():
  report = support.run_check('mosaic_gpu_compile_check', optimised=True)
  assert report['tiles'] == [64, 128, 64]
  assert report['post'] == [
    'mosaic_gpu_attention_dkv',
    'mosaic_gpu_attention_dq',
    'mosaic_gpu_attention_fwd',
  ]
  assert report['qk_forward'] == ['mosaic_gpu_qk_attention_fwd']


def _gpu(kind='NVIDIA H200'):
  return [types.SimpleNamespace(platform='gpu', device_kind=kind)]


def _preferred(config, devices, seq_len):
  """What the train setup makes of `config` on `devices` (train/build.py make_setup)."""
  return select.for_run(
    config, devices, seq_len, passed=device_checks.passed_backends(devices)
  ).config


def _config(**fields):
  fields = {'dtype': 'bfloat16', **fields}
  return ModelConfig(hidden_size=128, num_heads=2, attention_platform='gpu', **fields)


def test_auto_takes_the_hopper_kernels_only_where_checked_and_measured_faster(
  tmp_path, monkeypatch
):
  monkeypatch.setenv('REALFORMER_JAX_CACHE', str(tmp_path))
  config = _config(ln_placement='post')
  # No record: the platform's default (Triton) for 'auto' and 'pallas'.
  assert _preferred(config, _gpu(), 512) is config
  assert select.plan(config, 512).backend == 'triton'
  # A check with a failed or an interpreted Hopper case records nothing.
  row = {'kernel': 'mosaic_gpu (compiled)', 'passed': True, 'worst_relative_error': 9e-3}
  assert device_checks.record('mosaic_gpu', 'NVIDIA H200', [row, dict(row, passed=False)]) is None
  interpreted = dict(row, kernel='mosaic_gpu (interpret)')
  assert device_checks.record('mosaic_gpu', 'NVIDIA H200', [interpreted]) is None
  assert _preferred(config, _gpu(), 512) is config
  # Every case passed, compiled: still not taken on the pass alone (issue 64: no speed
  # comparison), nor where the device suite measured it slower than Triton; taken once it
  # measured faster on that device kind, not on another. A speed without a pass records nothing.
  assert not device_checks.record_speed('mosaic_gpu', 'NVIDIA H200', 'qk 65,536', 5.0, 6.0)
  other = {**row, 'kernel': 'triton (compiled)', 'passed': False}  # another backend's case
  assert device_checks.record('mosaic_gpu', 'NVIDIA H200', [row, row, other])
  assert _preferred(config, _gpu(), 512) is config
  assert device_checks.record_speed('mosaic_gpu', 'NVIDIA H200', 'qk 65,536', 7.5, 6.0)
  assert _preferred(config, _gpu(), 512) is config
  assert device_checks.record_speed('mosaic_gpu', 'NVIDIA H200', 'qk 65,536', 5.0, 6.0)
  assert 'qk 65,536: 5 s' in device_checks.faster('mosaic_gpu', 'NVIDIA H200')
  taken = _preferred(config, _gpu(), 512)
  assert taken.attention_impl == 'pallas_mosaic_gpu'
  assert select.plan(taken, 512).backend == 'mosaic_gpu'
  assert _preferred(config, _gpu('NVIDIA H100 80GB HBM3'), 512) is config
  # Not for what its kernels do not take: float32, a length not a multiple of 64, the sum.
  float32 = _config(ln_placement='post', dtype='float32')
  assert _preferred(float32, _gpu(), 512).attention_impl == 'auto'
  assert _preferred(config, _gpu(), 544).attention_impl == 'auto'
  carried = _config(ln_placement='realformer', residual_carry='scores')
  assert _preferred(carried, _gpu(), 512).attention_impl == 'auto'
  qk = _config(ln_placement='realformer', residual_carry='qk')
  assert _preferred(qk, _gpu(), 512).attention_impl == 'pallas_mosaic_gpu'
  # An explicit attention_impl is kept as it is.
  explicit = _config(ln_placement='post', attention_impl='pallas_triton')
  assert _preferred(explicit, _gpu(), 512) is explicit


@pytest.mark.parametrize(
  'overrides,message',
  [
    (
      {'dtype': 'float32'},
      "the mosaic_gpu kernels take bfloat16 or float16 (model.dtype='float32')",
    ),  # fmt: skip
    ({'ln_placement': 'realformer', 'residual_carry': 'scores'}, 'cannot carry residual scores'),
  ],
)
def test_an_explicit_hopper_backend_refuses_what_its_record_excludes(overrides, message):
  config = _config(ln_placement='post', attention_impl='pallas_mosaic_gpu').replace(**overrides)
  with pytest.raises(ConfigError, match=message.replace('(', r'\(').replace(')', r'\)')):
    select.plan(config, 512)

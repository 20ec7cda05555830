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
from realformer_jax.aot import hlo_text
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels.backends import mosaic_gpu
from realformer_jax.kernels.backends.mosaic_gpu import costs as mosaic_costs
from realformer_jax.kernels.backends.mosaic_gpu import qk_attention as mosaic_qk
from realformer_jax.kernels.backends.triton import qk_attention as triton_qk
from realformer_jax.kernels.dropout.dropout_bits import keep_threshold
from realformer_jax.kernels.plumbing import select
from realformer_jax.kernels.plumbing import tile_math as tm
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


@pytest.mark.slow  # ~15 s: the interpreter runs the forward and the dS kernel
def test_qk_forward_and_backward_equal_the_einsum_identity_in_interpret_mode():
  # The backward: the Hopper dS kernel (its keys resident in shared memory; opt-in) inside
  # Triton's panels and GEMMs.
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

  with mosaic_qk.resident_keys():  # the Hopper dS kernel is opt-in (traced inside)
    context, cotangents = value_and_vjp(kernel, stack, v)
  ref_context, ref_cotangents = value_and_vjp(reference, stack, v)
  _close(context, ref_context)
  _close(cotangents[1], ref_cotangents[1])  # dV
  _close(cotangents[0][:, :2], ref_cotangents[0][:, :2])  # the stack's layers 0 .. l
  assert not np.any(np.asarray(cotangents[0][:, 2], np.float32))  # none for a layer above


@pytest.mark.slow  # ~15 s: both dS kernels in their interpreters, two panels each
def test_qk_ds_kernel_with_resident_keys_equals_tritons_float32():
  # The Hopper dS kernel against Triton's (the existing path), float32 at 'highest'
  # (tests/conftest.py), dropout on, a padded sequence, a per-sequence scale and a running-mean
  # divisor: the whole panel, then the second 64-column panel (col0 = 64) as the one-head road
  # calls it. Layer 1 of a 3-slot stack: slot 2 holds 1e4 and must never be read.
  layers, keys = 3, jax.random.split(jax.random.key(2), 4)
  stack = jax.random.normal(keys[0], (2, layers, B, L, H, K)).at[:, 2].set(1e4)
  v, do = (jax.random.normal(k, (B, L, H, K)) for k in keys[1:3])
  mask = np.ones((B, L), np.int32)
  mask[1, 90:] = 0
  bias = mask_bias(jnp.asarray(mask)).reshape(B, L)  # [B, L]: the kernels' padding row
  fparams = jnp.array([[0.125, 0.5], [0.2, 1.0]], jnp.float32)
  iparams = jnp.concatenate([jax.random.bits(keys[3], (2,), jnp.uint32), jnp.zeros(2, jnp.uint32)])
  layer = jnp.array([1], jnp.int32)
  # consistent row statistics (natural units) and delta of the forward these scores give
  sums = qk_reference.summed_scores(stack, layer[0] + 1, 1.0, jnp.float32)
  z = sums * (fparams[:, 0] * fparams[:, 1])[:, None, None, None] + bias[:, None, None, :]
  m = jnp.max(z, -1)
  log_l = jnp.log(jnp.sum(jnp.exp(z - m[..., None]), -1))
  delta = jax.random.normal(jax.random.key(5), m.shape)
  tiles = dict(keep_threshold=keep_threshold(KEEP), heads_total=H, block_q=64, block_k=64)
  tiles.update(block_bwd=64, interpret=True, carry_in=False, carry_out=False)
  hopper, triton = kernels.KernelSpec('mosaic_gpu', **tiles), kernels.KernelSpec('triton', **tiles)
  for col0, columns in ((0, L), (64, 64)):
    args = (stack, v, do)
    rest = (delta, bias, fparams, iparams, layer, jnp.array([col0], jnp.int32), columns)
    got = mosaic_qk.score_gradient(*args, (m, log_l), *rest, hopper)
    want = triton_qk._score_gradient(*args, tm.to_base2((m, log_l)), *rest, triton)
    for g, w in zip(got, want):
      assert g.shape == w.shape
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.max(np.abs(w)))
    assert not np.any(np.asarray(got[0])[1, :, :, 90 - col0 :])  # padded keys: no gradient


def test_the_resident_key_stack_fits_shared_memory_up_to_bert_base_depth():
  # 64 x 64 bfloat16 tiles: BERT-Base's 12 layers keep their keys resident (the Hopper dS
  # kernel: 144 KiB with each buffer 1 KiB-aligned); BERT-Large's 24 do not fit one block's
  # shared memory (Triton's dS kernel).
  spec = kernels.KernelSpec('mosaic_gpu', False, False, 0, 12, 64, 64, 64)
  assert mosaic_qk.resident_bytes(12, 64, spec) == 144 * 1024 <= mosaic_gpu.SHARED_MEMORY
  assert mosaic_qk.resident_bytes(24, 64, spec) > mosaic_gpu.SHARED_MEMORY


def _ds_call(layers, seq_len, columns, heads=1):
  """A compiled program's Hopper dS call (the shapes of a one-head column panel)."""
  return hlo_text.parse_instruction(
    f'%mpmd_map.3 = (bf16[1,{heads},{columns},{seq_len}]{{3,2,1,0}}, '
    f'bf16[1,{columns},{heads},64]{{3,2,1,0}}) custom-call(%s, %v), '
    'custom_call_target="mosaic_gpu_v2", operand_layout_constraints={'
    f'bf16[{2 * layers},{seq_len},{heads},64]{{3,2,1,0}}, '
    f'bf16[1,{seq_len},{heads},64]{{3,2,1,0}}}}, '
    'metadata={op_name="jit(step)/mosaic_gpu_qk_attention_ds/mpmd_map"}'
  )


def test_the_resident_ds_kernel_states_its_l2_bytes_a_layer_step_for_the_estimator():
  # Per layer step of Triton's Hopper dS tile (64 keys x 128 query rows, bfloat16, K = 64):
  # q 16 KB + k 8 KB streamed; with the keys resident only q's 16 KB (issue 64 item 7).
  seq_len, columns, layers = 65536, 8192, 12
  stack = jax.ShapeDtypeStruct((2, layers, 1, seq_len, 1, K), jnp.bfloat16)
  tall = kernels.KernelSpec('triton', False, False, keep_threshold(0.9), 1, 128, 128, 64, 128)
  per_step = lambda resident: triton_qk._score_gradient_cost(  # noqa: E731
    tall, stack, columns, resident_keys=resident
  )
  mean_layers, elements = (layers + 1) / 2, seq_len * columns
  saved = float(per_step(False)['l2_bytes']) - float(per_step(True)['l2_bytes'])
  # the k tile, less its one load a program: 8 KB (1 - 128 / L) a layer step
  assert saved / (elements * mean_layers) * 64 * 128 == pytest.approx(8192 * (1 - 128 / seq_len))
  # The Hopper call states it (its lowering drops kernel metadata): read by the estimator
  stated = mosaic_costs.stated_cost(_ds_call(layers, seq_len, columns))
  hopper = kernels.KernelSpec('mosaic_gpu', False, False, keep_threshold(0.9), 1, 64, 128, 64)
  want = triton_qk._score_gradient_cost(hopper, stack, columns, resident_keys=True)
  assert stated['l2_bytes'] == float(want['l2_bytes']) < float(per_step(False)['l2_bytes'])
  assert stated['flops'] == float(want['flops'])
  assert stated['int_ops'] > float(want['int_ops'])  # a whole Threefry word every element
  assert mosaic_costs.stated_cost(hlo_text.parse_instruction('%a = f32[2]{0} add(%b, %c)')) is None


@pytest.mark.slow  # ~40 s: deviceless compiles for an H100 in a subprocess
def test_the_hopper_kernels_lower_and_compile_for_sm90a_without_a_device():
  report = support.run_check('mosaic_gpu_compile_check', optimised=True)
  assert report['tiles'] == [64, 128, 64]
  assert report['post'] == [
    'mosaic_gpu_attention_dkv',
    'mosaic_gpu_attention_dq',
    'mosaic_gpu_attention_fwd',
  ]
  assert report['qk_forward'] == ['mosaic_gpu_qk_attention_fwd']
  # the dS kernel once in each branch of the lax.switch over 12 layers' slot buckets (3, 6, 9,
  # 12: Triton's slot_buckets), one panel each
  assert report['qk_backward'] == ['mosaic_gpu_qk_attention_ds'] * 4
  # its machine code, read without a GPU: no spills with the keys resident (242 registers);
  # its instructions per element are mostly the whole Threefry word every element hashes
  # (111.8 at 2026-12-07's jax 0.10.2, where Triton's dS kernel issued 45.9)
  code = report['qk_ds_machine_code']
  assert code['spill_bytes'] == 0 and code['registers'] <= 255
  assert 60 < code['sass_per_element'] < 200


def _gpu(kind='NVIDIA H200'):
  return [types.SimpleNamespace(platform='gpu', device_kind=kind)]


def _preferred(config, devices, seq_len):
  """What the train setup makes of `config` on `devices` (train/build.py make_setup)."""
  attention = select.for_run(
    config, devices, seq_len, passed=device_checks.passed_backends(devices)
  )
  return config.replace(**attention.changes)


def _config(**fields):
  fields = {'dtype': 'bfloat16', **fields}
  return ModelConfig(hidden_size=128, num_heads=2, attention_platform='gpu', **fields)


def test_auto_takes_the_hopper_kernels_only_where_checked_and_measured_faster(
  tmp_path, monkeypatch
):
  monkeypatch.setenv('REALFORMER_JAX_CACHE', str(tmp_path))
  config = _config(ln_placement='post')
  # No record: the platform's default (Triton) for 'auto' and 'pallas'.
  assert _preferred(config, _gpu(), 512) == config
  assert select.plan(config, 512).backend == 'triton'
  # A check with a failed or an interpreted Hopper case records nothing.
  row = {'kernel': 'mosaic_gpu (compiled)', 'passed': True, 'worst_relative_error': 9e-3}
  assert device_checks.record('mosaic_gpu', 'NVIDIA H200', [row, dict(row, passed=False)]) is None
  interpreted = dict(row, kernel='mosaic_gpu (interpret)')
  assert device_checks.record('mosaic_gpu', 'NVIDIA H200', [interpreted]) is None
  assert _preferred(config, _gpu(), 512) == config
  # Every case passed, compiled: still not taken on the pass alone (issue 64: no speed
  # comparison), nor where the device suite measured it slower than Triton; taken once it
  # measured faster on that device kind, not on another. A speed without a pass records nothing.
  assert not device_checks.record_speed('mosaic_gpu', 'NVIDIA H200', 'qk 65,536', 5.0, 6.0)
  other = {**row, 'kernel': 'triton (compiled)', 'passed': False}  # another backend's case
  assert device_checks.record('mosaic_gpu', 'NVIDIA H200', [row, row, other])
  assert _preferred(config, _gpu(), 512) == config
  assert device_checks.record_speed('mosaic_gpu', 'NVIDIA H200', 'qk 65,536', 7.5, 6.0)
  assert _preferred(config, _gpu(), 512) == config
  assert device_checks.record_speed('mosaic_gpu', 'NVIDIA H200', 'qk 65,536', 5.0, 6.0)
  assert 'qk 65,536: 5 s' in device_checks.faster('mosaic_gpu', 'NVIDIA H200')
  taken = _preferred(config, _gpu(), 512)
  assert taken.attention_impl == 'pallas_mosaic_gpu'
  assert select.plan(taken, 512).backend == 'mosaic_gpu'
  assert _preferred(config, _gpu('NVIDIA H100 80GB HBM3'), 512) == config
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
  assert _preferred(explicit, _gpu(), 512) == explicit


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

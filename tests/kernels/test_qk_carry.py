"""model.residual_carry='qk': attention from the stacked queries and keys of the layers below
(kernels/score_paths/qk_reference.py, kernels/score_paths/qk_carry.py) equals the carried-sum path.
Matmuls in float32
(tests/conftest.py pins 'highest')."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_fixtures import kernel_config

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels.backends.mosaic import qk_attention as mosaic_qk_attention
from realformer_jax.kernels.backends.triton import qk_attention as triton_qk_attention
from realformer_jax.kernels.backends.triton import tiles as triton_tiles
from realformer_jax.kernels.dropout.dropout_bits import GENERATORS
from realformer_jax.kernels.plumbing.select import AttentionPlan
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.kernels.score_paths import qk_carry, qk_reference
from realformer_jax.model.attention import mask_bias, score_scale
from realformer_jax.model.encoder import Encoder
from realformer_jax.model.params import stack_layers, unbox, unstack_layers
from realformer_jax.model.rotary import apply_rotary
from realformer_jax.model.softmax_attention import softmax_dropout_values
from tests import scale_out_support as support


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
    stack = qk_carry.push(stack, jnp.asarray(layer), q_N[layer], k_N[layer])
    from_stack = qk_reference.summed_scores(stack, jnp.asarray(layer + 1), scale, jnp.float32)
    np.testing.assert_allclose(from_stack, acc, rtol=1e-5, atol=1e-5)
  # Slots above the bound do not count, whatever finite values they hold.
  poisoned = stack.at[:, 2].set(1e30)
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


def _reference_context(
  stack, v, index, bias, scale, divisor, key, keep_prob, dtype, generator='threefry'
):
  acc = qk_reference.summed_scores(stack, index + 1, scale, dtype)
  return softmax_dropout_values(acc, bias, divisor, v, key, keep_prob, dtype, generator)[0]


PLANS = {
  'triton': AttentionPlan('pallas', 'triton', True, 16, 16, 16),
  'mosaic': AttentionPlan('pallas', 'mosaic', True, 16, 16, 16),
}


@pytest.mark.parametrize(
  'backend, running_mean, dropout, scale_kind',
  [
    # Each backend once in the fast tier, with and without running mean, dropout and the
    # per-row scale; the other pairings are slow. Dropout 'philox': model.dropout_generator.
    ('triton', True, True, 'entropy_invariant'),
    ('mosaic', False, False, 'standard'),
    pytest.param('triton', False, False, 'standard', marks=pytest.mark.slow),
    pytest.param('triton', True, False, 'entropy_invariant', marks=pytest.mark.slow),
    pytest.param('triton', False, True, 'standard', marks=pytest.mark.slow),
    pytest.param('mosaic', True, True, 'entropy_invariant', marks=pytest.mark.slow),
    pytest.param('triton', False, 'philox', 'standard', marks=pytest.mark.slow),
    pytest.param('mosaic', True, 'philox', 'entropy_invariant', marks=pytest.mark.slow),
  ],
)
def test_kernel_op_equals_einsum_identity_float32(backend, running_mean, dropout, scale_kind):
  stack, v, mask, weights = _op_inputs()
  index = jnp.asarray(1)
  stack = stack.at[:, 2].set(1e30)  # a slot above the layer: never read
  config = ModelConfig(hidden_size=16, num_heads=2, attention_scale=scale_kind)
  scale = score_scale(config, mask)
  bias = mask_bias(mask)
  divisor = jnp.asarray(2.0) if running_mean else None
  key = jax.random.key(7) if dropout else None
  generator = dropout if isinstance(dropout, str) else 'threefry'
  plan = dataclasses.replace(PLANS[backend], dropout_generator=generator)
  w_stack = jax.random.normal(jax.random.key(3), stack.shape)

  def kernel_loss(stack, v):
    context, passed = qk_carry.kernel_attention(
      plan, stack, v, index, bias, scale, divisor, key, 0.75
    )
    return jnp.sum(context * weights) + jnp.sum(jnp.where(passed < 1e29, passed, 0) * w_stack)

  def reference_loss(stack, v):
    context = _reference_context(
      stack, v, index, bias, scale, divisor, key, 0.75, jnp.float32, generator
    )
    return jnp.sum(context * weights) + jnp.sum(jnp.where(stack < 1e29, stack, 0) * w_stack)

  # Jitted: eagerly, every interpret-mode grid step's ops compile apart.
  loss, grads = jax.jit(jax.value_and_grad(kernel_loss, argnums=(0, 1)))(stack, v)
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(reference_loss, argnums=(0, 1)))(stack, v)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for got, want in zip(grads, ref_grads):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))
  assert not np.any(grads[0][:, 2])  # no gradient for a layer above


@pytest.mark.slow  # ~15 s on 2 cores
@pytest.mark.parametrize('backend', ['triton', 'mosaic'])
def test_replayed_layer_runs_no_forward_kernel_and_gives_the_same_gradients(backend):
  # qk_stack's re-run going down takes a layer's output and row statistics from
  # SavedAttention (kernel_attention_saving with `saved`): its gradients equal the op's that
  # ran the forward, and its program holds the backward kernels only. float32 stack ('highest'
  # matmuls, tests/conftest.py).
  stack, v, mask, weights = _op_inputs()
  index, plan, key = jnp.asarray(1), PLANS[backend], jax.random.key(7)
  scale, bias = jnp.asarray(0.3), mask_bias(mask)
  w_stack = jax.random.normal(jax.random.key(3), stack.shape)
  args = (index, bias, scale, None, key, 0.75)
  _, _, saved = qk_carry.kernel_attention_saving(plan, stack, v, *args)

  def loss(stack, v, saved=None):
    context, passed, _ = qk_carry.kernel_attention_saving(plan, stack, v, *args, saved)
    return jnp.sum(context * weights) + jnp.sum(passed * w_stack)

  replay = functools.partial(loss, saved=saved)
  grads = jax.grad(loss, argnums=(0, 1))(stack, v)
  replayed = jax.grad(replay, argnums=(0, 1))(stack, v)
  for got, want in zip(replayed, grads):
    np.testing.assert_array_equal(got, want)
  program = str(jax.make_jaxpr(jax.grad(replay, argnums=(0, 1)))(stack, v))
  assert 'realformer_qk_attention_fwd' not in program
  assert 'realformer_qk_attention_fwd' in str(jax.make_jaxpr(jax.grad(loss))(stack, v))


@pytest.mark.slow  # ~11 s CPU each: 8 layers of interpret-mode kernels
@pytest.mark.parametrize('rows', [0, 32])
def test_triton_backward_in_column_panels_over_slot_buckets_float32(monkeypatch, rows):
  # The dS kernel + matmul backward on its second road: a dS panel budget of one head's
  # 32 x 16 float32 columns forces one (batch, head) at a time, and a GPU of one SM panels of
  # 16 columns (one program fills it): two column panels (dQ summed
  # over them), and 8 layers take the lax.switch over slot buckets (2, 4, 6, 8): layer 4 runs
  # the matmuls over 6 slots, slot 5 multiplied by 0. Dropout on; float32 against the einsum
  # identity, as test_kernel_op_equals_einsum_identity_float32. rows=32: the dS kernel's tile
  # is 32 query rows x 16 keys (spec.block_bwd_rows), so its mask tiles are not square either.
  monkeypatch.setattr(triton_qk_attention, 'DS_PANEL_BYTES', 32 * 16 * 4)
  monkeypatch.setattr(triton_qk_attention, 'device_sms', lambda: 1)  # 16 columns fill one SM
  fit = triton_qk_attention.fit_blocks
  monkeypatch.setattr(
    triton_qk_attention,
    'fit_blocks',
    lambda spec, *a: dataclasses.replace(fit(spec, *a), block_bwd_rows=rows),
  )
  assert triton_qk_attention.column_panels(2, 2, 32, 4, 16, 1) == 16
  assert triton_qk_attention.slot_buckets(8) == (2, 4, 6, 8)
  stack, v, mask, weights = _op_inputs(layers=8)
  index = jnp.asarray(4)
  stack = stack.at[:, 5:].set(1e30)  # slots above the layer: never part of a gradient
  bias, scale, key = mask_bias(mask), jnp.asarray(8**-0.5), jax.random.key(7)
  w_stack = jax.random.normal(jax.random.key(3), stack.shape)

  def kernel_loss(stack, v):
    context, passed = qk_carry.kernel_attention(
      PLANS['triton'], stack, v, index, bias, scale, None, key, 0.75
    )
    return jnp.sum(context * weights) + jnp.sum(jnp.where(passed < 1e29, passed, 0) * w_stack)

  def reference_loss(stack, v):
    context = _reference_context(stack, v, index, bias, scale, None, key, 0.75, jnp.float32)
    return jnp.sum(context * weights) + jnp.sum(jnp.where(stack < 1e29, stack, 0) * w_stack)

  grads = jax.grad(kernel_loss, argnums=(0, 1))(stack, v)
  ref_grads = jax.grad(reference_loss, argnums=(0, 1))(stack, v)
  for got, want in zip(grads, ref_grads):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))
  assert not np.any(grads[0][:, 5:])


def test_ds_panels_are_sized_to_fill_every_sm_at_every_length():
  # BERT-Base (B = 1, H = 12), bfloat16, 64-key dS tiles on an H100 / H200 (132 SMs): short
  # sequences take every head at once (<= 1 GiB); long ones one head at a time in the fewest
  # columns whose programs fill >= 90 % of the SMs' slots: 128 programs (0.97 of one wave) at
  # every length, where a 1 GiB cap left 64 programs (0.48) at 131,072.
  panels = functools.partial(triton_qk_attention.column_panels, 1, 12, itemsize=2, block=64)
  assert panels(seq_len=4096, sms=132) == 0  # 384 MiB: one panel, 768 programs
  for seq_len in (8192, 16384, 65536, 131072, 262144):
    columns = panels(seq_len=seq_len, sms=132)
    assert (columns, seq_len % columns) == (8192, 0), seq_len
    assert triton_qk_attention.wave_fill(columns // 64, 132) >= triton_qk_attention.PANEL_FILL
  assert panels(seq_len=131072, sms=108) == 2**15  # an A100: 512 programs fill 0.95 of 5 waves
  assert panels(seq_len=15360, sms=132) == 7680  # 120 programs (0.91): any divisor of L
  # too short for one head to fill the GPU: all of L (the most programs there are)
  assert triton_qk_attention.column_panels(64, 12, 4096, 2, 64, 132) == 4096
  assert triton_qk_attention.wave_fill(128, 132) == 128 / 132
  assert triton_qk_attention.wave_fill(256, 132) == 256 / 264


def test_triton_tiles_come_from_the_device_table():
  plan_spec = KernelSpec('triton', False, False, 0, 12, 64, 64, 64)
  tiles = triton_qk_attention.device_tiles()  # no GPU here: the default row
  assert tiles == triton_tiles.DEFAULT
  fitted = triton_qk_attention.fit_blocks(plan_spec, 12, 4096, 64)
  assert (fitted.block_q, fitted.block_k, fitted.block_bwd) == tiles[:3]
  small = triton_qk_attention.fit_blocks(plan_spec, 12, 64, 64)  # 128 does not divide 64
  assert small.block_q == 64
  interpret = dataclasses.replace(plan_spec, interpret=True)
  assert triton_qk_attention.fit_blocks(interpret, 12, 4096, 64) == interpret
  # The table's dS tile: 64 keys x 128 query rows (measured fastest on an H200, tiles.py).
  assert (fitted.block_bwd, fitted.block_bwd_rows) == (64, 128)
  assert fitted.backward_rows == 128
  assert small.block_bwd_rows == 0  # 128 rows do not divide 64: the plan's square tile
  square = triton_tiles.Tiles(128, 128, 64, 8, 3)  # a device suite candidate
  with triton_tiles.override(square):
    assert triton_qk_attention.fit_blocks(plan_spec, 12, 4096, 64).block_bwd_rows == 0
  # The dS kernel's own warps and stages where the row names them; the forward keeps the row's.
  with triton_tiles.override(tiles._replace(ds_warps=4, ds_stages=2)):
    ds = triton_qk_attention._compiler_params(64, score_gradient=True)
    forward = triton_qk_attention._compiler_params(64)
    assert (ds.num_warps, ds.num_stages, forward.num_warps, forward.num_stages) == (4, 2, 8, 3)


@pytest.fixture(scope='module')
def h100_compile():
  # tests/qk_compile_check.py: forward + backward of the op compiled deviceless for an H100
  # (bfloat16 stack, 8 layers, dropout) with each dropout generator, and the PTX of its
  # kernels (one subprocess, three tests).
  return support.run_check('qk_compile_check', optimised=True)


@pytest.mark.slow
@pytest.mark.parametrize('generator', GENERATORS)
def test_qk_kernels_compile_for_an_h100_without_atomics(h100_compile, generator):
  # The dS kernel replaced the atomic backward, and every kernel states the estimator's fields
  # (l2_bytes, atomics: aot/kernel_work.py).
  report = h100_compile[generator]
  assert report['kernels'] == ['realformer_qk_attention_ds', 'realformer_qk_attention_fwd']
  assert report['atomic_rmw'] == 0
  for stated in report['stated'].values():
    assert stated['atomics'] == '0'
    assert int(stated['l2_bytes']) > int(stated['bytes_accessed']) > 0
    assert int(stated['int_ops']) > 0  # dropout: the hash
  # philox's multiply high words are PTX mul.hi.u32 (inline, 2 a round: 20 a hash); threefry
  # has none
  for name, count in report['mul_hi'].items():
    assert (count >= 20) if generator == 'philox' else (count == 0), (name, count)
  # the softmax's exponentials are one inline ex2.approx each, no libdevice expf (issue 64)
  for name, exps in report['exps'].items():
    assert exps['ex2'] > 0 and exps['libdevice_expf'] == 0, (name, exps)


@pytest.mark.slow
def test_qk_layer_loops_keep_the_tensor_cores_busy_in_the_sm90a_ptx(h100_compile):
  # Each score tile is the sum of l + 1 layer products in ONE accumulator, scaled after the
  # loop (tile_math.summed_scores): in the PTX for sm_90a the innermost loop of each kernel
  # chains the layers' wgmma (4 a layer: K = 64 in k16 steps) and waits for at most one of
  # them in flight, never for all (`wgmma.wait_group 0`: before, every layer's product got a
  # fresh accumulator, a wait for 0 and the scale / add on the CUDA cores).
  loops = h100_compile['threefry']['mma_loops']
  assert set(loops) == {'realformer_qk_attention_fwd', 'realformer_qk_attention_ds'}
  for name, innermost in loops.items():
    assert len(innermost) == 1, (name, innermost)  # the layer loop
    assert innermost[0]['mma'] == 4, (name, innermost)
    assert innermost[0]['waits'] and 0 not in innermost[0]['waits'], (name, innermost)


# --- The encoder: residual_carry='qk' equals 'scores' ------------------------------------------

SEQ = 32
SLOW = pytest.mark.slow  # ~10 s or more on 2 cores


def _encoder_config(**overrides):
  dropout = dict(dropout_rate=0.1, attention_dropout_rate=0.2)
  path = dict(residual_carry='scores', attention_impl='xla')
  return kernel_config(SEQ, **{'num_layers': 3, **dropout, **path, **overrides})


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
    pytest.param('xla', dict(position_embedding='rope', scan_layers=False), marks=SLOW),
    pytest.param('xla', dict(remat_policy='full'), marks=SLOW),
    ('pallas_triton', dict(running_mean=True, attention_scale='entropy_invariant')),
    ('pallas_triton', dict(position_embedding='rope', attention_scale='t5')),
  ],
)
@pytest.mark.slow  # 13-26 s CPU a case at load 6-9 (2026-11-26)
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


@pytest.mark.slow  # ~5-9 s CPU a case; test_kernels.py keeps a bfloat16 kernel case fast
@pytest.mark.parametrize('backend', ['triton', 'mosaic'])
def test_kernel_op_bfloat16_within_the_kernels_tolerance(backend):
  # bfloat16 q, k, v: as tests/kernels/test_kernels.py's bfloat16 test, 2e-2 of the largest value
  # (the kernels round exp(z - m) before P V, the einsum path the normalised p).
  stack, v, mask, weights = _op_inputs(dtype=jnp.bfloat16)
  index, key = jnp.asarray(2), jax.random.key(3)
  bias, scale = mask_bias(mask), jnp.asarray(8**-0.5)
  plan = PLANS[backend]

  def kernel(stack, v):
    return qk_carry.kernel_attention(plan, stack, v, index, bias, scale, None, key, 0.8)[0]

  def reference(stack, v):
    return _reference_context(stack, v, index, bias, scale, None, key, 0.8, jnp.bfloat16)

  def close(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.max(np.abs(want)))

  g_context = weights.astype(jnp.bfloat16)

  @functools.partial(jax.jit, static_argnums=0)
  def value_and_vjp(fn, stack, v):  # one program: eagerly, every grid step compiles apart
    context, vjp = jax.vjp(fn, stack, v)
    return context, vjp(g_context)

  context, cotangents = value_and_vjp(kernel, stack, v)
  ref_context, ref_cotangents = value_and_vjp(reference, stack, v)
  close(context, ref_context)
  for got, want in zip(cotangents, ref_cotangents):
    close(got, want)


@pytest.mark.slow  # ~9 s CPU: two interpret-mode forward + backward runs
def test_a_bfloat16_stack_holds_what_a_float32_one_does():
  # A bfloat16 model stores its stack in bfloat16 (the values were computed in it): the
  # Triton op's context is then bit-identical to the float32 stack's (its tiles are cast to
  # bfloat16 for the products either way); the stack's gradient comes back in bfloat16, each
  # layer's float32 share rounded once.
  stack, v, mask, weights = _op_inputs(dtype=jnp.bfloat16)
  index, key = jnp.asarray(2), jax.random.key(3)
  bias, scale = mask_bias(mask), jnp.asarray(8**-0.5)

  def run(stack):
    def loss(stack, v):
      context, _ = qk_carry.kernel_attention(
        PLANS['triton'], stack, v, index, bias, scale, None, key, 0.8
      )
      return jnp.sum(context.astype(jnp.float32) * weights), context

    return jax.grad(loss, argnums=(0, 1), has_aux=True)(stack, v)

  (g32, dv32), context32 = run(stack)
  (g16, dv16), context16 = run(stack.astype(jnp.bfloat16))
  assert g16.dtype == jnp.bfloat16
  np.testing.assert_array_equal(
    np.asarray(context16, np.float32), np.asarray(context32, np.float32)
  )
  np.testing.assert_array_equal(np.asarray(dv16, np.float32), np.asarray(dv32, np.float32))
  np.testing.assert_allclose(
    np.asarray(g16, np.float32), g32, rtol=2**-8, atol=2**-8 * float(np.max(np.abs(g32)))
  )


@pytest.mark.parametrize('impl', ['xla', pytest.param('pallas_triton', marks=pytest.mark.slow)])
@pytest.mark.slow  # 13-26 s CPU a case at load 6-9 (2026-11-26)
def test_qk_scan_equals_loop_and_forward_only_equals_scores(impl):
  # scan_layers=True (training: qk_carry.qk_stack) == False (the Python loop), values and
  # gradients; the forward alone (evaluation) and the plain nn.scan (here with the sown
  # 'intermediates' that analysis asks for) equal the carried sum's.
  cfg = _encoder_config(residual_carry='qk', attention_impl=impl, attention_platform='cpu')
  ids, mask = _encoder_inputs()
  params = Encoder(cfg).init(jax.random.key(0), ids, mask)
  loop = cfg.replace(scan_layers=False)
  loop_params = unstack_layers(params)
  loss, grads = _loss_and_grads(cfg, params, ids, mask, deterministic=True)
  loop_loss, loop_grads = _loss_and_grads(loop, loop_params, ids, mask, deterministic=True)
  np.testing.assert_allclose(loop_loss, loss, rtol=1e-5)
  loop_grads = stack_layers(loop_grads)
  _assert_trees_close(loop_grads, unbox(grads), 1e-5)

  scores = cfg.replace(residual_carry='scores', attention_impl='xla')
  expected = Encoder(scores).apply(params, ids, mask)
  np.testing.assert_allclose(Encoder(cfg).apply(params, ids, mask), expected, rtol=1e-5, atol=1e-5)
  sown, _ = Encoder(cfg).apply(params, ids, mask, mutable=['intermediates'])
  np.testing.assert_allclose(sown, expected, rtol=1e-5, atol=1e-5)


def test_mosaic_tiles_shrink_with_depth_to_fit_vmem():
  # Every Mosaic block holds a tile of all N layers' queries or keys: deeper stacks take
  # smaller tiles (the plan's 256 / 512 / 256 at L = 4,096), and where 128 rows still exceed
  # the budget the kernels ask for a larger VMEM limit instead.
  plan_spec = KernelSpec('mosaic', False, False, 0, 12, 256, 512, 256)
  tiles = {}
  for layers in (4, 12, 24, 36):
    spec = mosaic_qk_attention.fit_blocks(plan_spec, layers, 4096, 64)
    tiles[layers] = (spec.block_q, spec.block_k, spec.block_bwd)
    need = mosaic_qk_attention.vmem_need(layers, 64, *tiles[layers])
    limit = mosaic_qk_attention.vmem_limit(spec, layers, 64)
    assert (need <= mosaic_qk_attention.VMEM_BUDGET) == (limit is None)
    assert limit is None or limit > need
  assert tiles == {
    4: (256, 512, 256),
    12: (256, 512, 256),
    24: (256, 256, 128),
    36: (128, 128, 128),
  }
  interpret = dataclasses.replace(plan_spec, interpret=True)
  assert mosaic_qk_attention.fit_blocks(interpret, 36, 4096, 64) == interpret


@pytest.mark.parametrize('scan_layers', [True, pytest.param(False, marks=pytest.mark.slow)])
def test_grad_of_grad_on_the_qk_kernels_is_refused_in_one_line(scan_layers):
  cfg = _encoder_config(
    residual_carry='qk', attention_impl='pallas_triton', scan_layers=scan_layers, num_layers=2
  )
  ids, mask = _encoder_inputs()
  # Shapes only: the test traces (eval_shape), it never runs the model.
  params = jax.eval_shape(
    Encoder(cfg.replace(attention_impl='xla')).init, jax.random.key(0), ids, mask
  )

  def loss(p):
    return jnp.sum(jnp.square(Encoder(cfg).apply(p, ids, mask)))

  def grad_norm(p):
    return sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(jax.grad(loss)(p)))

  jax.eval_shape(jax.grad(loss), params)  # first order: fine
  with pytest.raises(ConfigError, match=r"higher-order derivatives .* attention_impl='xla'"):
    jax.eval_shape(jax.grad(grad_norm), params)


def test_residual_carry_is_validated_in_one_line():
  with pytest.raises(ConfigError, match=r"^model.residual_carry='sum': must be one of auto"):
    ModelConfig(residual_carry='sum')
  # An old config without the field loads: the default is 'auto'.
  assert ModelConfig.from_mapping({'num_layers': 2}).residual_carry == 'auto'


@pytest.mark.slow
def test_qk_carry_on_a_2x2x2_mesh_gives_the_carried_sum_gradients():
  # tests/qk_sharded_check.py on 8 forced CPU devices: the einsum path and the Triton kernels
  # (per shard, the single-device dropout masks) against the carried sum.
  report = support.run_check('qk_sharded_check', 8)
  assert report['devices'] == 8
  assert report['grad_difference_xla'] <= 1e-5, report
  assert report['grad_difference_pallas'] <= 1e-5, report
  for case in ('loss_qk_xla', 'loss_qk_pallas'):
    assert abs(report[case] - report['loss_scores']) <= 1e-5 * report['loss_scores'], report
  assert abs(report['step_loss'] - report['loss_qk_pallas']) <= 1e-6 * report['loss_scores']


@pytest.mark.slow
def test_unrolled_qk_einsum_path_with_xla_optimisations_on():
  # tests/qk_optimised_check.py in a subprocess, where tests/conftest.py's
  # jax_disable_most_optimizations does not apply: the optimised program once returned all-nan
  # (issue 40, item 6) while this suite, optimisations off, saw finite values.
  report = support.run_check('qk_optimised_check', optimised=True)
  assert not report['optimisations_disabled'], report
  assert report['nan_fraction'] == 0.0, report
  assert report['max_difference'] <= 1e-5 * report['max_value'], report

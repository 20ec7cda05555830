"""A rematerialised layer's plain (Post-LN / Pre-LN) attention keeps its output and row
statistics for the backward (kernels/plumbing/fused.py SAVED_FOR_BACKWARD, model/encoder.py's remat
policies), so the backward's re-run of the layer runs no forward kernel; its gradients are the
ones the re-run forward gave, bit for bit. Kernels in Pallas interpret mode on the CPU;
matmuls in float32 at 'highest' precision (tests/conftest.py pins it)."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import repo_paths
from model_fixtures import kernel_config

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.kernels.plumbing import fused, select
from realformer_jax.kernels.plumbing.attend import fused_self_attention
from realformer_jax.kernels.plumbing.select import AttentionPlan
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.model.encoder import REMAT_POLICIES, Encoder

# The forward kernel of each backend's plain attention (the name its pallas_call carries).
FORWARD = 'flash_attention_fwd'
BACKWARD = {'triton': 'flash_attention_bwd', 'mosaic': 'flash_attention_dkv'}
TODAY = jax.checkpoint_policies.nothing_saveable  # full remat before the saved attention
REPO = pathlib.Path(repo_paths.REPO)
# The encoder tests' setting: every layer rematerialised, attention dropout on (the saved mask).
FULL_REMAT = dict(remat_policy='full', attention_dropout_rate=0.1)


def _calls(program, kernel: str) -> int:
  """pallas_call equations named `kernel` in a printed jaxpr (nested ones included)."""
  return len(re.findall(rf'\bname={kernel}\b', str(program)))


def _layer_loss(plan: AttentionPlan, policy):
  """A rematerialised attention 'layer' around the op (a projection before and after, as in
  the encoder), dropout on (keep 0.9)."""
  batch, seq_len, heads, head_dim = 1, 32, 2, 8
  w = jax.random.normal(jax.random.key(1), (batch, seq_len, heads, head_dim))
  bias = jnp.zeros((batch, 1, 1, seq_len))

  def layer(qkv):
    out, _ = fused_self_attention(
      plan, 'sum', jnp.sin(qkv), (), bias, jnp.asarray(0.3), None, jax.random.key(3), 0.9, False
    )
    return jnp.sum(jnp.cos(out) * w)

  qkv = jax.random.normal(jax.random.key(0), (batch, seq_len, 3, heads, head_dim))
  return jax.checkpoint(layer, policy=policy), qkv


def _plans(backend, keeps_masks=False, mask_pass=False):
  today = AttentionPlan('pallas', backend, True, 16, 16, 16)
  saved = dataclasses.replace(
    today, rematerialised=True, remat_keeps_masks=keeps_masks, remat_mask_pass=mask_pass
  )
  return today, saved


@pytest.mark.parametrize('backend', ['triton', 'mosaic'])
def test_the_backwards_re_run_holds_no_forward_kernel(backend):
  # Traced, not run (fast): today's full remat runs the forward twice (the pass and the
  # re-run in the backward), the saved attention once; the backward kernel runs once in both.
  today, saved = _plans(backend)
  for plan, policy, forwards in ((today, TODAY, 2), (saved, REMAT_POLICIES['full'], 1)):
    loss, qkv = _layer_loss(plan, policy)
    program = jax.make_jaxpr(jax.grad(loss))(qkv)
    assert _calls(program, FORWARD) == forwards, (backend, plan)
    assert _calls(program, BACKWARD[backend]) == 1
  # No separate mask pass: the forward keeps its mask for the backward (remat_keeps_masks,
  # Triton: a bits output of the forward kernel, named for the remat policy) or the backward
  # kernel draws it in its loops (Mosaic's always does).
  for keeps in (False, True):
    _, plan = _plans(backend, keeps)
    program = jax.make_jaxpr(jax.grad(_layer_loss(plan, REMAT_POLICIES['full'])[0]))(qkv)
    assert _calls(program, 'attention_dropout_mask') == 0
    assert _calls(program, FORWARD) == 1 and _calls(program, BACKWARD[backend]) == 1
    spec = KernelSpec(backend, False, False, 230, 2, 16, 16, 16, for_remat=True, keeps_mask=keeps)
    inputs = (qkv, None, jnp.zeros((1, 32)), jnp.ones((1, 2)), jnp.zeros((4,), jnp.uint32))
    bits = jax.eval_shape(lambda *a: fused.kernel_forward(*a, spec), *inputs)[3]
    assert (bits is not None) == (keeps and backend == 'triton')


def test_a_per_layer_mask_pass_draws_the_mask_once_before_the_backward():
  # model.remat_dropout_masks='per_layer' (Triton): the forward stores no mask; the backward
  # first draws the layer's whole mask by one pass and its loops read it (the hash once, one
  # layer's bits in memory at a time).
  _, plan = _plans('triton', mask_pass=True)
  loss, qkv = _layer_loss(plan, REMAT_POLICIES['full'])
  program = jax.make_jaxpr(jax.grad(loss))(qkv)
  assert _calls(program, 'attention_dropout_mask') == 1
  assert _calls(program, FORWARD) == 1 and _calls(program, BACKWARD['triton']) == 1
  with pytest.raises(ValueError, match='mask_pass is for a rematerialised layer'):
    KernelSpec('triton', False, False, 230, 2, 16, 16, 16, mask_pass=True)


@pytest.mark.slow  # ~30-50 s on 2 cores: four interpret-mode kernel runs
@pytest.mark.parametrize(
  'backend,masks',
  [('triton', 'drawn'), ('triton', 'stored'), ('triton', 'per_layer'), ('mosaic', 'drawn')],
)
def test_saved_attention_gradients_are_todays_bit_for_bit(backend, masks):
  # The mask the backward draws in its loops or by a pass first, or the forward's kept by the
  # remat policy, is the one the forward used: the same gradients to the bit.
  today, saved = _plans(backend, masks == 'stored', masks == 'per_layer')
  loss_today, qkv = _layer_loss(today, TODAY)
  loss_saved, _ = _layer_loss(saved, REMAT_POLICIES['full'])
  g_today, g_saved = jax.grad(loss_today)(qkv), jax.grad(loss_saved)(qkv)
  assert np.any(g_today)
  np.testing.assert_array_equal(g_saved, g_today)


def test_every_remat_policy_keeps_the_attention_and_only_plain_attention_names_it():
  config = ModelConfig(attention_impl='pallas_triton', remat_policy='none', max_len=64)
  assert not select.plan(config, 64).rematerialised
  for policy in ('full', 'dots', 'dots_no_batch'):
    assert select.plan(config.replace(remat_policy=policy), 64).rematerialised
  spec = KernelSpec('triton', False, False, 0, 2, 16, 16, 16, for_remat=True)
  assert spec.for_remat
  with pytest.raises(ValueError, match='for_remat is for plain attention'):
    KernelSpec('triton', False, True, 0, 2, 16, 16, 16, for_remat=True)


@pytest.mark.parametrize('ln_placement', ['post', pytest.param('pre', marks=pytest.mark.slow)])
def test_encoder_under_full_remat_runs_the_forward_kernel_once_a_layer(ln_placement, monkeypatch):
  # The model's wiring (plan -> KernelSpec.for_remat -> the named residuals -> nn.remat's
  # policy inside nn.scan), traced: one forward kernel in the scanned layer's program, not
  # two (the layer body is traced once for the pass and once for the re-run).
  config = kernel_config(
    32, ln_placement=ln_placement, **FULL_REMAT, attention_impl='pallas_triton'
  )
  ids = jnp.arange(32).reshape(1, 32)
  counts = {}
  for remat in ('none', 'full', 'today'):
    if remat == 'today':  # nothing saved: the re-run runs the forward again
      monkeypatch.setitem(REMAT_POLICIES, 'full', TODAY)
    model = Encoder(config.replace(remat_policy='full' if remat == 'today' else remat))
    params = jax.eval_shape(model.init, jax.random.key(0), ids)

    def loss(params, model=model):
      y = model.apply(params, ids, deterministic=False, rngs={'dropout': jax.random.key(1)})
      return jnp.sum(y)

    counts[remat] = _calls(jax.make_jaxpr(jax.grad(loss))(params), FORWARD)
  assert counts == {'none': 1, 'full': 1, 'today': 2}


def test_plain_forward_takes_the_device_tiles_and_a_carried_sum_keeps_the_plans():
  # No GPU here: the table's default row (an H100's, as a deviceless compile sees it).
  from realformer_jax.kernels.backends.triton import attention, tiles  # Pallas Triton import

  row = tiles.device_tiles()
  assert row == tiles.DEFAULT and (row.block_q, row.block_k) == (128, 128)
  plain = KernelSpec('triton', False, False, 26, 12, 128, 64, 64)
  fitted = attention.fit_blocks(plain, 4096)
  assert (fitted.block_q, fitted.block_k, fitted.block_bwd) == (128, 128, 64)
  assert attention._forward_params(fitted, 64).num_warps == row.warps
  assert attention.fit_blocks(KernelSpec('triton', False, False, 0, 2, 16, 16, 16), 208) == (
    KernelSpec('triton', False, False, 0, 2, 16, 16, 16)  # 128 divides no 208
  )
  carried = KernelSpec('triton', True, True, 26, 12, 128, 64, 64)
  assert attention.fit_blocks(carried, 4096) == carried
  interpret = KernelSpec('triton', False, False, 26, 12, 16, 16, 16, interpret=True)
  assert attention.fit_blocks(interpret, 4096) == interpret
  assert attention._backward_params(fitted, 64).num_stages == 2  # no backward tiles: 4 x 2
  # A row that names backward tiles: plain attention's backward takes them where they divide.
  with tiles.override(row._replace(bwd_keys=128, bwd_rows=32, bwd_warps=4, bwd_stages=5)):
    fitted = attention.fit_blocks(plain, 4096)
    assert (fitted.block_bwd, fitted.block_bwd_rows) == (128, 32)
    params = attention._backward_params(fitted, 64)
    assert (params.num_warps, params.num_stages) == (4, 5)
    assert attention.fit_blocks(plain, 4096 + 64).block_bwd == 64  # 128 divides no 4160
    assert attention.fit_blocks(carried, 4096) == carried


_MEMORY_SCRIPT = textwrap.dedent("""
    import json
    import jax
    from realformer_jax.configs import tiny
    from realformer_jax.aot import roofline, targets, train_step
    from realformer_jax.model import encoder

    target = targets.parse('h100:1')

    def config():
      c = tiny.get_config()
      c.model.ln_placement = 'post'
      c.model.attention_impl = 'pallas'
      c.model.remat_policy = 'full'
      c.model.attention_dropout_rate = 0.1
      c.model.dtype = 'bfloat16'
      c.train.global_batch_size = 8
      c.model.scan_unroll = 1  # the rolled scan: its memory analysis is what this test reads
      return c

    out = {}
    for name in ('saved', 'today'):
      if name == 'today':  # full remat saving nothing: the forward runs again going down
        # (the plan still asks the forward for no mask: both variants draw it in the backward)
        encoder.REMAT_POLICIES['full'] = jax.checkpoint_policies.nothing_saveable
      step = train_step.compile_for_target(config(), target, log=lambda line: None)
      est = roofline.estimate(step.resolved.compiled, target)
      calls = {}
      for k in est.kernels:
        if k.opcode == 'custom-call' and 'attention' in k.op_name:
          op = k.op_name.rsplit('/', 2)[-2]
          calls[op] = calls.get(op, 0) + k.count
      out[name] = {'temporaries': step.memory.temporaries, 'calls': calls}
    print(json.dumps(out))
""")


@pytest.mark.slow  # two deviceless compiles of the tiny train step for an H100 (~1-3 min)
def test_an_h100_compile_runs_one_forward_a_layer_and_xla_counts_the_saved_bytes():
  # Triton kernels really lowered for a GPU (not interpret mode): the compiled step runs
  # flash_attention_fwd once a layer (twice before), and XLA's memory analysis, which the
  # 'auto' accumulation and remat choices read, holds the saved output and row statistics.
  done = subprocess.run(
    [sys.executable, '-c', _MEMORY_SCRIPT],
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  layers = 2  # configs/tiny.py: 2 layers, hidden 128, 4 heads (K = 32), L = 128
  saved, today = result['saved'], result['today']
  assert saved['calls']['flash_attention_fwd'] == layers, saved
  assert today['calls']['flash_attention_fwd'] == 2 * layers, today
  # the tiny masks fit the H100's memory: kept by the remat policy
  # (kernels/dropout/remat_masks.py), no
  # separate mask pass
  assert 'attention_dropout_mask' not in saved['calls'], saved
  assert saved['calls']['flash_attention_bwd'] == today['calls']['flash_attention_bwd'] == layers
  stated = layers * fused.saved_for_backward_bytes(8, 128, 4, 32, 2)  # bfloat16 output
  stated += layers * 8 * 4 * 128 * 128 // 8  # and each layer's mask, one bit per element
  added = saved['temporaries'] - today['temporaries']
  assert stated <= added <= stated + 16 * 1024, (added, stated)


@pytest.mark.slow  # ~1-2 min on 2 cores: four interpret-mode encoder gradients
@pytest.mark.parametrize('impl', ['pallas_triton', 'pallas_mosaic'])
def test_encoder_gradients_under_full_remat_are_todays_bit_for_bit(impl, monkeypatch):
  # The whole path against today's exactly: full remat saving nothing and a plan that is not
  # `rematerialised` (the forward stores the mask, the re-run forward hands it to the
  # backward). Post-LN, 2 layers, dropout and attention dropout 0.1, float32 'highest'.
  from realformer_jax.kernels.score_paths import score_path

  config = kernel_config(
    32, ln_placement='post', **FULL_REMAT, dropout_rate=0.1, attention_impl=impl
  )
  ids = jnp.arange(32).reshape(1, 32)
  model = Encoder(config)
  params = model.init(jax.random.key(0), ids)
  weights = jax.random.normal(jax.random.key(2), (1, 32, 32))

  def grads():
    def loss(params):
      y = model.apply(params, ids, deterministic=False, rngs={'dropout': jax.random.key(1)})
      return jnp.sum(y * weights)

    return jax.grad(loss)(params)

  saved = grads()
  real_plan = score_path.plan
  monkeypatch.setattr(
    score_path,
    'plan',
    lambda *a, **k: dataclasses.replace(real_plan(*a, **k), rematerialised=False),
  )
  monkeypatch.setitem(REMAT_POLICIES, 'full', TODAY)
  today = grads()
  for got, want in zip(jax.tree.leaves(saved), jax.tree.leaves(today)):
    np.testing.assert_array_equal(got, want)

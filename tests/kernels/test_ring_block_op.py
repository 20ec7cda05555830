"""The fused `qk` kernels as the ring's per-block op: Triton's block_forward and block_backward
(backends/triton/qk_attention.py, interpret mode on CPU) on each block of a ring of 2 and 4
devices, merged by ring_attention.merge_block, against the attention of the whole sequence
written out here (the slots <= l summed, the running-mean divisor, the padding bias, the
one-device dropout mask of dropout_bits.keep_mask: so each block's global origin reaches the
hash), and the blocks' gradients summed round the ring against its autodiff gradient. Queries
and keys of separate lengths: a block of rows meets every block of columns. float32, matmul
precision 'highest'; the output, the rows' log-sum-exp and every gradient <= 1e-5 relative."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.kernels.backends.triton import qk_attention
from realformer_jax.kernels.dropout.dropout_bits import (
  keep_mask,
  keep_threshold,
  realised_keep_prob,
)
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.kernels.score_paths import ring_attention

pytestmark = pytest.mark.sequence_parallel

N, B, L, H, K = 3, 2, 64, 2, 8  # 16 columns a device at 4: whole philox words
LAYER, KEEP, DIVISOR = 1, 0.5, 2.0


def _inputs():
  rng = np.random.default_rng(0)
  stack = jnp.asarray(rng.normal(size=(2, N, B, L, H, K)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, L, H, K)), jnp.float32)
  bias = jnp.where(np.arange(L) < np.array([[L], [41]]), 0.0, -1e9).astype(jnp.float32)
  scale = jnp.asarray([0.3, 0.5], jnp.float32)
  return stack, v, bias, scale


def _reference(stack, v, bias, scale, key, generator):
  """(out [B, L, H, K], lse [B, H, L]) of the whole sequence."""
  q, k = stack[0, : LAYER + 1], stack[1, : LAYER + 1]
  z = scale[:, None, None, None] * jnp.einsum('nbqhk,nbvhk->bhqv', q, k) / DIVISOR
  z = z + bias[:, None, None, :]
  lse = jax.nn.logsumexp(z, axis=-1)
  p = jnp.exp(z - lse[..., None])
  mask = keep_mask(key, KEEP, (B, H, L, L), generator)
  p = jnp.where(mask, p / realised_keep_prob(KEEP), 0.0)
  return jnp.einsum('bhqv,bvhk->bqhk', p, v), lse


def _kernel_args(scale, key, generator):
  """(spec, fparams, iparams, layer) of the fused block ops."""
  spec = KernelSpec(
    'triton', False, False, keep_threshold(KEEP), H, 16, 16, 16, interpret=True, generator=generator
  )
  fparams = jnp.stack([scale, jnp.full((B,), 1 / DIVISOR, jnp.float32)], axis=1)
  iparams = jnp.concatenate([jax.random.bits(key, (2,), jnp.uint32), jnp.zeros(2, jnp.uint32)])
  return spec, fparams, iparams, jnp.asarray([LAYER], jnp.int32)


def _ring(stack, v, bias, scale, key, generator, shards, with_stats=False):
  """Every device's rows of a ring of `shards`, each block through the fused op (with_stats:
  the rows' (m, log l) instead of their sum)."""
  spec, fparams, iparams, layer = _kernel_args(scale, key, generator)
  n = L // shards
  outs, lses = [], []
  for me in range(shards):
    rows = slice(me * n, (me + 1) * n)
    state = (
      jnp.full((B, H, n), -jnp.inf, jnp.float32),
      jnp.zeros((B, H, n), jnp.float32),
      jnp.zeros((B, n, H, K), jnp.float32),
    )
    for step in range(shards):  # the order a ring meets the blocks in
      owner = (me - step) % shards
      cols = slice(owner * n, (owner + 1) * n)
      origin = jnp.asarray([me * n, owner * n], jnp.int32)
      out_b, stats_b = qk_attention.block_forward(
        stack[0, :, :, rows], stack[1, :, :, cols], v[:, cols], bias[:, cols], fparams,
        iparams, layer, origin, L, spec,
      )  # fmt: skip
      state = ring_attention.merge_block(state, out_b, stats_b)
    m, l, o = state
    outs.append(o / jnp.swapaxes(l, 1, 2)[..., None])
    lses.append((m, jnp.log(l)) if with_stats else m + jnp.log(l))
  return jnp.concatenate(outs, axis=1), jax.tree.map(lambda *x: jnp.concatenate(x, 2), *lses)


def _relative(a, b) -> float:
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


@pytest.mark.slow  # interpret-mode kernels: 20 block calls (~15 s CPU)
@pytest.mark.parametrize('generator', ['threefry', 'philox'])
def test_the_fused_block_op_merged_round_the_ring_is_the_whole_attention(generator):
  inputs, key = _inputs(), jax.random.key(7)
  with jax.default_matmul_precision('highest'):
    out, lse = _reference(*inputs, key, generator)
    for shards in (2, 4):
      ring_out, ring_lse = jax.jit(_ring, static_argnums=(5, 6))(*inputs, key, generator, shards)
      assert _relative(ring_out, out) <= 1e-5, (shards, _relative(ring_out, out))
      assert _relative(ring_lse, lse) <= 1e-5, (shards, _relative(ring_lse, lse))


def _ring_grads(stack, v, bias, scale, key, generator, shards, weights):
  """d sum(out * weights) / d (stack, v, bias, scale) of the ring: each device's rows meet every
  block through block_backward, from the rows' global statistics and delta; each block's key
  gradients summed over the devices (where the ring carries them home)."""
  spec, fparams, iparams, layer = _kernel_args(scale, key, generator)
  out, stats = _ring(stack, v, bias, scale, key, generator, shards, with_stats=True)
  delta = jnp.einsum('bqhk,bqhk->bhq', weights, out)
  n = L // shards
  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)
  g_stack, g_v, g_bias, g_scale = zeros(stack), zeros(v), zeros(bias), zeros(scale)
  for me in range(shards):
    rows = slice(me * n, (me + 1) * n)
    for step in range(shards):
      cols = slice(((me - step) % shards) * n, ((me - step) % shards + 1) * n)
      grads = (
        g_stack[0, :, :, rows],
        g_stack[1, :, :, cols],
        g_v[:, cols],
        g_bias[:, cols],
        g_scale,
      )
      g_q, g_k, g_v_c, g_bias_c, g_scale = qk_attention.block_backward(
        stack[0, :, :, rows], stack[1, :, :, cols], v[:, cols], weights[:, rows],
        jax.tree.map(lambda x: x[:, :, rows], stats), delta[:, :, rows], bias[:, cols], fparams,
        iparams, layer, jnp.asarray([me * n, cols.start], jnp.int32), L, grads, spec,
      )  # fmt: skip
      g_stack = g_stack.at[0, :, :, rows].set(g_q).at[1, :, :, cols].set(g_k)
      g_v, g_bias = g_v.at[:, cols].set(g_v_c), g_bias.at[:, cols].set(g_bias_c)
  return g_stack, g_v, g_bias, g_scale


@pytest.mark.slow  # interpret-mode kernels: 2 x 2 or 4 x 4 forward and backward blocks (~30 s CPU)
@pytest.mark.parametrize('generator, shards, panels', [('threefry', 2, True), ('philox', 4, False)])
def test_the_fused_block_backward_summed_round_the_ring_is_the_whole_gradient(
  generator, shards, panels, monkeypatch
):
  # panels: a dS panel budget of one head's 16 x 16 float32 columns and PANEL_FILL 0 take the
  # block backward's second road, one (batch, head) at a time in 16-column panels (two a
  # 32-column block: dQ summed over them).
  if panels:
    monkeypatch.setattr(qk_attention, 'DS_PANEL_BYTES', 16 * 16 * 4)
    monkeypatch.setattr(qk_attention, 'PANEL_FILL', 0.0)
  inputs, key = _inputs(), jax.random.key(7)
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(B, L, H, K)), jnp.float32)
  loss = lambda *a: jnp.sum(_reference(*a, key, generator)[0] * weights)
  with jax.default_matmul_precision('highest'):
    want = jax.grad(loss, argnums=(0, 1, 2, 3))(*inputs)
    got = jax.jit(_ring_grads, static_argnums=(5, 6))(*inputs, key, generator, shards, weights)
  for name, g, w in zip(('stack', 'v', 'bias', 'scale'), got, want):
    assert _relative(g, w) <= 1e-5, (name, _relative(g, w))
  assert not np.any(got[0][:, LAYER + 1 :])  # slots above the layer: no gradient

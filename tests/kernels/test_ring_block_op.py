"""The fused `qk` kernel as the ring's per-block op, forward: Triton's block_forward
(backends/triton/qk_attention.py, interpret mode on CPU) on each block of a ring of 2 and 4
devices, merged by ring_attention.merge_block, against the attention of the whole sequence
written out here (the slots <= l summed, the running-mean divisor, the padding bias, the
one-device dropout mask of dropout_bits.keep_mask: so each block's global origin reaches the
hash). Queries and keys of separate lengths: a block of rows meets every block of columns.
float32, matmul precision 'highest'; the output and the rows' log-sum-exp <= 1e-5 relative."""

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


def _ring(stack, v, bias, scale, key, generator, shards):
  """Every device's rows of a ring of `shards`, each block through the fused op."""
  spec = KernelSpec(
    'triton', False, False, keep_threshold(KEEP), H, 16, 16, 16, interpret=True, generator=generator
  )
  fparams = jnp.stack([scale, jnp.full((B,), 1 / DIVISOR, jnp.float32)], axis=1)
  iparams = jnp.concatenate([jax.random.bits(key, (2,), jnp.uint32), jnp.zeros(2, jnp.uint32)])
  layer = jnp.asarray([LAYER], jnp.int32)
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
    lses.append(m + jnp.log(l))
  return jnp.concatenate(outs, axis=1), jnp.concatenate(lses, axis=2)


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

"""The ring's fused qk block kernels take the tiles the one-device qk kernels take for a sequence
of the block's length (qk_attention.fit_blocks: the GPU's row of tiles.py, where it divides the
block), not the plan's: each block is one device's queries against one device's keys. Traced
abstractly (jax.eval_shape under an abstract 2-device mesh: nothing compiles or runs), the
forward's and the backward's block kernels spied on for the spec they are handed."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType

from realformer_jax.kernels.backends.triton import qk_attention
from realformer_jax.kernels.dropout.dropout_bits import DRAWS_PER_GENERATOR
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.kernels.score_paths import ring_attention

pytestmark = pytest.mark.sequence_parallel

N, B, H, K, SHARDS = 3, 1, 2, 64, 2
# The plan's tiles (smaller than any GPU row's): what the ring's kernels ran before issue 65's fix
PLAN = KernelSpec('triton', False, False, 0, H, 64, 32, 32)


def _ring_specs(monkeypatch, length: int, plan: KernelSpec = PLAN) -> dict:
  """{kernel: the KernelSpec the ring hands it} for a fused qk ring of SHARDS over `length`
  tokens, philox dropout, forward and backward."""
  seen = {}
  for name in ('block_forward', 'block_backward'):
    real = getattr(qk_attention, name)

    def spy(*args, real=real, name=name):
      seen[name] = args[-1]
      return real(*args)

    monkeypatch.setattr(qk_attention, name, spy)
  shards = ring_attention.SequenceShards(('sequence',), SHARDS)

  def loss(stack, v, bias):
    with nn.logical_axis_rules([('batch', 'data'), ('length', 'sequence')]):
      context, _ = ring_attention.sequence_attention(
        shards, ring_attention.stack_logits, stack[0], stack[1], v, None, bias,
        jnp.float32(0.125), None, jax.random.key(0), 0.9, jnp.bfloat16, carry_out=False,
        generator='philox', block_kernel=plan, layer=jnp.int32(1),
      )  # fmt: skip
    return jnp.sum(context.astype(jnp.float32))

  mesh = AbstractMesh((1, SHARDS), ('data', 'sequence'), axis_types=(AxisType.Auto,) * 2)
  args = (
    jax.ShapeDtypeStruct((2, N, B, length, H, K), jnp.bfloat16),
    jax.ShapeDtypeStruct((B, length, H, K), jnp.bfloat16),
    jax.ShapeDtypeStruct((B, 1, 1, length), jnp.float32),
  )
  with jax.sharding.use_abstract_mesh(mesh):
    jax.eval_shape(jax.grad(loss, argnums=(0, 1)), *args)
  return seen


@pytest.mark.parametrize('chunk', [2048, 1088])  # 1088 = 17 x 64: the row's 128 divides it not
def test_the_ring_block_kernels_take_the_one_device_tiles_of_their_block(monkeypatch, chunk):
  seen = _ring_specs(monkeypatch, SHARDS * chunk)
  one_device = qk_attention.fit_blocks(PLAN, N, chunk, K)  # as qk_carry fits a stack of `chunk`
  tiles = ('block_q', 'block_k', 'block_bwd', 'block_bwd_rows')
  for name, spec in seen.items():
    assert [getattr(spec, t) for t in tiles] == [getattr(one_device, t) for t in tiles], name
    # still whole philox words, and dividing the block (block_forward / block_backward refuse not)
    assert spec.block_k % DRAWS_PER_GENERATOR['philox'] == 0, name
    assert spec.block_bwd % DRAWS_PER_GENERATOR['philox'] == 0, name
    assert chunk % spec.block_q == chunk % spec.block_k == chunk % spec.block_bwd == 0, name
  assert set(seen) == {'block_forward', 'block_backward'}
  if chunk == 2048:  # the GPU row's tiles (DEFAULT on a deviceless host), wider than the plan's
    assert (seen['block_forward'].block_q, seen['block_forward'].block_k) == (128, 128)
    assert (seen['block_backward'].block_bwd, seen['block_backward'].block_bwd_rows) == (64, 128)
  else:  # 128 does not divide 1088: the plan's forward tiles, a square dS tile of the plan's
    assert (seen['block_forward'].block_q, seen['block_forward'].block_k) == (64, 32)
    assert seen['block_backward'].block_bwd_rows == 0


def test_interpret_mode_keeps_the_plans_small_tiles(monkeypatch):
  plan = dataclasses.replace(PLAN, interpret=True)
  seen = _ring_specs(monkeypatch, SHARDS * 2048, plan)
  for name, spec in seen.items():
    assert (spec.block_q, spec.block_k, spec.block_bwd) == (64, 32, 32), name

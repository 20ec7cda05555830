"""The ring-attention op (kernels/score_paths/ring_attention.py) against the einsum path, on 4
forced CPU
devices (a subprocess): the sequence split 2 and 4 ways, with sub-blocks smaller than a
device's block and as large as it (the dropout mask drawn per element and per hash word), the
carried sum in and out, dropout 0.5 from both generators (threefry, philox: whole hash words
and single draws) and padding; values and the gradients of q, k, v, the
carried sum, the padding bias and the score scale. float32, matmul precision 'highest'.
The train-level equalities are tests/train/test_sequence_parallel.py's."""

import json
import subprocess
import sys

import compile_settings
import pytest
from train_fixtures import REPO

pytestmark = pytest.mark.sequence_parallel

_SCRIPT = r"""
import json
import jax, jax.numpy as jnp, numpy as np
import flax.linen as nn
from jax.sharding import AxisType, Mesh
jax.config.update('jax_default_matmul_precision', 'highest')
from realformer_jax.kernels.score_paths import ring_attention
from realformer_jax.model.attention import einsum_attention, mask_bias

B, L, H, K = 2, 32, 2, 8
rng = np.random.default_rng(0)
qkv, prev = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((B, L, 3, H, K), (B, H, L, L)))
bias = mask_bias(jnp.asarray(np.arange(L) < np.array([[L], [21]]), jnp.int32))
scale = jnp.asarray([[[[0.3]]], [[[0.5]]]], jnp.float32)
key, weights = jax.random.key(7), jnp.asarray(rng.normal(size=(B, L, H, K)), jnp.float32)
sum_weights = jnp.asarray(rng.normal(size=(B, H, L, L)), jnp.float32)

def loss(attend, qkv, prev, bias, scale):
  context, acc = attend(qkv, prev, bias, scale)
  return jnp.sum(context * weights) + jnp.sum(acc * sum_weights)

GENERATOR = ['threefry']

def einsum(qkv, prev, bias, scale):
  return einsum_attention(qkv, prev, bias, scale, None, key, 0.5, jnp.float32, None,
                          GENERATOR[0])

def ring(qkv, prev, bias, scale):
  shards = ring_attention.sequence_shards()
  q, k, v = (qkv[:, :, i] for i in range(3))
  return ring_attention.sequence_attention(shards, ring_attention.pair_logits, q, k, v, prev,
      bias, scale, None, key, 0.5, jnp.float32, carry_out=True, generator=GENERATOR[0])

def run(attend, mesh):
  with jax.set_mesh(mesh), nn.logical_axis_rules([('batch', 'data'), ('length', 'sequence')]):
    f = jax.jit(jax.value_and_grad(lambda *a: loss(attend, *a), argnums=(0, 1, 2, 3)))
    return jax.device_get(f(qkv, prev, bias, scale))

def mesh(data, sequence):
  devices = np.array(jax.devices()[: data * sequence]).reshape(data, sequence)
  return Mesh(devices, ('data', 'sequence'), axis_types=(AxisType.Auto,) * 2)

def worst(a, b):
  return max(float(np.max(np.abs(x - y)) / np.max(np.abs(y)))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

report, default_bytes = {}, ring_attention.SUB_BLOCK_BYTES
# Columns a block: 16 (seq2: whole words of both hashes), 8 (seq4: threefry's words, single
# philox draws), 2 (sub-blocks: single draws of both).
for generator in ('threefry', 'philox'):
  GENERATOR[0] = generator
  reference = run(einsum, mesh(1, 1))
  for name, (data, sequence, sub_block_bytes) in {
      'seq2': (1, 2, default_bytes),
      'seq4': (1, 4, default_bytes),
      'data2_seq2_sub_blocks': (2, 2, 4 * 1 * H * (L // 2) * 2),  # 2 columns a sub-block
  }.items():
    ring_attention.SUB_BLOCK_BYTES = sub_block_bytes
    value, grads = run(ring, mesh(data, sequence))
    report[f'{generator}_{name}'] = {
        'value': worst(value, reference[0]), 'grads': worst(grads, reference[1]),
        'bias_grad': float(np.max(np.abs(grads[2])))}
print('RESULTS ' + json.dumps(report))
"""


@pytest.mark.slow  # a subprocess on 4 forced devices, 3 compiles of a tiny op (~15 s CPU)
def test_ring_op_matches_the_einsum_path():
  done = subprocess.run(
    [sys.executable, '-c', _SCRIPT],
    cwd=REPO,
    env=compile_settings.cpu_devices_env(4),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(done.stdout.split('RESULTS ', 1)[1])
  assert len(report) == 6
  for name, result in report.items():
    assert result['value'] <= 1e-5 and result['grads'] <= 1e-5, (name, result)
    assert result['bias_grad'] > 0, name  # the padding bias's gradient is computed, not zeroed


_FUSED_SCRIPT = r"""
import dataclasses, json, sys
import jax, jax.numpy as jnp, numpy as np
import flax.linen as nn
from jax.sharding import AxisType, Mesh
jax.config.update('jax_default_matmul_precision', 'highest')
from realformer_jax.kernels.score_paths import ring_attention
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.model.attention import mask_bias

N, B, L, H, K, LAYER = 3, 2, 128, 2, 8, 1  # 16 columns a device at 8: whole philox words
rng = np.random.default_rng(0)
shapes = ((2, N, B, L, H, K), (B, L, H, K))
stack, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes)
bias = mask_bias(jnp.asarray(np.arange(L) < np.array([[L], [77]]), jnp.int32))
scale = jnp.asarray([[[[0.3]]], [[[0.5]]]], jnp.float32)
key, weights = jax.random.key(7), jnp.asarray(rng.normal(size=(B, L, H, K)), jnp.float32)
used = (jnp.arange(N) <= LAYER).astype(jnp.float32)[:, None, None, None, None]
KERNEL = KernelSpec('triton', False, False, 0, H, 16, 16, 16, interpret=True)

def loss(block_kernel, generator, stack, v, bias, scale):
  shards = ring_attention.sequence_shards()
  context, _ = ring_attention.sequence_attention(
      shards, ring_attention.stack_logits, stack[0] * used, stack[1], v, None, bias, scale,
      jnp.float32(2.0), key, 0.5, jnp.float32, carry_out=False, generator=generator,
      block_kernel=block_kernel, layer=jnp.int32(LAYER))
  return jnp.sum(context * weights), context

def run(block_kernel, generator, sequence):
  mesh = Mesh(np.array(jax.devices()[:sequence]).reshape(1, sequence), ('data', 'sequence'),
              axis_types=(AxisType.Auto,) * 2)
  with jax.set_mesh(mesh), nn.logical_axis_rules([('batch', 'data'), ('length', 'sequence')]):
    f = jax.jit(jax.value_and_grad(lambda *a: loss(block_kernel, generator, *a),
                                   argnums=(0, 1, 2, 3), has_aux=True))
    return jax.device_get(f(stack, v, bias, scale))

def worst(a, b):
  return max(float(np.max(np.abs(x - y)) / np.max(np.abs(y)))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

report = {}
for generator, sequence in (('threefry', 2), ('philox', 4), ('threefry', 8)):
  einsum, fused = run(None, generator, sequence), run(KERNEL, generator, sequence)
  report[f'{generator}_seq{sequence}'] = {
      'value': worst(fused[0][1], einsum[0][1]), 'grads': worst(fused[1], einsum[1]),
      'bias_grad': float(np.max(np.abs(fused[1][2])))}
print('RESULTS ' + json.dumps(report))
"""


@pytest.mark.slow  # a subprocess on 8 forced devices, interpret-mode kernels (~60 s CPU)
def test_the_fused_block_op_ring_matches_the_einsum_ring():
  """residual_carry='qk' on the ring with the Triton qk block kernel (interpret mode) as the
  forward's per-block op (RingSpec.block_kernel) against the einsum formula's ring: sequence
  axes of 2, 4 and 8, dropout 0.5 from both generators, padding, the running-mean divisor; the
  context and the gradients of the query and key stacks, v, the padding bias and the score scale
  (the backward is the einsum ring's, from the fused forward's output and statistics)."""
  done = subprocess.run(
    [sys.executable, '-c', _FUSED_SCRIPT],
    cwd=REPO,
    env=compile_settings.cpu_devices_env(8),
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(done.stdout.split('RESULTS ', 1)[1])
  assert len(report) == 3
  for name, result in report.items():
    assert result['value'] <= 1e-5 and result['grads'] <= 1e-5, (name, result)
    assert result['bias_grad'] > 0, name

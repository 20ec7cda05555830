"""Sharding is configuration: on 8 (fake) devices, data parallel, FSDP and FSDP x tensor
parallel lay parameters out as the rules say and compute the same training steps (the
data x fsdp x tensor case guards an XLA partitioner bug, see heads.py). Runs in a subprocess:
the device count is fixed when JAX starts. Mesh equivalence through the CLI, cross-mesh resume
and multi-process runs are in test_scale_out.py."""

import json
import subprocess
import sys

import compile_settings
import numpy as np
import pytest
import subprocesses
from train_fixtures import REPO

_SCRIPT = r"""
import json, sys
import jax
import numpy as np
jax.config.update('jax_disable_most_optimizations', True)
sys.path.insert(0, 'tests')
from train_fixtures import make_setup, synthetic_batch, tiny_config
from realformer_jax import train
from realformer_jax.train import build

def spec(x):
  return [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]

def shard_shape(x):
  return list(x.sharding.shard_shape(x.shape))

results = {}
for name, shape in [('dp', (8, 1, 1)), ('fsdp', (1, 8, 1)), ('fsdp_tp', (2, 2, 2))]:
  config = tiny_config(mesh__shape=shape)
  setup = make_setup(config)
  key = jax.random.key(0)
  state = setup.init_state(key)
  compiled = build.compile_train_step(setup)
  rng = jax.device_put(key, setup.replicated)
  losses = []
  for seed in range(2):
    batch = build.global_batch(synthetic_batch(config, seed), setup.batch_sharding)
    state, metrics = compiled(state, batch, rng)
    losses.append(float(metrics['mlm_loss_sum']))
  params = state.params
  mu = state.opt_state[1][0].mu
  results[name] = {
      'losses': losses,
      'params': [np.asarray(x).ravel()[:64].tolist() for x in jax.tree.leaves(params)],
      'word_spec': spec(params['encoder']['embeddings']['word']['embedding']),
      'qkv_spec': spec(params['encoder']['layers']['attention']['qkv']['kernel']),
      'mu_qkv_spec': spec(mu['encoder']['layers']['attention']['qkv']['kernel']),
      'wi_spec': spec(params['encoder']['layers']['mlp']['wi']['kernel']),
      'word_shard': shard_shape(params['encoder']['embeddings']['word']['embedding']),
      'qkv_shard': shard_shape(params['encoder']['layers']['attention']['qkv']['kernel']),
      'argument_bytes': compiled.memory_analysis().argument_size_in_bytes,
  }
print('RESULTS ' + json.dumps(results))
"""


@pytest.mark.slow
def test_data_fsdp_and_tensor_parallel_layouts_on_8_devices():
  # 8 forced CPU devices, also on a machine with an accelerator.
  results = subprocesses.script_results(_SCRIPT, devices=8, timeout=300)
  dp, fsdp, fsdp_tp = results['dp'], results['fsdp'], results['fsdp_tp']

  # Same rules everywhere; the mesh shape decides what is actually split.
  assert dp['word_shard'] == [8000, 32] and dp['qkv_shard'] == [2, 32, 3, 2, 16]
  assert fsdp['word_shard'] == [8000, 4] and fsdp['qkv_shard'] == [2, 4, 3, 2, 16]
  assert fsdp_tp['word_shard'] == [4000, 16] and fsdp_tp['qkv_shard'] == [2, 16, 3, 1, 16]
  assert fsdp_tp['word_spec'] == ['tensor', 'fsdp']
  assert fsdp_tp['qkv_spec'] == [None, 'fsdp', None, 'tensor', None]
  assert fsdp_tp['wi_spec'] == [None, 'fsdp', 'tensor']
  assert fsdp_tp['mu_qkv_spec'] == fsdp_tp['qkv_spec']  # Adam moments sharded like params
  # Parameters + optimizer state dominate the step's inputs: FSDP holds ~1/8 per device.
  assert fsdp['argument_bytes'] < 0.2 * dp['argument_bytes']

  for other in (fsdp, fsdp_tp):
    np.testing.assert_allclose(other['losses'], dp['losses'], rtol=1e-5)
    for a, b in zip(other['params'], dp['params']):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

"""Sharding is configuration: on 8 (fake) devices, data parallel, FSDP and FSDP x tensor
parallel lay parameters out as the rules say and compute the same training steps; two
processes train together through jax.distributed. Runs in subprocesses: the device count is
fixed when JAX starts."""

import json
import os
import re
import socket
import subprocess
import sys

import numpy as np

from train_fixtures import REPO, cli_flags, run_train_cli

_SCRIPT = r'''
import json, sys
import jax
import numpy as np
jax.config.update('jax_disable_most_optimizations', True)
sys.path.insert(0, 'tests')
from train_fixtures import synthetic_batch, tiny_config
from realformer_jax import train
from realformer_jax.train import partitioning, state as state_lib

def spec(x):
  return [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]

def shard_shape(x):
  return list(x.sharding.shard_shape(x.shape))

results = {}
for name, shape in [('dp', (8, 1, 1)), ('fsdp', (1, 8, 1)), ('fsdp_tp', (2, 2, 2))]:
  config = tiny_config(mesh__shape=shape)
  setup = train.make_setup(config)
  key = jax.random.key(0)
  state = state_lib.init_state(setup.model, setup.tx, config.data, setup.layout, key,
                               setup.mesh, setup.rules)
  compiled = train.compile_train_step(config, setup)
  rng = jax.device_put(key, setup.replicated)
  losses = []
  for seed in range(2):
    batch = partitioning.global_batch(synthetic_batch(config, seed), setup.batch_sharding)
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
'''


def test_data_fsdp_and_tensor_parallel_layouts_on_8_devices(tmp_path):
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8')
  done = subprocess.run([sys.executable, '-c', _SCRIPT], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(done.stdout.split('RESULTS ', 1)[1])
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


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_two_processes_train_together_and_one_resumes(tmp_path):
  port = _free_port()
  procs = [
      run_train_cli(tmp_path, *cli_flags(
          train__num_train_steps=6, train__stop_at_step=4, train__checkpoint_every_steps=2,
          train__log_every_steps=2, distributed__num_processes=2,
          distributed__process_id=index, distributed__coordinator_address=f'127.0.0.1:{port}'),
          stderr=subprocess.STDOUT)
      for index in range(2)]
  outputs = [proc.communicate(timeout=240)[0] for proc in procs]
  for proc, output in zip(procs, outputs):
    assert proc.returncode == 0, output[-3000:]
  assert "mesh {'data': 2, 'fsdp': 1, 'tensor': 1}, 2 process(es)" in outputs[0]
  assert re.search(r'final eval MLM accuracy [\d.]+ vs most-frequent-token baseline', outputs[0])
  assert 'final eval' not in outputs[1] and 'step 2/4' not in outputs[1]  # only process 0 logs
  # One shared checkpoint; each process saved the (global) data position.
  data_dir = tmp_path / 'checkpoints' / '4' / 'data'
  positions = [json.loads((data_dir / f'process_{i}-of-2.json').read_text()) for i in range(2)]
  assert positions[0] == positions[1] and positions[0]['next_position'] == 4 * 8

  # A single process picks the run up from the two-process checkpoint.
  proc = run_train_cli(tmp_path, *cli_flags(train__num_train_steps=6,
                                            train__checkpoint_every_steps=2),
                       stderr=subprocess.STDOUT)
  output = proc.communicate(timeout=240)[0]
  assert proc.returncode == 0, output[-3000:]
  assert 'resumed from the checkpoint at step 4' in output and 'step 6/6' in output

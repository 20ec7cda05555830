"""Helpers for the scale-out tests: run the real training CLI in subprocesses with a forced
number of CPU devices (JAX must see the device count before it initialises, so never in the
pytest process), read back losses and parameters; run the check scripts (tests/*_check.py) the
same way and read their reports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Sequence

import numpy as np

# Also imported as tests.scale_out_support (by the *_check.py scripts, run with -m from the
# repository root, where tests/ itself is not on the path).
from tests import compile_settings, jit_cache, repo_paths

REPO = repo_paths.REPO

# A model small enough to compile in seconds, with 8 heads so that every mesh axis of size
# up to 8 divides heads, FFN, vocabulary and batch.
TINY_SHARDED = (
  '--config.model.num_layers=2',
  '--config.model.hidden_size=64',
  '--config.model.num_heads=8',
  '--config.model.mlp_dim=128',
  '--config.model.max_len=32',
  '--config.model.dropout_rate=0.1',
  '--config.model.attention_dropout_rate=0.1',
  '--config.data.vocab_size=1000',
  '--config.data.max_len=32',
  '--config.data.max_predictions=5',
  '--config.data.eval_batches=2',
  '--config.train.global_batch_size=16',
  '--config.train.num_train_steps=5',
  '--config.train.warmup_steps=2',
  '--config.train.log_every_steps=1',
  '--config.train.eval_every_steps=1000',
  '--config.train.checkpoint_every_steps=1000',
  '--config.train.keep_checkpoints=5',
)


def device_env(num_devices: int) -> dict[str, str]:
  env = compile_settings.cpu_devices_env(num_devices)
  env['JAX_DISABLE_MOST_OPTIMIZATIONS'] = 'true'  # compile time dominates these tiny runs
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  return env


def run_check(
  module: str, num_devices: int = 1, optimised: bool = False, args: Sequence[str] = ()
) -> dict:
  """The report of a check script (`python -m tests.<module> ARGS` on `num_devices` forced CPU
  devices): the JSON of its last stdout line. `optimised`: XLA's optimisations on, where the
  check is about the optimised program (device_env, like tests/conftest.py, turns them off)."""
  env = device_env(num_devices)
  if optimised:
    env['JAX_DISABLE_MOST_OPTIMIZATIONS'] = 'false'
    env['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={num_devices}'  # XLA's defaults
  result = subprocess.run(
    [sys.executable, '-m', f'tests.{module}', *args],
    env=env,
    cwd=REPO,
    text=True,
    capture_output=True,
    timeout=900,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  return json.loads(result.stdout.strip().splitlines()[-1])


def train_env(num_devices: int) -> dict[str, str]:
  """device_env for the training CLI (CPU programs): with the session's compilation cache, so a
  rerun, a resume or another test's run on the same mesh loads its steps instead of compiling."""
  return {**device_env(num_devices), **jit_cache.env()}


def prepare_tiny_data(path: str) -> str:
  """The embedded corpus and a 1,000-piece tokenizer prepared into `path` at max_len 32, the
  data every TINY_SHARDED run reads (once per test module: a module-scoped fixture)."""
  from realformer_jax import data  # pylint: disable=import-outside-toplevel
  from realformer_jax.configs import tiny  # pylint: disable=import-outside-toplevel

  config = tiny.get_config()
  config.data.data_dir = path
  config.data.vocab_size = 1000
  config.data.max_len = 32
  data.prepare(config.data)
  return path


def train_command(workdir: str, data_dir: str, mesh_shape: str, *extra: str) -> list[str]:
  return [
    sys.executable,
    '-m',
    'experiments.train',
    '--config=configs/tiny.py',
    f'--workdir={workdir}',
    f'--config.data.data_dir={data_dir}',
    f'--config.mesh.shape={mesh_shape}',
    *TINY_SHARDED,
    *extra,
  ]


def run_all(
  jobs: Sequence[tuple[list[str], dict]], parallel: int = 2, timeout: float = 600
) -> list[subprocess.CompletedProcess]:
  """Runs (command, env) jobs, `parallel` at a time; raises with the output of any failure,
  killing the jobs still running (the other processes of a multi-process run would otherwise
  wait for their peer until the coordinator gives up)."""
  results: list = [None] * len(jobs)
  running: list[tuple[int, subprocess.Popen]] = []
  pending = list(enumerate(jobs))
  try:
    while pending or running:
      while pending and len(running) < parallel:
        index, (command, env) = pending.pop(0)
        running.append(
          (
            index,
            subprocess.Popen(
              command,
              env=env,
              cwd=REPO,
              text=True,
              stdout=subprocess.PIPE,
              stderr=subprocess.STDOUT,
            ),
          )
        )
      index, process = running[0]
      output, _ = process.communicate(timeout=timeout)
      running.pop(0)
      results[index] = subprocess.CompletedProcess(process.args, process.returncode, output)
      if process.returncode != 0:
        raise AssertionError(f'{" ".join(process.args)}\nexited {process.returncode}:\n{output}')
  finally:
    for _, process in running:
      process.kill()
      process.communicate()
  return results


def train_losses(workdir: str) -> dict[int, float]:
  from realformer_jax.train import read_scalars

  return dict(read_scalars(workdir)['train/loss'])


def process_jobs(command, processes: int, devices_each: int) -> list[tuple[list[str], dict]]:
  """run_all's jobs for one run as `processes` processes of `devices_each` forced CPU devices:
  `command(*flags)` with each process's distributed flags (a free localhost port for the
  coordinator)."""
  port = free_port()
  return [
    (
      command(
        f'--config.distributed.num_processes={processes}',
        f'--config.distributed.process_id={i}',
        f'--config.distributed.coordinator_address=127.0.0.1:{port}',
      ),
      train_env(devices_each),
    )
    for i in range(processes)
  ]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def tiny_sharded_config():
  """configs/tiny.py with TINY_SHARDED's flags applied, as the CLI runs it (in process, for
  the checks and for reading back what the CLI wrote)."""
  from realformer_jax.configs import tiny

  config = tiny.get_config()
  for flag in TINY_SHARDED:
    key, value = flag[len('--config.') :].split('=')
    section, field = key.split('.')
    current = config[section][field]
    config[section][field] = (
      type(current)(float(value))
      if isinstance(current, (int, float)) and not isinstance(current, bool)
      else value
    )
  return config


def restore_params(workdir: str, data_dir: str, step: int):
  """Params of the checkpoint at `step`, restored onto this process's single device (the
  checkpoints were written from 8-device meshes or 2 processes)."""
  import orbax.checkpoint as ocp
  from ml_collections import config_flags  # noqa: F401  (registers the flag types)

  from realformer_jax.train import build, pretraining

  config = tiny_sharded_config()
  config.data.data_dir = data_dir
  config.mesh.shape = (1, 1, 1)
  setup = build.make_setup(pretraining.validate_config(config))
  manager = ocp.CheckpointManager(
    os.path.join(workdir, 'checkpoints'), item_names=('state', 'rng', 'data')
  )
  restored = manager.restore(
    step, args=ocp.args.Composite(state=ocp.args.StandardRestore(setup.layout.abstract))
  )
  manager.close()
  return restored.state.params


def relative_difference(a, b) -> float:
  """max over leaves of ||a - b|| / ||b||."""
  import jax

  worst = 0.0
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    worst = max(worst, float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-12)))
  return worst

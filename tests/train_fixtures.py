"""A tiny training config on the shared prepared bible_web corpus (see data_fixtures.py).

Sizes are chosen for CI (2 cores): a 2-layer, 32-wide RealFormer on 32-token sequences.
`cli_flags` turns the same overrides into `--config.a.b=v` flags for subprocess runs.
"""

import os
import subprocess
import sys

import jit_cache
import ml_collections
import numpy as np
import pytest
import repo_paths
from data_fixtures import bible_config

from realformer_jax import data
from realformer_jax.train import default_config

REPO = repo_paths.REPO

# The suite's toy model (fine-tuning's too, finetune_fixtures.py): dropout on, so that a resume
# is exact only with the PRNG key.
TINY_MODEL = {
  'num_layers': 2,
  'hidden_size': 32,
  'num_heads': 2,
  'mlp_dim': 64,
  'max_len': 32,
  'ln_placement': 'realformer',
  'dropout_rate': 0.1,
  'attention_dropout_rate': 0.1,
}
TINY_OVERRIDES = {
  **{f'model.{field}': value for field, value in TINY_MODEL.items()},
  'data.max_len': 32,
  'data.max_predictions': 5,
  'data.eval_batches': 2,
  'train.global_batch_size': 8,
  'train.num_train_steps': 8,
  'train.warmup_steps': 2,
  'train.learning_rate': 3e-3,
  'train.log_every_steps': 2,
  'train.eval_every_steps': 4,
  'train.checkpoint_every_steps': 4,
  'train.keep_checkpoints': 5,
}


def tiny_config(**overrides) -> ml_collections.ConfigDict:
  """Keyword names use '__' for '.', e.g. tiny_config(train__num_train_steps=4)."""
  config = default_config()
  config.data.update(bible_config())  # shared data dir; prepared once per test session
  for path, value in {**TINY_OVERRIDES, **_dotted(overrides)}.items():
    section, field = path.split('.')
    config[section][field] = value
  return config


@pytest.fixture(scope='module')
def shared_compiles():
  """The session's compilation cache (jit_cache.in_process) for a module whose in-process runs
  train tiny_config's programs again and again (a straight run and its resumed halves, one
  workdir per fault): a repeat loads the steps instead of compiling them. For modules that
  measure no compile."""
  with jit_cache.in_process():
    yield


def synthetic_batch(config, seed=0):
  """A synthetic batch with the data contract's shapes, some slots unused (weight 0)."""
  rng = np.random.default_rng(seed)
  b, l, p = config.train.global_batch_size, config.data.max_len, config.data.max_predictions
  weights = (rng.random((b, p)) < 0.8).astype(np.float32)
  return {
    'input_ids': rng.integers(5, config.data.vocab_size, (b, l), dtype=np.int32),
    'segment_ids': np.zeros((b, l), np.int32),
    'input_mask': (np.arange(l) < rng.integers(l // 2, l + 1, (b, 1))).astype(np.int32),
    'masked_positions': rng.integers(1, l // 2, (b, p), dtype=np.int32),
    'masked_ids': rng.integers(5, config.data.vocab_size, (b, p), dtype=np.int32),
    'masked_weights': weights,
  }


def _dotted(overrides: dict) -> dict:
  return {k.replace('__', '.'): v for k, v in overrides.items()}


def cli_flags(**overrides) -> list[str]:
  values = {**TINY_OVERRIDES, 'data.data_dir': bible_config().data_dir, **_dotted(overrides)}
  return [f'--config.{k}={v}' for k, v in values.items()]


def run_train_cli(workdir, *flags, env=None, **popen_kwargs):
  """`python -m experiments.train --config=configs/tiny.py --workdir=...` as a Popen, with the
  suite's JAX settings (conftest.py) and the shared corpus prepared beforehand."""
  data.prepare(bible_config())
  command = [
    sys.executable,
    '-m',
    'experiments.train',
    '--config=configs/tiny.py',
    f'--workdir={workdir}',
    *flags,
  ]
  full_env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS='true', **(env or {}))
  popen_kwargs.setdefault('stderr', subprocess.PIPE)
  return subprocess.Popen(
    command, cwd=REPO, env=full_env, stdout=subprocess.PIPE, text=True, **popen_kwargs
  )


def make_setup(config):
  """The setup of `config` on this process's devices (validated as the training loop does)."""
  import jax

  from realformer_jax.train import build, pretraining

  return build.make_setup(
    pretraining.validate_config(
      config, device_count=jax.device_count(), process_count=jax.process_count()
    )
  )

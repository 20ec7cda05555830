"""Helpers of the fault-injection tests (test_faults_*.py): the training CLI as a subprocess
(optionally with faults from fault_launcher.py), its one-line outcome, checkpoints on disk,
and ways to damage a file.

Subprocess runs share the session's persistent JAX compilation cache (jit_cache.py): every run
compiles the same tiny steps, and loading them from the cache halves a run's time.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import jit_cache
import numpy as np
import orbax.checkpoint as ocp
import pytest
import subprocesses
from data_fixtures import bible_config
from train_fixtures import REPO, TINY_OVERRIDES, cli_flags

from realformer_jax import data

ERROR_LINE = re.compile(r'^error: \S.*$')

# The run every checkpoint fault starts from: checkpoints at 4, 6, 8 (kept 3), a log line per
# step, evaluations at 3 and 6. Dropout is on (tiny_config), so an exact resume also needs the
# PRNG key and the data position.
RUN = dict(
  train__num_train_steps=8,
  train__checkpoint_every_steps=2,
  train__keep_checkpoints=3,
  train__log_every_steps=1,
  train__eval_every_steps=3,
  train__warmup_steps=2,
)


def cli_config(**overrides):
  """The config the CLI of `start` trains (configs/tiny.py with the same overrides), for
  in-process checks of its workdirs."""
  from realformer_jax.configs import tiny  # pylint: disable=import-outside-toplevel

  config = tiny.get_config()
  values = {
    **TINY_OVERRIDES,
    'data.data_dir': bible_config().data_dir,
    **{k.replace('__', '.'): v for k, v in {**RUN, **overrides}.items()},
  }
  for path, value in values.items():
    section, field = path.split('.')
    config[section][field] = value
  return config


def env(faults: str = '') -> dict:
  """The environment of a CLI run: the suite's JAX settings (conftest.py), the shared
  compilation cache, and the faults for fault_launcher.py."""
  return dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    JAX_DISABLE_MOST_OPTIMIZATIONS='true',
    **jit_cache.env(),
    REALFORMER_TEST_FAULTS=faults,
  )


def command(workdir, faults: str = '', **overrides) -> list[str]:
  """`python -m experiments.train --config=configs/tiny.py` at RUN (plus `overrides`) on the
  shared test corpus, through fault_launcher.py when `faults` are given."""
  data.prepare(bible_config())  # the corpus and tokenizer, once per session
  entry = (
    [os.path.join(REPO, 'tests', 'fault_launcher.py')] if faults else ['-m', 'experiments.train']
  )
  return [
    sys.executable,
    *entry,
    '--config=configs/tiny.py',
    f'--workdir={workdir}',
    *cli_flags(**{**RUN, **overrides}),
  ]


def start(workdir, faults: str = '', **overrides) -> subprocess.Popen:
  return subprocess.Popen(
    command(workdir, faults, **overrides),
    cwd=REPO,
    env=env(faults),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def run(workdir, faults: str = '', timeout: float = 300, **overrides):
  """(exit status, stdout, stderr) of a finished `start`."""
  proc = start(workdir, faults, **overrides)
  out, err = proc.communicate(timeout=timeout)
  return proc.returncode, out, err


# A toy run with checkpoints at steps 2 and 4 and one evaluation (the final one).
TRAINED = dict(train__num_train_steps=4, train__eval_every_steps=4, train__keep_checkpoints=3)


def trained_workdir(tmp_path_factory, name: str) -> tuple[str, str]:
  """(workdir, stdout) of a finished `experiments.train` at TRAINED's toy size."""
  workdir = str(tmp_path_factory.mktemp(name) / 'run')
  code, out, err = run(workdir, **TRAINED)
  assert code == 0, out + err
  return workdir, out


def cli(module: str, *args, timeout: float = 600) -> subprocess.CompletedProcess:
  """`python -m module args...` from the repository root, in the faults' environment."""
  return subprocess.run(
    [sys.executable, '-m', module, *args],
    cwd=REPO,
    env=env(),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def the_line(stderr: str, pattern: str) -> re.Match:
  """stderr is exactly one line and it matches `pattern` (a regex for the whole line), not
  counting orbax's note that a save waited for the previous one (a slow or busy disk)."""
  lines = unexpected_stderr(stderr)
  assert len(lines) == 1, stderr
  match = re.fullmatch(pattern, lines[0])
  assert match, lines[0]
  return match


def run_saying(workdir, returncode: int, pattern: str, faults: str = '', **overrides) -> str:
  """A finished `start` that exits with `returncode` and says one stderr line matching
  `pattern` (the_line); its stdout."""
  code, out, err = run(workdir, faults, **overrides)
  assert code == returncode, out + err
  the_line(err, pattern)
  return out


def wait_for_line(stream, pattern: str, seen: list) -> str:
  """Reads `stream` until a line matches `pattern`; every line read is appended to `seen`."""
  for line in stream:
    seen.append(line)
    if re.search(pattern, line):
      return line
  raise AssertionError(f'{pattern!r} never printed:\n' + ''.join(seen))


def unexpected_stderr(stderr: str) -> list[str]:
  """stderr lines other than fault_launcher's markers, orbax's note that a save waited for
  the previous one (which the slow-save fault causes) and data preparation's progress lines
  (data/progress.py: plain lines 'prepare <phase>: ...', printed whenever a run prepares its
  data)."""
  return [
    line
    for line in stderr.splitlines()
    if not line.startswith('FAULT: ')
    and 'Waiting for previous save' not in line
    and not re.match(r'prepare [a-z+ ]+: ', line)
  ]


def _private_mounts_available() -> bool:
  try:
    return (
      subprocess.run(['unshare', '-Urm', 'true'], capture_output=True, timeout=30).returncode == 0
    )
  except (OSError, subprocess.SubprocessError):
    return False


# A real full disk needs a private tmpfs: the tests that fill one skip where unshare is refused.
NEEDS_PRIVATE_MOUNTS = pytest.mark.skipif(
  not _private_mounts_available(), reason='a real full disk needs a private tmpfs (unshare -Urm)'
)


def in_private_mounts(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
  """The finished shell `script` in a private mount namespace (unshare -Urm: it may mount a
  small tmpfs), from the repository root in the faults' environment."""
  return subprocesses.run(['unshare', '-Urm', 'sh', '-c', script], env=env(), timeout=timeout)


def terminate(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 120):
  proc.send_signal(sig)
  return proc.communicate(timeout=timeout)


def shell_join(command: list[str]) -> str:
  return shlex.join(command)


def read_json(path):
  with open(path) as f:
    return json.load(f)


def committed_steps(workdir) -> list[int]:
  directory = os.path.join(workdir, 'checkpoints')
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def checkpoint_entries(workdir) -> list[str]:
  return sorted(os.listdir(os.path.join(workdir, 'checkpoints')))


def saved_state(workdir, step: int) -> dict:
  """The train state saved at `step`, as numpy arrays."""
  path = os.path.join(os.path.abspath(workdir), 'checkpoints', str(step), 'state')
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(path)


def assert_same_state(a: dict, b: dict) -> None:
  leaves_a, leaves_b = _leaves(a), _leaves(b)
  assert leaves_a.keys() == leaves_b.keys()
  for key in leaves_a:
    np.testing.assert_array_equal(leaves_a[key], leaves_b[key], err_msg=key)


def _leaves(tree, prefix=''):
  if isinstance(tree, dict):
    out = {}
    for key, value in tree.items():
      out.update(_leaves(value, f'{prefix}/{key}'))
    return out
  if isinstance(tree, (list, tuple)):
    out = {}
    for i, value in enumerate(tree):
      out.update(_leaves(value, f'{prefix}/{i}'))
    return out
  return {prefix: np.asarray(tree)}


def restore_latest(workdir, config, setup):
  """(what Checkpointer.restore_latest returns, its warnings) for `config` and its `setup`,
  the data iterator and the checkpointer closed again."""
  from realformer_jax.train.checkpointing import Checkpointer  # pylint: disable=import-outside-toplevel

  warnings = []
  train_iter = data.make_train_iterator(
    config.data, config.train.global_batch_size, config.train.seed
  )
  checkpointer = Checkpointer(workdir, keep=3)
  try:
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=setup.replicated)
    restored = checkpointer.restore_latest(
      setup.layout.abstract, key, train_iter, warn_fn=warnings.append
    )
  finally:
    checkpointer.close()
    train_iter.close()
  return restored, warnings


def copy_workdir(source, target) -> str:
  shutil.copytree(source, target)
  return str(target)


def largest_file(directory) -> str:
  files = [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]
  return max(files, key=os.path.getsize)


def truncate(path, size: int) -> None:
  os.truncate(path, size)


def flip_bytes(path, offset: int, count: int = 16) -> None:
  with open(path, 'r+b') as f:
    f.seek(offset)
    data = f.read(count)
    f.seek(offset)
    f.write(bytes(b ^ 0xFF for b in data))

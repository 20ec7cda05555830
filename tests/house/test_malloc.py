"""glibc malloc settings: the environment they need and the self re-exec that applies them."""

import os
import subprocess
import sys

import pytest
import repo_paths

from realformer_jax import malloc
from tests.train_fixtures import run_train_cli

REPO = repo_paths.REPO


def test_environment_adds_the_tunables_once(monkeypatch):
  monkeypatch.delenv('GLIBC_TUNABLES', raising=False)
  assert malloc.environment('default') is None
  env = malloc.environment('retain')
  assert env['GLIBC_TUNABLES'] == malloc.TUNABLES['retain']
  monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.tcache_count=0')
  assert malloc.environment('hugepages')['GLIBC_TUNABLES'] == (
    'glibc.malloc.tcache_count=0:' + malloc.TUNABLES['hugepages']
  )
  monkeypatch.setenv('GLIBC_TUNABLES', malloc.TUNABLES['retain'])
  assert malloc.environment('retain') is None  # already running under it: no second exec
  with pytest.raises(ValueError, match="malloc mode 'fast': must be one of"):
    malloc.environment('fast')


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc only')
def test_reexec_keeps_the_pid_and_command_line_and_sets_the_variable():
  script = (
    'import os, sys; print("start", os.getpid(), sys.argv[1:], flush=True); '
    'from realformer_jax import malloc; malloc.reexec_with("retain"); '
    'print("after", os.getpid(), os.environ["GLIBC_TUNABLES"])'
  )
  env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}
  out = subprocess.run(
    [sys.executable, '-c', script, 'x', '--flag=1'],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
    check=True,
  ).stdout.split('\n')
  starts = [line for line in out if line.startswith('start')]
  after = [line for line in out if line.startswith('after')]
  assert len(starts) == 2 and starts[0] == starts[1]  # ran twice, same PID and arguments
  assert starts[0].endswith("['x', '--flag=1']")
  assert after == [f'after {starts[0].split()[1]} {malloc.TUNABLES["retain"]}']


@pytest.mark.slow  # a training CLI in a subprocess (~4 s CPU)
def test_training_cli_with_retain_still_fails_fast_with_one_line(tmp_path):
  proc = run_train_cli(tmp_path, '--malloc=retain', '--config.model.num_heads=3')
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 1
  assert [l for l in stderr.splitlines() if l.startswith('error:')] == [
    'error: model.num_heads=3: must divide model.hidden_size=128'
  ]

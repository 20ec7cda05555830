"""`--help` of every command in experiments/ and benchmarks/ exits 0 and says what the command does
(absl's own --help exits 1: realformer_jax/commands/cli.py answers it first); experiments.train's
points to docs/training.md. The commands are found by their `__main__` block, so a new one is
covered without a list to keep."""

import glob
import os
import re
import subprocess
import sys

import pytest
import repo_paths

from realformer_jax.commands import scripts

REPO = repo_paths.REPO


def commands() -> list[str]:
  found = []
  for package in ('experiments', 'benchmarks'):
    for path in sorted(glob.glob(os.path.join(REPO, package, '*.py'))):
      with open(path, encoding='utf-8') as f:
        if "if __name__ == '__main__':" in f.read():
          found.append(f'{package}.{os.path.basename(path)[:-3]}')
  return found


def _help(command: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, '-m', command, '--help'],
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    timeout=300,
  )


def _source(command: str) -> str:
  with open(os.path.join(REPO, *command.split('.')) + '.py', encoding='utf-8') as f:
    return f.read()


def _first_docstring_line(command: str) -> str:
  """Of the module --help describes: an entry point of experiments/ runs its command of
  realformer_jax/commands/ (`scripts.<name>()`), whose docstring absl prints."""
  runs = re.search(r'scripts\.(\w+)\(\)', _source(command))
  source = _source(getattr(scripts, runs.group(1)).module if runs else command)
  return source.split('"""', 1)[1].strip().splitlines()[0].lstrip('r')


@pytest.mark.slow
def test_train_help_exits_0_and_points_to_the_guide():
  result = _help('experiments.train')
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'docs/training.md' in result.stdout and '--workdir' in result.stdout
  assert 'README' not in result.stdout  # its sections moved to docs/


@pytest.mark.slow
@pytest.mark.parametrize('command', [c for c in commands() if c != 'experiments.train'])
def test_every_command_help_exits_0(command):
  result = _help(command)
  assert result.returncode == 0, result.stdout[-1000:] + result.stderr[-2000:]
  words = _first_docstring_line(command).split()[:3]
  assert ' '.join(words) in ' '.join(result.stdout.split()), (words, result.stdout[:500])

"""The tree passes the linter and the formatter configured in pyproject.toml ([tool.ruff]).

Fix a failure with `ruff check --fix . && ruff format .` (then read the diff).
"""

import subprocess
import sys

import pytest
import repo_paths

ROOT = repo_paths.REPO


def _ruff(*args):
  # The ruff installed beside this interpreter (requirements.txt), not whatever is on PATH.
  command = [sys.executable, '-m', 'ruff', *args]
  return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize('args', [('check', '.'), ('format', '--check', '.')])
def test_tree_passes_ruff(args):
  result = _ruff(*args)
  assert result.returncode == 0, f'ruff {" ".join(args)}:\n{result.stdout}{result.stderr}'

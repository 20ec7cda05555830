"""The commands as console scripts (pyproject.toml [project.scripts],
realformer_jax/commands/scripts.py):
installed with the package, they run from any directory, a shipped config named as in the docs
(`--config=configs/tiny.py`), exactly as `python -m experiments.<module>` does from the
repository root (issue 59: the modules worked only from there)."""

import os
import shutil
import subprocess
import sys

import pytest
import repo_paths
import tomllib
from data_fixtures import bible_config
from toy_flags import TRAIN_TOY_FLAGS

from realformer_jax import data
from realformer_jax.commands import cli, scripts

REPO = repo_paths.REPO


def _scripts() -> dict:
  with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
    return tomllib.load(f)['project']['scripts']


def test_every_script_runs_a_command_module():
  names = _scripts()
  assert {'realformer-train', 'realformer-prepare', 'realformer-export'} <= set(names)
  for name, target in names.items():
    module, function = target.split(':')
    assert module == 'realformer_jax.commands.scripts', name
    command = getattr(scripts, function).module
    source = open(os.path.join(REPO, *command.split('.')) + '.py').read()
    assert "if __name__ == '__main__':" in source, (name, command)


def test_a_shipped_config_is_found_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  shipped = os.path.join(REPO, 'configs', 'bert.py')
  assert cli.shipped_config('--config=configs/bert.py:size=large') == (
    f'--config={shipped}:size=large'
  )
  (tmp_path / 'configs').mkdir()
  (tmp_path / 'configs' / 'bert.py').write_text('')  # the user's own file of that name wins
  assert cli.shipped_config('--config=configs/bert.py') == '--config=configs/bert.py'
  assert cli.shipped_config('--workdir=configs/tiny.py') == '--workdir=configs/tiny.py'


@pytest.mark.slow  # an install (~5 s) and a toy training run from outside the repository
def test_installed_scripts_run_from_another_directory(tmp_path):
  # The package as pip installs it (not editable): only what pyproject.toml ships.
  source = tmp_path / 'source'
  source.mkdir()
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(os.path.join(REPO, name), source / name)
  for name in ('realformer_jax', 'experiments', 'configs', 'studies'):
    shutil.copytree(
      os.path.join(REPO, name), source / name, ignore=shutil.ignore_patterns('__pycache__')
    )
  target = tmp_path / 'installed'
  subprocess.run(
    [sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation']
    + ['--no-index', '--target', str(target), str(source)],
    check=True,
    capture_output=True,
    timeout=300,
  )
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  env = dict(
    os.environ, PYTHONPATH=str(target), JAX_PLATFORMS='cpu', JAX_DISABLE_MOST_OPTIMIZATIONS='1'
  )
  for name in _scripts():
    result = subprocess.run(
      [str(target / 'bin' / name), '--help'], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, (name, result.stderr[-2000:])
  # The README's training command, as a script, from elsewhere: it trains and ends as documented.
  data.prepare(bible_config())
  flags = [f'--config.{k}={v}' for k, v in TRAIN_TOY_FLAGS.items()]
  result = subprocess.run(
    [str(target / 'bin' / 'realformer-train'), '--config=configs/tiny.py']
    + [f'--workdir={tmp_path / "run"}', f'--config.data.data_dir={bible_config().data_dir}']
    + flags,
    cwd=elsewhere,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'final eval MLM accuracy' in result.stdout
  assert os.listdir(elsewhere) == []  # nothing written where it ran
  where = subprocess.run(
    [sys.executable, '-c', 'import experiments, configs; print(experiments.__file__)'],
    cwd=elsewhere,
    env=env,
    capture_output=True,
    text=True,
  )
  assert where.stdout.startswith(str(target)), where  # the installed copy ran, not the repo's

"""The commands as console scripts (pyproject.toml [project.scripts],
realformer_jax/commands/scripts.py):
installed with the package, they run from any directory, a shipped config named as in the docs
(`--config=configs/tiny.py`), exactly as `python -m experiments.<module>` does from the
repository root (issue 59: the modules worked only from there)."""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import repo_paths
import subprocesses
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
  shipped = os.path.join(REPO, 'realformer_jax', 'configs')
  bert = f'--config={shipped}/bert.py:size=large'
  assert cli.shipped_config('--config=configs/bert.py:size=large') == bert  # the docs' path
  assert cli.shipped_config('--config=bert:size=large') == bert  # its name
  assert (
    cli.shipped_config('--config=finetune/glue:mrpc') == f'--config={shipped}/finetune/glue.py:mrpc'
  )
  assert cli.shipped_config('--config=realformer_lage') == '--config=realformer_lage'  # no such
  (tmp_path / 'configs').mkdir()
  (tmp_path / 'configs' / 'bert.py').write_text('')  # the user's own file of that name wins
  assert cli.shipped_config('--config=configs/bert.py') == '--config=configs/bert.py'
  assert cli.shipped_config('--workdir=configs/tiny.py') == '--workdir=configs/tiny.py'


def test_a_config_neither_here_nor_shipped_is_one_line_naming_the_shipped(
  tmp_path, monkeypatch, capsys
):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit) as exited:
    cli.check_config_files(['prog', cli.shipped_config('--config=configs/realformer_lage.py:x')])
  assert exited.value.code == 1
  err = capsys.readouterr().err
  assert err.startswith(
    'error: --config configs/realformer_lage.py: no such file, nor a shipped config of that '
    "name (did you mean 'realformer_large'?); shipped: bert, finetune/bible_sections, "
  ), err
  assert err.count('\n') == 1 and 'tiny, translate' in err


def _package_source(tmp_path) -> str:
  """What pyproject.toml builds from, copied (a build writes build/ and *.egg-info beside it)."""
  source = tmp_path / 'source'
  source.mkdir()
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(os.path.join(REPO, name), source / name)
  shutil.copytree(
    os.path.join(REPO, 'realformer_jax'),
    source / 'realformer_jax',
    ignore=shutil.ignore_patterns('__pycache__'),
  )
  return str(source)


@pytest.mark.slow  # pip builds a wheel in a subprocess (2.0-2.4 s measured; more on a busy machine)
def test_the_wheel_claims_only_its_own_name(tmp_path):
  # Installed, the package adds realformer_jax and its dist-info to site-packages, nothing else:
  # a user's own experiments/ or configs/ package cannot collide with ours (STYLE habit 16).
  # The shipped configs and their example files travel inside it as package data.
  subprocess.run(
    [sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation']
    + ['--no-index', '-w', str(tmp_path / 'wheel'), _package_source(tmp_path)],
    check=True,
    capture_output=True,
    timeout=300,
  )
  (wheel,) = (tmp_path / 'wheel').glob('realformer_jax-*.whl')
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    (top_level,) = [n for n in names if n.endswith('.dist-info/top_level.txt')]
    assert archive.read(top_level).decode().split() == ['realformer_jax']
  tops = {name.split('/')[0] for name in names}
  assert {t for t in tops if not t.endswith('.dist-info')} == {'realformer_jax'}, tops
  assert len(tops) == 2, tops
  for shipped in ('commands/train.py', 'studies/plans/layouts.py', 'configs/realformer_large.py'):
    assert f'realformer_jax/{shipped}' in names, shipped
  assert 'realformer_jax/configs/finetune/example_files/train.csv' in names


@pytest.mark.slow  # an install (~5 s) and a toy training run from outside the repository
def test_installed_scripts_run_from_another_directory(tmp_path):
  # The package as pip installs it (not editable): only what pyproject.toml ships.
  source = _package_source(tmp_path)
  target = tmp_path / 'installed'
  subprocess.run(
    [sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation']
    + ['--no-index', '--target', str(target), source],
    check=True,
    capture_output=True,
    timeout=300,
  )
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  env = dict(
    os.environ, PYTHONPATH=str(target), JAX_PLATFORMS='cpu', JAX_DISABLE_MOST_OPTIMIZATIONS='1'
  )
  train_script = str(target / 'bin' / 'realformer-train')

  def installed(*command: str, timeout: float = 600):
    """`command` run from `elsewhere`, with only the installed package on the path."""
    return subprocesses.run(list(command), env=env, cwd=elsewhere, timeout=timeout)

  for name in _scripts():
    result = installed(str(target / 'bin' / name), '--help')
    assert result.returncode == 0, (name, result.stderr[-2000:])
  # The README's training command, as a script, from elsewhere: it trains and ends as documented.
  data.prepare(bible_config())
  flags = [f'--config.{k}={v}' for k, v in TRAIN_TOY_FLAGS.items()]
  result = installed(
    train_script,
    '--config=configs/tiny.py',
    f'--workdir={tmp_path / "run"}',
    f'--config.data.data_dir={bible_config().data_dir}',
    *flags,
  )
  assert 'final eval MLM accuracy' in subprocesses.succeeded(result).stdout
  assert os.listdir(elsewhere) == []  # nothing written where it ran
  # A shipped config by its name, from elsewhere: the paper's RealFormer-Large.
  named = installed(train_script, '--config=realformer_large', '--print_config', timeout=300)
  assert re.search(r'num_layers\W+24\b', subprocesses.succeeded(named).stdout), named.stdout[:2000]
  # The device check's training part imports the measured steps: inside the package too.
  where = installed(
    sys.executable, '-c', 'import realformer_jax.bench.compiled_steps as c; print(c.__file__)'
  )
  assert where.stdout.startswith(str(target)), where  # the installed copy ran, not the repo's
  # What the install added: the package, its dist-info and the scripts, no other module.
  added = sorted(name for name in os.listdir(target) if not name.endswith('.dist-info'))
  assert added == ['bin', 'realformer_jax'], added

"""Fault injection, the command line: a workdir that cannot hold a run (empty, a file, read-only),
a config file that cannot be a config (a syntax error, no get_config, an error raised while it
runs, a get_config() that returns no ConfigDict) and a model size that does not split over the
mesh are each one line `error: ...`, before anything is built or created."""

import errno
import os
import re
import subprocess
import sys

import pytest
from train_fixtures import REPO, tiny_config

from realformer_jax.commands import cli
from realformer_jax.config import ConfigError
from realformer_jax.train import pretraining, workdir_lock
from realformer_jax.train.workdir_lock import WorkdirError, WorkdirLock


@pytest.mark.slow
def test_an_empty_workdir_is_refused_and_nothing_is_created(tmp_path):
  """`--workdir=` would otherwise put run.lock, checkpoints/ and tensorboard/ in the current
  directory."""
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.train',
      f'--config={os.path.join(REPO, "realformer_jax", "configs", "tiny.py")}',
      '--workdir=',
    ],
    cwd=tmp_path,
    env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 1
  assert proc.stderr.splitlines() == [
    'error: --workdir is empty: name the directory for the run (it is created)'
  ]
  assert os.listdir(tmp_path) == []


def test_a_workdir_under_a_file_is_one_line(tmp_path):
  (tmp_path / 'f').write_text('')
  with pytest.raises(WorkdirError) as raised:
    WorkdirLock(str(tmp_path / 'f' / 'run')).acquire()
  assert str(raised.value) == f'--workdir {tmp_path}/f/run: {tmp_path}/f is a file, not a directory'


def test_an_unwritable_workdir_is_one_line(tmp_path, monkeypatch):
  """Root passes access(2) on a chmod-ed directory, so read-only is checked as its failure."""
  monkeypatch.setattr(workdir_lock.os, 'access', lambda path, mode: False)
  with pytest.raises(WorkdirError, match=r'is not writable \(read-only or permissions\)$'):
    workdir_lock.check_usable(str(tmp_path / 'run'))

  monkeypatch.undo()
  real_open = os.open

  def read_only(path, *args, **kwargs):
    if path.endswith(workdir_lock.LOCK_FILE):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
    return real_open(path, *args, **kwargs)

  monkeypatch.setattr(workdir_lock.os, 'open', read_only)
  with pytest.raises(WorkdirError) as raised:
    WorkdirLock(str(tmp_path)).acquire()
  assert str(raised.value) == (
    f'--workdir {tmp_path}: cannot create {tmp_path}/run.lock: Read-only file system'
  )


def test_a_full_disk_when_the_lock_is_taken_is_one_line(tmp_path, monkeypatch):
  """A new run.lock gets no block for its record on a full disk (measured on a full tmpfs: a
  traceback before this test); nothing stays held."""
  monkeypatch.setattr(
    workdir_lock.os,
    'pwrite',
    lambda *args: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
  )
  with pytest.raises(WorkdirError) as raised:
    WorkdirLock(str(tmp_path)).acquire()
  assert str(raised.value) == (
    f'--workdir {tmp_path}: cannot write {tmp_path}/run.lock: No space left on device'
  )
  monkeypatch.undo()
  WorkdirLock(str(tmp_path)).acquire().release()  # no flock was left behind


@pytest.mark.parametrize(
  'source, message',
  [
    ('def get_config(:\n  pass\n', 'syntax error at line 1: invalid syntax'),
    ('x = 1\n', 'defines no get_config() (a config file returns its config from it)'),
    (
      'import no_such_module_xyz\ndef get_config(arg):\n  pass\n',
      "raised while it ran: line 1: ModuleNotFoundError: No module named 'no_such_module_xyz'",
    ),
    # Raising at import, before get_config() exists: the error, not "defines no get_config()"
    # (issue 59: a star import, or a definition after the failing line).
    (
      'from realformer_jax.configs.tiny import *\nraise RuntimeError("no data_dir here")\n',
      'raised while it ran: line 2: RuntimeError: no data_dir here',
    ),
    (
      'raise ValueError("set HOME")\ndef get_config(arg):\n  pass\n',
      'raised while it ran: line 1: ValueError: set HOME',
    ),
    (
      'def get_config(arg):\n  return undefined_name\n',
      "line 2: NameError: name 'undefined_name' is not defined",
    ),
    (
      'def get_config(arg):\n  pass\n',
      'get_config() returned None, not a ml_collections.ConfigDict',
    ),
    (
      'def get_config(arg):\n  return 1\n',
      'get_config() returned int, not a ml_collections.ConfigDict',
    ),
  ],
)
def test_a_config_file_that_is_no_config_is_one_line(tmp_path, capsys, source, message):
  path = tmp_path / 'config.py'
  path.write_text(source)
  with pytest.raises(SystemExit) as exited:
    cli.check_config_files(['prog', f'--config={path}:arg', '--workdir=w'])
  assert exited.value.code == 1
  assert capsys.readouterr().err == f'error: --config {path}: {message}\n'


def test_a_shipped_config_file_passes():
  cli.check_config_files(
    ['prog', f'--config={os.path.join(REPO, "realformer_jax", "configs", "tiny.py")}']
  )


@pytest.mark.parametrize(
  'overrides, message',
  [
    (
      dict(mesh__shape=(1, 1, 8), model__num_heads=2),
      r'model\.num_heads=2: must be divisible by 8, the size of mesh tensor that '
      r"logical_axis_rules shard 'heads' over \(mesh\.shape=\(1, 1, 8, 1\) on 8 devices\)",
    ),
    (
      dict(mesh__shape=(1, 8, 1), model__hidden_size=36, model__num_heads=2),
      r'model\.hidden_size=36: must be divisible by 8, the size of mesh fsdp that '
      r"logical_axis_rules shard 'embed' over \(mesh\.shape=\(1, 8, 1, 1\) on 8 devices\)",
    ),
    (
      dict(mesh__shape=(2, 2, 2), model__mlp_dim=33),
      r"model\.mlp_dim=33: must be divisible by 2, the size of mesh tensor .*'mlp'.*",
    ),
  ],
)
def test_a_parameter_that_does_not_split_over_the_mesh_is_one_line(overrides, message):
  """Checked against a device count, before any device, workdir or compilation (the same
  configs fail in JAX with IndivisibleError when the parameters are created)."""
  with pytest.raises(ConfigError) as raised:
    pretraining.validate_config(tiny_config(**overrides), device_count=8, process_count=1)
  assert re.fullmatch(message, str(raised.value)), str(raised.value)


def test_parameters_that_split_over_the_mesh_pass():
  for shape in [(8, 1, 1), (1, 8, 1), (2, 2, 2)]:
    pretraining.validate_config(tiny_config(mesh__shape=shape), device_count=8, process_count=1)

"""Fault injection, the run files a (re)start writes into the workdir (config.json and the
tokenizer's file): an unchanged file is not rewritten, so a restart on a full disk writes
nothing; a write that fails (ENOSPC) is one line and leaves no temporary file behind."""

import errno
import os

import pytest
from data_fixtures import bible_tokenizer  # noqa: F401  (a fixture)
from train_fixtures import tiny_config

from realformer_jax import atomic_files
from realformer_jax.train import pretraining, run_files
from realformer_jax.train.errors import TrainingError


@pytest.fixture
def full_disk(monkeypatch):
  """Every file atomic_files.write_bytes opens for writing takes a few bytes, then ENOSPC."""
  real_open = open

  class _Full:
    def __init__(self, f):
      self._f = f

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self._f.close()

    def write(self, data):
      self._f.write(data[:10])
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def opener(path, mode='r', *args, **kwargs):
    f = real_open(path, mode, *args, **kwargs)
    return _Full(f) if 'w' in mode else f

  monkeypatch.setattr(atomic_files, 'open', opener, raising=False)


def _write_run_files(workdir, tokenizer):
  run_files.write_run_files(
    pretraining.validate_config(tiny_config()).to_dict(), tokenizer, str(workdir)
  )


def test_a_restart_rewrites_no_unchanged_run_file(tmp_path, monkeypatch, bible_tokenizer):
  _write_run_files(tmp_path, bible_tokenizer)
  files = sorted(os.listdir(tmp_path))
  assert files == ['config.json', bible_tokenizer.file_name]
  before = {name: os.stat(tmp_path / name).st_mtime_ns for name in files}

  def no_write(*args, **kwargs):
    raise AssertionError('an unchanged run file was rewritten')

  monkeypatch.setattr(atomic_files.os, 'replace', no_write)
  _write_run_files(tmp_path, bible_tokenizer)  # a restart
  assert {name: os.stat(tmp_path / name).st_mtime_ns for name in files} == before


def test_a_failed_write_is_one_line_and_leaves_nothing(tmp_path, full_disk, bible_tokenizer):
  with pytest.raises(TrainingError) as raised:
    _write_run_files(tmp_path, bible_tokenizer)
  assert str(raised.value) == (
    f'{tmp_path}: cannot write the run files (config.json, tokenizer): No space left on '
    'device; the checkpoints are untouched: free space and rerun'
  )
  assert os.listdir(tmp_path) == []  # no .tmp.<pid> taking the last free bytes


def test_a_changed_file_is_replaced_and_a_failed_one_left_as_it_was(tmp_path, monkeypatch):
  path = str(tmp_path / 'f')
  assert atomic_files.write_bytes(path, b'old')
  assert not atomic_files.write_bytes(path, b'old')
  assert atomic_files.write_bytes(path, b'new')
  with open(path, 'rb') as f:
    assert f.read() == b'new'
  monkeypatch.setattr(
    atomic_files.os, 'replace', lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, 'I/O error'))
  )
  with pytest.raises(OSError):
    atomic_files.write_bytes(path, b'newer')
  assert os.listdir(tmp_path) == ['f']
  with open(path, 'rb') as f:
    assert f.read() == b'new'

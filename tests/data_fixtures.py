"""Shared fixtures for the data tests: one prepared bible_web corpus per test session.

Not a conftest.py, so the data branch adds no file the model branch may also create. Test
modules import the fixtures they use; the preparation itself is memoized per process, so
it runs once however many modules ask for it (full corpus + 8k unigram tokenizer: ~3 s).
"""

import atexit
import functools
import shutil
import tempfile

import numpy as np
import pytest

from realformer_jax import data


@functools.cache
def _bible_data_dir() -> str:
  data_dir = tempfile.mkdtemp(prefix='realformer_data_test_')
  atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
  return data_dir


def bible_config(**overrides):
  """The default data config on the shared test data dir, with `overrides` applied."""
  config = data.default_data_config()
  config.data_dir = _bible_data_dir()
  config.update(overrides)
  return config


def quick_study_argv(out: str, workdirs: str, *more: str) -> list[str]:
  """A study's command line at toy scale (--quick) on the shared test data dir, plus `more`."""
  data_dir = bible_config().data_dir
  return ['--quick', '--out', out, '--workdirs', workdirs, '--data_dir', data_dir, *more]


@pytest.fixture(scope='session')
def bible_tokenizer():
  return data.prepare(bible_config())


def take(iterator, n):
  """The next n batches of an iterator."""
  return [next(iterator) for _ in range(n)]


def assert_same_batches(a, b):
  """Equal lists of batches: same keys (the batch contract), dtypes and values."""
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert set(x) == set(data.BATCH_KEYS) == set(y)
    for key in x:
      assert x[key].dtype == y[key].dtype
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)

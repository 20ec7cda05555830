"""Shared fixtures for the data tests: one prepared bible_web corpus per test session, and a
small corpus of your own files (`write_corpus`, `files_config`).

Not a conftest.py, so the data branch adds no file the model branch may also create. Test
modules import the fixtures they use; the preparation itself is memoized per process, so
it runs once however many modules ask for it (full corpus + 8k unigram tokenizer: ~3 s).
"""

import atexit
import functools
import json
import os
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


# A corpus of the user's own files (data.train_files / eval_files).

_WORDS = 'the quick brown fox jumps over a lazy dog while seven wise owls watch old oaks'.split()


def write_corpus(directory, train_files=2, docs_per_file=60, seed=0) -> dict:
  """train-<i>.txt, eval.txt, train.jsonl, eval.jsonl and train.parquet: random sentences,
  three lines per document."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)

  def document():
    return '\n'.join(' '.join(rng.choice(_WORDS, 10)) + '.' for _ in range(3))

  docs = {}
  for i in range(train_files):
    docs[f'train-{i}.txt'] = [document() for _ in range(docs_per_file)]
  docs['eval.txt'] = [document() for _ in range(20)]
  for name, texts in docs.items():
    with open(os.path.join(directory, name), 'w') as f:
      f.write('\n\n'.join(texts) + '\n')
  for split in ('train', 'eval'):
    texts = sum((v for k, v in docs.items() if k.startswith(split)), [])
    with open(os.path.join(directory, f'{split}.jsonl'), 'w') as f:
      for text in texts:
        f.write(json.dumps({'text': text, 'id': 1}) + '\n')
  return docs


def files_config(directory, **overrides):
  config = data.default_data_config()
  config.update(
    data_dir=str(directory / 'cache'),
    tokenizer_model_type='bpe',
    vocab_size=60,
    max_len=16,
    max_predictions=4,
  )
  config.update(overrides)
  return config

"""What 2 workers cost beyond 1 (issue 42's scaling target): one worker pool for the reading and
the encoding phase, the tokenizer unpickled once per worker, ids handed back as files."""

import errno
import operator
import os
import pickle
import tempfile

import numpy as np
import pytest
from data_fixtures import bible_tokenizer  # noqa: F401 (fixture)

from realformer_jax import data
from realformer_jax.data import encoding, preparation, workers


def test_a_pool_outlives_a_consumer_that_stops_at_the_last_result():
  """zip() over the jobs never asks a finished generator for its end (file_corpus reads so):
  the pool is kept for the next phase. A consumer that leaves with jobs in flight ends it."""
  workers.close_all()
  try:
    jobs = [-1, -2, -3, -4]
    assert [r for _, r in zip(jobs, workers.ordered_results(abs, jobs, 2))] == [1, 2, 3, 4]
    pool = workers._POOLS[2, False]  # pylint: disable=protected-access
    assert list(workers.ordered_results(abs, jobs, 2)) == [1, 2, 3, 4]
    assert workers._POOLS[2, False] is pool  # pylint: disable=protected-access
    results = workers.ordered_results(operator.neg, list(range(10)), 2)
    assert next(results) == 0
    results.close()  # left early: up to 4 jobs were in flight
    assert (2, False) not in workers._POOLS  # pylint: disable=protected-access
  finally:
    workers.close_all()


def _shard(tmp_path, texts) -> str:
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  path = str(tmp_path / 'shard.array_record')
  writer = array_record_module.ArrayRecordWriter(path, 'group_size:1,uncompressed')
  for text in texts:
    writer.write(text.encode())
  writer.close()
  return path


def test_a_worker_job_hands_its_ids_back_as_a_file_and_loads_the_tokenizer_once(
  tmp_path, bible_tokenizer
):
  texts = ['In the beginning God created', '', 'the heavens and the earth. ' * 40, 'ünïcode']
  path = _shard(tmp_path, texts)
  in_process = encoding.encode(encoding.EncodeJob(((path, 0, 4),), bible_tokenizer, 'text'))
  out_dir = tmp_path / 'ids'
  out_dir.mkdir()
  job = encoding.EncodeJob(((path, 0, 4),), bible_tokenizer, 'text', str(out_dir))
  # As a worker receives them: each job unpickled on its own, one tokenizer for all.
  first, second = (pickle.loads(pickle.dumps(job)) for _ in range(2))
  assert first.tokenizer is second.tokenizer and first.tokenizer is not bible_tokenizer
  assert first.segments == job.segments and first.out_dir == str(out_dir)
  result = encoding.encode(first)
  assert 'ids' not in result and os.path.dirname(result['ids_file']) == str(out_dir)
  ids = encoding.take_ids(result)
  assert ids.dtype == np.int32 and len(ids) > 100
  np.testing.assert_array_equal(ids, encoding.take_ids(in_process))
  expected = np.concatenate([bible_tokenizer.encode(text) for text in texts])
  np.testing.assert_array_equal(ids, expected)
  assert not os.listdir(out_dir)  # read, then removed
  for key in ('documents', 'text_bytes', 'digests'):
    assert result[key] == in_process[key]


@pytest.mark.parametrize('num_workers', [1, 2])
def test_the_ids_directory_is_private_and_removed_even_on_failure(
  monkeypatch, tmp_path, num_workers
):
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  with preparation._ids_dir(num_workers) as directory:  # pylint: disable=protected-access
    if num_workers == 1:
      assert directory is None  # jobs in this process return their ids
      return
    assert os.path.dirname(directory) == str(tmp_path)
    assert os.stat(directory).st_mode & 0o077 == 0
    open(os.path.join(directory, 'left.int32'), 'wb').close()
  assert not os.listdir(tmp_path)
  with pytest.raises(RuntimeError):
    with preparation._ids_dir(num_workers) as directory:  # pylint: disable=protected-access
      open(os.path.join(directory, 'left.int32'), 'wb').close()
      raise RuntimeError('a job failed')
  assert not os.listdir(tmp_path)


def test_a_temporary_directory_without_space_or_gone_is_one_line_naming_tmpdir(
  monkeypatch, tmp_path, bible_tokenizer
):
  path = _shard(tmp_path, ['In the beginning God created the heavens'])
  job = encoding.EncodeJob(((path, 0, 1),), bible_tokenizer, 'text', str(tmp_path))

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, 'No space left on device')

  monkeypatch.setattr(tempfile, 'mkstemp', full)
  with pytest.raises(data.DataError, match='No space left on device.*TMPDIR') as raised:
    encoding.encode(job)
  assert '\n' not in str(raised.value) and str(tmp_path) in str(raised.value)
  monkeypatch.undo()
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path / 'gone'))
  with pytest.raises(data.DataError, match=r'gone \(No such file or directory\).*TMPDIR'):
    with preparation._ids_dir(2):  # pylint: disable=protected-access
      pass

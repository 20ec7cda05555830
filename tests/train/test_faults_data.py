"""Fault injection, data: a damaged dataset file stops the run in one line naming the file and
how to prepare it again; damaged derived caches (tokenizer, packed sequences, translation
pairs) are rebuilt, with a note, into exactly what they were; preparation's faults (a dangling
source link, a full disk, a read-only data_dir) are one line, and temporary files left by dead
writers are removed.

Every test damages its own copy of the session's prepared corpus (data_fixtures.py)."""

import errno
import logging
import os
import re
import shutil

import fault_support as fs
import numpy as np
import pytest
from data_fixtures import bible_config

from realformer_jax import data
from realformer_jax.data import DataError, preparation
from realformer_jax.data.store import cache_integrity
from realformer_jax.seq2seq import data as translation_data


def _copied_corpus(tmp_path, **overrides):
  """A data config on a copy of the session's prepared data dir (dataset and caches)."""
  source = bible_config().data_dir
  data.prepare(bible_config())  # the session's corpus and tokenizer exist before the copy
  target = str(tmp_path / 'data')
  shutil.copytree(source, target)  # copy2 keeps the times: the caches stay verified
  return bible_config(data_dir=target, **overrides)


def _train_shard(config) -> str:
  return os.path.join(
    config.data_dir, 'bible_web', '1.0.0', 'bible_web-train.array_record-00000-of-00001'
  )


@pytest.mark.slow  # the training CLI in a subprocess: 3.9 s CPU at load ~20 (2026-11-26)
def test_a_truncated_dataset_file_is_one_line_naming_it(tmp_path):
  config = _copied_corpus(tmp_path)
  shard = _train_shard(config)
  fs.truncate(shard, 1000)

  fs.run_saying(
    tmp_path / 'w',
    1,
    rf"error: Dataset 'bible_web/1\.0\.0' split 'train': file {re.escape(shard)} "
    r'is damaged \(ArrayRecord file should be at least 64KB big\); delete '
    rf'{re.escape(os.path.dirname(shard))} and rerun \(the embedded corpus is '
    r'prepared again on first use\)\.',
    data__data_dir=config.data_dir,
  )
  assert not os.path.exists(tmp_path / 'w' / 'checkpoints')


def test_flipped_bytes_in_a_dataset_file_name_the_file_and_record_when_read(tmp_path):
  config = _copied_corpus(tmp_path)
  shutil.rmtree(os.path.join(config.data_dir, 'bible_web', 'packed'), ignore_errors=True)
  shard = _train_shard(config)
  # Where the middle of the file lands (a chunk's data, a chunk header, a block header)
  # depends on the shard's chunk layout, which differed on CI: riegeli's wording varies with it.
  fs.flip_bytes(shard, os.path.getsize(shard) // 2, 64)
  with pytest.raises(DataError) as raised:
    preparation.packed_train_store(config)
  # str(): the message the CLI prints (grain adds a traceback note, which str() leaves out).
  assert re.fullmatch(
    rf"Dataset 'bible_web/1\.0\.0' split 'train': file {re.escape(shard)} \(record \d+\) is "
    r'damaged \(Corrupted Riegeli/records file: .+\); delete \S+ and rerun \(the embedded '
    r'corpus is prepared again on first use\)\.',
    str(raised.value),
  ), str(raised.value)


def _note(caplog, path, reason, action):
  notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith('note: cache')]
  assert len(notes) == 1, notes
  assert re.fullmatch(
    rf'note: cache {re.escape(path)} is damaged \({reason}\): {action}', notes[0]
  ), notes[0]


@pytest.mark.parametrize(
  'damage, reason',
  [
    ('whole_rows', r'it has [\d,]+ bytes, [\d,]+ were written'),  # passed unnoticed before
    ('flipped', r'its bytes changed since it was built \(checksum mismatch\)'),
    ('no_record', r'its record \S+\.json is missing'),
  ],
)
def test_a_damaged_packed_store_is_packed_again(tmp_path, caplog, damage, reason):
  config = _copied_corpus(tmp_path)
  store = preparation.packed_train_store(config)
  rows = store.rows(np.arange(len(store)))
  if damage == 'whole_rows':
    fs.truncate(store.path, 4 * config.max_len * (len(store) - 3))
  elif damage == 'flipped':
    fs.flip_bytes(store.path, 4 * config.max_len * 5, 8)
  else:
    os.remove(cache_integrity.sidecar_path(store.path))
  preparation._PACKED.clear()  # pylint: disable=protected-access  # as a new process

  with caplog.at_level(logging.WARNING):
    again = preparation.packed_train_store(config)

  _note(caplog, store.path, reason, r"packing dataset 'bible_web/1\.0\.0' split 'train' again")
  assert again.path == store.path and cache_integrity.problem(store.path) is None
  np.testing.assert_array_equal(again.rows(np.arange(len(again))), rows)


def test_a_damaged_tokenizer_is_trained_again(tmp_path, caplog):
  config = _copied_corpus(tmp_path)
  tokenizer = data.prepare(config)
  original = tokenizer.file_bytes()
  fs.truncate(tokenizer.source, 1000)
  preparation._PREPARED.clear()  # pylint: disable=protected-access  # as a new process

  with caplog.at_level(logging.WARNING):
    again = data.prepare(config)

  _note(
    caplog,
    tokenizer.source,
    r'it has 1,000 bytes, [\d,]+ were written',
    'training the tokenizer again',
  )
  assert again.file_bytes() == original  # training is deterministic: the same tokenizer


def test_a_copied_cache_is_verified_once_then_trusted(tmp_path, caplog):
  config = _copied_corpus(tmp_path)
  store = preparation.packed_train_store(config)
  os.utime(store.path)  # what a copy without preserved times does: the checksum is re-read
  assert cache_integrity.problem(store.path) is None
  record = fs.read_json(cache_integrity.sidecar_path(store.path))
  assert record['file_mtime_ns'] == os.stat(store.path).st_mtime_ns  # ... once
  assert not [r for r in caplog.records if 'note: cache' in r.getMessage()]


def test_a_damaged_translation_cache_is_encoded_again(tmp_path, caplog):
  config = translation_data.TranslationDataConfig(
    data_dir=str(tmp_path),
    vocab_size=300,
    max_pairs=80,
    bucket_lengths=(16, 32, 48),
    tokens_per_batch=192,
  )
  first = translation_data.prepare(config)
  cache = os.path.join(str(tmp_path), translation_data.DATASET)
  [encoded] = [os.path.join(cache, n) for n in os.listdir(cache) if n.endswith('.npz')]
  fs.truncate(encoded, os.path.getsize(encoded) // 2)
  translation_data._PREPARED.clear()  # pylint: disable=protected-access  # as a new process

  with caplog.at_level(logging.WARNING):
    again = translation_data.prepare(config)

  _note(
    caplog, encoded, r'it has [\d,]+ bytes, [\d,]+ were written', 'encoding the verse pairs again'
  )
  for name in ('train', 'validation', 'test'):
    np.testing.assert_array_equal(
      np.concatenate(again.splits[name].sources), np.concatenate(first.splits[name].sources)
    )


# Preparation faults (issue 41): each ends in one DataError line, nothing half-written kept.


def _file_corpus(tmp_path, **overrides):
  from data_fixtures import files_config, write_corpus  # pylint: disable=import-outside-toplevel

  write_corpus(tmp_path / 'corpus', train_files=3)
  preparation._PREPARED.clear()  # pylint: disable=protected-access
  preparation._PACKED.clear()  # pylint: disable=protected-access
  return files_config(
    tmp_path,
    train_files=str(tmp_path / 'corpus' / 'train-*.txt'),
    eval_files=str(tmp_path / 'corpus' / 'eval.txt'),
    **overrides,
  )


def _temporaries(directory) -> list[str]:
  return [
    os.path.join(root, name)
    for root, _, names in os.walk(directory)
    for name in names
    if '.tmp.' in name
  ]


def _prepare_refusal(config) -> str:
  """The DataError that data.prepare(config) raises: one line (the house rule), returned."""
  with pytest.raises(DataError) as raised:
    data.prepare(config)
  message = str(raised.value)
  assert '\n' not in message, message
  return message


def test_a_dangling_symlink_among_the_sources_is_one_line_naming_it(tmp_path):
  config = _file_corpus(tmp_path)
  os.symlink(tmp_path / 'unmounted' / 'train-9.txt', tmp_path / 'corpus' / 'train-9.txt')
  message = _prepare_refusal(config)
  assert re.fullmatch(
    rf'data\.train_files: {re.escape(str(tmp_path))}/corpus/train-9\.txt is a symbolic link to '
    r'\S+/unmounted/train-9\.txt, which does not exist \(an unmounted file system\?\): mount '
    r'it or remove the link\.',
    message,
  ), message


def test_a_full_disk_while_reading_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  config = _file_corpus(tmp_path)
  real_writer = array_record_module.ArrayRecordWriter
  written = []

  class FullDisk:  # the second shard's first write finds the disk full (and close fails too)
    def __init__(self, path, options):
      self.path, self.writer = path, real_writer(path, options)

    def write(self, data):
      written.append(self.path)
      if len({os.path.basename(p).split('-')[1] for p in written}) > 1:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
      self.writer.write(data)

    def close(self):
      if len(set(written)) > 1:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
      self.writer.close()

  monkeypatch.setattr(array_record_module, 'ArrayRecordWriter', FullDisk)
  message = _prepare_refusal(config)
  assert message.startswith('no space left on the device of ') and 'free space' in message
  assert not _temporaries(config.data_dir)
  monkeypatch.setattr(array_record_module, 'ArrayRecordWriter', real_writer)
  preparation._PREPARED.clear()  # pylint: disable=protected-access
  assert data.prepare(config).vocab_size == 60  # space freed: the rerun finishes


def test_stale_temporary_files_of_dead_writers_are_removed(tmp_path):
  config = _file_corpus(tmp_path)
  store = preparation.packed_train_store(config)
  tokenizer = data.prepare(config)
  shard_dir = os.path.join(config.data_dir, 'file-shards')
  shard = next(n for n in sorted(os.listdir(shard_dir)) if n.endswith('.array_record'))
  stale = [  # what kill -9 (or a full disk in an old version) left behind
    f'{store.path}.tmp.999999',
    f'{store.path}.json.tmp.999998',
    f'{tokenizer.source}.tmp.999997',
    os.path.join(shard_dir, f'{shard}.tmp.999996'),
  ]
  for path in stale:
    with open(path, 'wb') as f:
      f.write(b'half written')
  for path in (store.path, tokenizer.source, os.path.join(shard_dir, shard)):
    fs.truncate(path, 10)  # damaged: the next run rebuilds each, under its lock
  preparation._PREPARED.clear()  # pylint: disable=protected-access
  preparation._PACKED.clear()  # pylint: disable=protected-access
  preparation.packed_train_store(config)
  assert not _temporaries(config.data_dir)


def test_a_read_only_data_dir_with_an_unprepared_corpus_is_one_line(tmp_path, monkeypatch):
  config = _file_corpus(tmp_path)
  data_dir = config.data_dir
  real_makedirs = os.makedirs

  def read_only(path, *args, **kwargs):  # tests run as root: chmod would not stop a write
    if str(path).startswith(data_dir):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return real_makedirs(path, *args, **kwargs)

  monkeypatch.setattr(os, 'makedirs', read_only)
  message = _prepare_refusal(config)
  assert re.fullmatch(
    rf'cannot write {re.escape(data_dir)}\S* \(Read-only file system\): the corpus is not '
    rf'prepared under data\.data_dir={re.escape(data_dir)} and preparing it needs a writable '
    r'directory: .*',
    message,
  ), message

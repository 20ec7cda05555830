"""Preparation that scales: chunked reading, a bounded tokenizer sample, memory flat in corpus
size, and the same stores, tokenizer and packed rows for 1 and 2 worker processes."""

import builtins
import dataclasses
import glob
import json
import os
import sys
import tempfile
import tracemalloc

import numpy as np
import pytest
from data_fixtures import files_config, write_corpus

from realformer_jax import data
from realformer_jax.data import encoding, file_corpus, preparation, sources, text_files, workers
from realformer_jax.data.prepare_ahead import prepare_ahead
from realformer_jax.data.store import cache_integrity


def _fresh():
  """As a new process: nothing memoized (the stores on disk stay)."""
  preparation._PREPARED.clear()  # pylint: disable=protected-access
  preparation._PACKED.clear()  # pylint: disable=protected-access


def _big_corpus(directory, files=3, docs_per_file=400) -> str:
  """Files of a few hundred KB (so small chunks split them), one a .jsonl; their glob."""
  write_corpus(directory, train_files=files, docs_per_file=docs_per_file)
  return str(directory / 'train-*')


def _big_corpus_config(directory, train: str, cache: str):
  """`train` (the big corpus) prepared into directory/cache: 5% held out, a 120-piece
  tokenizer trained on a 30k-character sample."""
  return files_config(
    directory,
    data_dir=str(directory / cache),
    train_files=train,
    eval_percent=5,
    vocab_size=120,
    tokenizer_sample_chars=30_000,
  )


@pytest.mark.parametrize('name', ['train-0.txt', 'train.jsonl'])
def test_byte_ranges_partition_a_files_documents_exactly(tmp_path, monkeypatch, name):
  write_corpus(tmp_path, train_files=1, docs_per_file=300)
  path = str(tmp_path / name)
  size = os.path.getsize(path)
  monkeypatch.setattr(text_files, 'CHUNK_BYTES', 997)  # odd: bounds fall inside lines
  ranges = text_files.byte_ranges(path, size)
  assert len(ranges) > 20
  exact = [text_files.exact_range(path, start, end, size) for start, end in ranges]
  assert exact[0][0] == 0 and exact[-1][1] == size
  assert all(a[1] == b[0] for a, b in zip(exact, exact[1:]))  # contiguous, no overlap
  chunked = [d for r in exact for d in text_files.documents(path, 'text', r)]
  assert chunked == list(text_files.documents(path, 'text'))


def test_a_bad_line_in_a_later_range_names_its_line_in_the_file(tmp_path, monkeypatch):
  lines = [json.dumps({'text': f'document {i}'}) for i in range(400)]
  lines[321] = '{not json'
  path = str(tmp_path / 'bad.jsonl')
  with open(path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  monkeypatch.setattr(text_files, 'CHUNK_BYTES', 1000)
  size = os.path.getsize(path)
  with pytest.raises(data.DataError, match=r'bad.jsonl: line 322 is not JSON'):
    for start, end in text_files.byte_ranges(path, size):
      list(text_files.documents(path, 'text', text_files.exact_range(path, start, end, size)))


def test_the_tokenizer_sample_is_bounded_spread_and_reproducible(tmp_path, monkeypatch):
  monkeypatch.setattr(text_files, 'CHUNK_BYTES', 50_000)
  train = _big_corpus(tmp_path)
  tokenizers = []
  for run in range(2):  # the same corpus and settings in two data dirs: the same tokenizer
    config = _big_corpus_config(tmp_path, train, f'cache-{run}')
    tokenizers.append(data.prepare(config))
  first, second = tokenizers
  assert first.file_bytes() == second.file_bytes()
  record = cache_integrity.read_record(first.source)
  text_bytes = preparation.prepared_data(config).train_text_bytes
  sample = record['sample']
  assert text_bytes > 30_000 and sample['windows'] == -(-30_000 // sample['window_bytes'])
  assert sample['spacing_bytes'] == round(text_bytes / sample['windows'])  # spans the split
  assert sample['max_chars'] == 30_000 and record['threads'] == 4
  assert record['sampling'] == 'byte windows across files' and record['corpus_digest']


def _prepare_all(config, num_workers):
  _fresh()
  summary = prepare_ahead(config, num_workers)
  store = preparation.packed_train_store(config)
  prepared = preparation.prepared_data(config)
  texts = {
    split: [records[i] for i in range(len(records))]
    for split, records in (('train', prepared.train_records), ('eval', prepared.eval_records))
  }
  return {
    'texts': texts,
    'rows': store.rows(np.arange(len(store))),
    'tokenizer': prepared.tokenizer.file_bytes(),
    'digest': summary['corpus_digest'],
    'store': os.path.basename(store.path),
    'eval_sequences': summary['eval_sequences'],
  }


def _sample_chars(config) -> int:
  """The characters of the tokenizer's sample of `config`'s train files."""
  config = data.config.data_config(config)
  opened = sources.for_config(config).open(config, 1)
  prepared = {f.name: getattr(opened, f.name) for f in dataclasses.fields(opened)}
  sample = preparation._Sample(prepared, config.text_feature, config.tokenizer_sample_chars)  # pylint: disable=protected-access
  return sum(len(text) for text in sample)


def test_the_tokenizer_sample_does_not_shrink_as_files_get_small(tmp_path):
  """The same documents as one file and as 400 files of 1-2 documents: a sample window that
  reaches a file's end goes on into the next file, so both samples hold about
  data.tokenizer_sample_chars (when windows stopped at their file's end, the small files
  gave a tenth of it)."""
  rng = np.random.default_rng(0)
  words = 'the owl and a cat went to sea in green boat of pea honey money'.split()
  documents = [' '.join(rng.choice(words, 40)) + '.' for _ in range(600)]  # ~200 bytes each
  (tmp_path / 'one').mkdir()
  (tmp_path / 'one' / 'all.txt').write_text('\n\n'.join(documents) + '\n')
  cuts = [0, *sorted(rng.choice(np.arange(1, 600), 399, replace=False)), 600]
  for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
    os.makedirs(tmp_path / 'many' / f'part-{i // 100}', exist_ok=True)
    text = '\n\n'.join(documents[a:b]) + '\n'
    (tmp_path / 'many' / f'part-{i // 100}' / f'page-{i:04d}.txt').write_text(text)
  (tmp_path / 'eval.txt').write_text('a held out owl.\n')
  chars = {}
  for name, train in (('one', 'one/all.txt'), ('many', 'many/part-*/*.txt')):
    config = files_config(
      tmp_path,
      data_dir=str(tmp_path / f'cache-{name}'),
      train_files=str(tmp_path / train),
      eval_files=str(tmp_path / 'eval.txt'),
      tokenizer_sample_chars=30_000,
    )
    chars[name] = _sample_chars(config)
  assert 27_000 < chars['one'] <= 34_000, chars  # the cap, give or take the last window
  assert chars['many'] > 0.95 * chars['one'], chars


@pytest.mark.slow
def test_one_and_two_workers_prepare_the_same_corpus(tmp_path, monkeypatch):
  """A corpus larger than the tokenizer sample, with files split into byte ranges: the
  documents, tokenizer, packed rows and corpus digest are equal for 1 and 2 processes."""
  monkeypatch.setattr(text_files, 'CHUNK_BYTES', 40_000)  # planned here, so workers follow
  monkeypatch.setattr(file_corpus, 'SMALL_FILE_BYTES', 40_000)  # files alone, in ranges
  monkeypatch.setattr(preparation, 'JOB_BYTES', 30_000)  # several encoding jobs
  os.makedirs(tmp_path / 'tmp')
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path / 'tmp'))  # where workers hand back ids
  train = _big_corpus(tmp_path)
  results = {}
  for num_workers in (1, 2):
    config = _big_corpus_config(tmp_path, train, f'cache-{num_workers}')
    results[num_workers] = _prepare_all(config, num_workers)
  workers.close_all()
  assert not os.listdir(tmp_path / 'tmp')  # the ids files and their directory are removed
  one, two = results[1], results[2]
  assert one['texts'] == two['texts'] and one['tokenizer'] == two['tokenizer']
  assert one['digest'] == two['digest'] and one['store'] == two['store']
  assert one['eval_sequences'] == two['eval_sequences']
  np.testing.assert_array_equal(one['rows'], two['rows'])
  shards = os.listdir(os.path.join(tmp_path, 'cache-2', 'file-shards'))
  assert len([s for s in shards if s.endswith('-train.array_record')]) > 3  # ranges, not files


def _peak_bytes(tmp_path, monkeypatch, name: str, files: int) -> int:
  monkeypatch.setattr(text_files, 'CHUNK_BYTES', 40_000)
  # A group of small files is held in memory while it is hashed and read: scaled down too.
  monkeypatch.setattr(file_corpus, 'GROUP_MAX_BYTES', 40_000)
  monkeypatch.setattr(preparation, 'JOB_BYTES', 30_000)
  directory = tmp_path / name
  train = _big_corpus(directory, files=files, docs_per_file=1500)
  config = files_config(
    directory, train_files=train, eval_percent=5, vocab_size=120, tokenizer_sample_chars=30_000
  )
  _fresh()
  tracemalloc.start()
  try:
    preparation.packed_train_store(config, 1)
    return tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
  """Python's peak allocations (numpy's included) while a corpus 4x larger than another is
  read, sampled, encoded and packed: the same bound (what grows is far below the corpus's
  growth). The benchmark measures peak RSS at 64 MB and 1 GB."""
  small = _peak_bytes(tmp_path, monkeypatch, 'small', files=2)
  large = _peak_bytes(tmp_path, monkeypatch, 'large', files=8)
  corpus = {
    name: sum(os.path.getsize(p) for p in (tmp_path / name).glob('train-*'))
    for name in ('small', 'large')
  }
  assert corpus['large'] > 3.5 * corpus['small']
  assert large < 1.3 * small + 200_000, (small, large)
  # Holding the text (or its int32 token ids) would grow by the corpus's growth or more.
  assert large - small < (corpus['large'] - corpus['small']) / 4, (small, large, corpus)


def test_a_touched_renamed_or_moved_file_keeps_the_corpus_and_its_stores(tmp_path, monkeypatch):
  write_corpus(tmp_path, train_files=2)
  os.makedirs(tmp_path / 'moved')
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'train-*.txt'), eval_files=str(tmp_path / 'eval.txt')
  )
  store = preparation.packed_train_store(config)
  state = data.make_train_iterator(config, 4, seed=0).get_state()
  shards = sorted(os.listdir(tmp_path / 'cache' / 'file-shards'))

  os.utime(tmp_path / 'train-0.txt', (1e9, 1e9))  # touched
  os.rename(tmp_path / 'train-1.txt', tmp_path / 'moved' / 'renamed-1.txt')  # moved, renamed
  moved = files_config(
    tmp_path,
    train_files=f'{tmp_path}/train-*.txt,{tmp_path}/moved/renamed-1.txt',
    eval_files=str(tmp_path / 'eval.txt'),
  )
  read = []
  real_write = file_corpus._write_shard  # pylint: disable=protected-access
  monkeypatch.setattr(file_corpus, '_write_shard', lambda *a: read.append(a) or real_write(*a))
  _fresh()
  again = preparation.packed_train_store(moved)
  assert not read  # hashed, found, not read again
  assert again.path == store.path  # the same corpus directory, tokenizer and packed store
  data.make_train_iterator(moved, 4, seed=0).set_state(state)  # the run stays resumable
  assert sorted(os.listdir(tmp_path / 'cache' / 'file-shards')) == shards  # no second copy
  assert len([d for d in os.listdir(tmp_path / 'cache') if d.startswith('files-')]) == 1
  corpus_dir = os.path.dirname(os.path.dirname(store.path))
  with open(os.path.join(corpus_dir, file_corpus.MANIFEST)) as f:
    manifest = json.load(f)
  assert manifest['train_files'][1]['path'].endswith('moved/renamed-1.txt')

  # Unchanged since: not even hashed (the fingerprint is remembered).
  monkeypatch.setattr(text_files, 'sha256_of_range', lambda *a: pytest.fail('hashed again'))
  _fresh()
  assert preparation.packed_train_store(moved).path == store.path


def test_a_lost_shard_of_an_unchanged_file_is_read_again_into_the_same_shard(tmp_path, monkeypatch):
  monkeypatch.setattr(text_files, 'CHUNK_BYTES', 20_000)
  write_corpus(tmp_path, train_files=1, docs_per_file=300)
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'train-0.txt'), eval_files=str(tmp_path / 'eval.txt')
  )
  store = preparation.packed_train_store(config)
  rows = store.rows(np.arange(len(store)))
  shard_dir = tmp_path / 'cache' / 'file-shards'
  shards = sorted(n for n in os.listdir(shard_dir) if n.endswith('.array_record'))
  assert len(shards) > 3
  os.remove(shard_dir / shards[2])  # its file's fingerprint is remembered: known bounds
  _fresh()
  again = preparation.packed_train_store(config)
  assert sorted(n for n in os.listdir(shard_dir) if n.endswith('.array_record')) == shards
  assert again.path == store.path
  np.testing.assert_array_equal(again.rows(np.arange(len(again))), rows)


def test_a_run_saved_on_an_old_store_gets_one_line_saying_why(tmp_path):
  write_corpus(tmp_path)
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'train-*.txt'), eval_files=str(tmp_path / 'eval.txt')
  )
  iterator = data.make_train_iterator(config, 4, seed=0)
  old = dict(iterator.get_state(), store='packed-L16-0123456789ab.int32')  # path-named corpus
  with pytest.raises(data.DataError) as raised:
    iterator.set_state(old)
  assert '\n' not in str(raised.value)
  assert "store='packed-L16-0123456789ab.int32'" in str(raised.value)
  assert 'identified by content' in str(raised.value) and 'new workdir' in str(raised.value)


def _defined_in_main():
  return 'main'


def test_worker_pools_skip_the_main_module_unless_a_job_refers_to_it(monkeypatch):
  """Spawned workers would import the parent's __main__ (a CLI that imports jax: seconds per
  worker); a pool starts without it unless the first job pickles a reference to __main__."""
  assert not workers._refers_to_main(('shard.array_record', 0, 10))  # pylint: disable=protected-access
  main = sys.modules['__main__']
  monkeypatch.setattr(_defined_in_main, '__module__', '__main__')
  monkeypatch.setattr(main, '_defined_in_main', _defined_in_main, raising=False)
  assert workers._refers_to_main((_defined_in_main, 0))  # pylint: disable=protected-access
  with workers._main_hidden():  # pylint: disable=protected-access
    hidden = sys.modules['__main__']
    assert hidden is not main and getattr(hidden, '__spec__', None) is None
    assert not hasattr(hidden, '__file__')
  assert sys.modules['__main__'] is main


def _many_files(directory, files: int, seed: int = 0) -> str:
  """`files` small .txt files (1-4 documents each) in three folders; their glob."""
  rng = np.random.default_rng(seed)
  words = 'the owl and a cat went to sea in green boat of pea honey money'.split()
  for i in range(files):
    os.makedirs(directory / f'part-{i % 3}', exist_ok=True)
    documents = [' '.join(rng.choice(words, 12)) + '.' for _ in range(rng.integers(1, 5))]
    (directory / f'part-{i % 3}' / f'page-{i:04d}.txt').write_text('\n\n'.join(documents) + '\n')
  return str(directory / 'part-*' / '*.txt')


def _listings(monkeypatch, under: str) -> list:
  """The directory listings (os.scandir, which glob and os.walk use, and os.listdir) of paths
  under `under` from now on."""
  listed = []
  for name in ('scandir', 'listdir'):
    real = getattr(os, name)

    def counted(path='.', real=real):
      if os.fspath(path).startswith(under):
        listed.append(os.fspath(path))
      return real(path)

    monkeypatch.setattr(os, name, counted)
  return listed


def test_the_tokenizer_sample_opens_each_shard_once_and_reads_the_same(tmp_path, monkeypatch):
  """The sample reads a shard a few documents at a time, window by window: the shard stays open
  between reads (opening one cost ten times reading a few documents), so it is opened once per
  shard, not once per read, and the texts are those of a fresh reader per read."""
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(file_corpus, 'GROUP_MIN_BYTES', 6_000)  # shards of a few windows each
  config = files_config(
    tmp_path, train_files=_many_files(tmp_path / 'corpus', 400), tokenizer_sample_chars=40_000
  )
  config = data.config.data_config(config)
  opened = sources.for_config(config).open(config, 1)
  prepared = {f.name: getattr(opened, f.name) for f in dataclasses.fields(opened)}
  sample = preparation._Sample(prepared, config.text_feature, config.tokenizer_sample_chars)  # pylint: disable=protected-access
  assert not sample.whole and sample.continues  # windows, across files' ends
  opens, real = [], array_record_module.ArrayRecordReader

  def counted(path, *args):
    opens.append(path)
    return real(path, *args)

  monkeypatch.setattr(array_record_module, 'ArrayRecordReader', counted)
  texts = list(sample)
  shards = {path for path, _, _ in sample.segments}
  assert len(shards) > 5 and 0 < len(opens) <= len(shards), (len(opens), len(shards))
  # A reader per read, as before: the same texts.
  monkeypatch.setattr(encoding.OpenShard, '__enter__', lambda self: self)
  opens.clear()
  assert list(sample) == texts
  assert len(opens) > 2 * len(shards), (len(opens), len(shards))  # what keeping it open saved


def test_per_file_work_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
  """Preparing 4x the files lists the cache's directories as often (once per preparation, not
  once per file or chunk: a listing of the shard directory per chunk made preparation
  quadratic in the files), and reads them in groups (a shard per group, not per file). Each
  file is stat'ed once (its check) and opened once, without a file object (os.open: a
  buffered file cost ~2.5x as much to open, read and close a small file)."""
  monkeypatch.setattr(file_corpus, 'GROUP_MIN_BYTES', 0)  # groups of ~8 files: many chunks
  counts = {}
  for files in (24, 96):
    directory = tmp_path / f'corpus-{files}'
    config = files_config(directory, train_files=_many_files(directory, files), eval_percent=5)
    listed = _listings(monkeypatch, config.data_dir)
    under = str(directory / 'part-')  # the corpus's files (and its glob, stat'ed once)
    stated, opened = _stats_under(monkeypatch, under), _opens_under(monkeypatch, under)
    corpus = file_corpus.open_corpus(data.config.data_config(config), config.data_dir, 1)
    monkeypatch.undo()
    monkeypatch.setattr(file_corpus, 'GROUP_MIN_BYTES', 0)
    shards = [n for n in os.listdir(os.path.join(config.data_dir, 'file-shards')) if '-train.' in n]
    counts[files] = (len(listed), len(shards), len(corpus.segments['train']))
    assert sorted(opened) == sorted(('os.open', p) for p in glob.glob(config.train_files))
    assert files <= len(stated) <= files + 1, len(stated)  # + the glob's isdir
  assert counts[24][0] == counts[96][0] <= 2, counts  # listings: constant
  assert 1 < counts[24][1] < 24 / 2 and counts[96][1] < 96 / 2, counts  # shards: per group
  assert counts[96][2] > 90  # each file its own segment of its group's shard (a few held out)


def _stats_under(monkeypatch, under: str) -> list:
  """The os.stat calls in this process of paths under `under` from now on."""
  stated, real = [], os.stat

  def counted(path, *args, real=real, **kwargs):
    if os.fspath(path).startswith(under):
      stated.append(os.fspath(path))
    return real(path, *args, **kwargs)

  monkeypatch.setattr(os, 'stat', counted)
  return stated


def _opens_under(monkeypatch, under: str) -> list:
  """('os.open' or 'open', path) of the files under `under` opened in this process from now
  on."""
  opened, real_open, real_os_open = [], builtins.open, os.open

  def counted_open(path, *args, **kwargs):
    if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(under):
      opened.append(('open', os.fspath(path)))
    return real_open(path, *args, **kwargs)

  def counted_os_open(path, *args, **kwargs):
    if os.fspath(path).startswith(under):
      opened.append(('os.open', os.fspath(path)))
    return real_os_open(path, *args, **kwargs)

  monkeypatch.setattr(builtins, 'open', counted_open)
  monkeypatch.setattr(os, 'open', counted_os_open)
  return opened


def _calls(monkeypatch, module, name: str) -> list:
  """The calls in this process of `module.name` from now on (their arguments)."""
  calls, real = [], getattr(module, name)

  def counted(*args, **kwargs):
    calls.append(args)
    return real(*args, **kwargs)

  monkeypatch.setattr(module, name, counted)
  return calls


@pytest.mark.slow
def test_one_and_two_workers_prepare_the_same_stores_from_many_files(tmp_path, monkeypatch):
  """Small files read in groups by 2 processes: the same documents, tokenizer, packed rows and
  digest as 1 process, for both held-out rules; with 2, the files' checks (a stat, a
  fingerprint each) and their identities run in the workers, not in the preparing process."""
  monkeypatch.setattr(file_corpus, 'GROUP_MIN_BYTES', 0)  # planned here, so workers follow
  monkeypatch.setattr(preparation, 'JOB_BYTES', 3_000)  # several encoding jobs
  monkeypatch.setattr(file_corpus, '_CHECK_IN_WORKERS_FROM', 0)  # decided here
  monkeypatch.setattr(file_corpus, '_CHECK_BATCH_FILES', 64)  # several check jobs
  train = _many_files(tmp_path / 'corpus', 300)
  for rule in ('file', 'document'):
    results = {}
    for num_workers in (1, 2):
      config = _big_corpus_config(tmp_path, train, f'cache-{rule}-{num_workers}')
      config.update(eval_holdout_by=rule, tokenizer_sample_chars=8_000)
      with monkeypatch.context() as patch:
        stated = _stats_under(patch, str(tmp_path / 'corpus'))
        listed = _calls(patch, file_corpus, '_file_identities')
        results[num_workers] = _prepare_all(config, num_workers)
      assert len(stated) >= 300 if num_workers == 1 else len(stated) < 10, len(stated)
      # each file's identity (for the digest and the manifest) made where its group is read
      identified = sum(len(files) for files, _ in listed)  # one call a chunk
      assert identified == (300 if num_workers == 1 else 0), identified
    one, two = results[1], results[2]
    assert one['texts'] == two['texts'] and one['tokenizer'] == two['tokenizer']
    assert one['digest'] == two['digest'] and one['store'] == two['store']
    np.testing.assert_array_equal(one['rows'], two['rows'])
    files = [n for n in os.listdir(tmp_path / f'cache-{rule}-2' / 'file-shards') if '-train.' in n]
    assert 10 < len(files) < 100  # groups of files, read by both workers
  workers.close_all()

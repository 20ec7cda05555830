"""Your own files as the corpus (data.train_files / eval_files): formats (.gz, .zst,
directories), held-out split, manifest, one-line errors naming the file, progress lines, and a
fresh data_dir shared by two preparations."""

import gzip
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time

import numpy as np
import pytest
from data_fixtures import files_config, write_corpus

from realformer_jax import data
from realformer_jax.data import corpus, file_corpus, sources, text_files
from realformer_jax.data.store import cache_lock


def _texts(records, feature='text'):
  return [sources.text_of(records[i], feature) for i in range(len(records))]


@pytest.mark.parametrize(
  'kind', ['txt', 'jsonl', 'txt.gz', 'txt.zst', 'jsonl.zst', 'directory', 'parquet']
)
def test_each_format_gives_the_same_documents_and_batches(tmp_path, kind):
  docs = write_corpus(tmp_path)
  train_docs = docs['train-0.txt'] + docs['train-1.txt']
  if kind == 'txt':
    train = str(tmp_path / 'train-*.txt')
  elif kind == 'jsonl':
    train = str(tmp_path / 'train.jsonl')
  elif kind == 'txt.gz':
    train = str(tmp_path / 'all.txt.gz')
    with gzip.open(train, 'wt') as f:
      f.write('\n\n'.join(train_docs))
  elif kind in ('txt.zst', 'jsonl.zst'):
    import zstandard  # pylint: disable=import-outside-toplevel

    source = tmp_path / ('train.jsonl' if kind == 'jsonl.zst' else 'train-0.txt')
    if kind == 'txt.zst':
      source.write_text('\n\n'.join(train_docs))
    train = str(tmp_path / f'all.{kind}')
    with open(train, 'wb') as f:
      f.write(zstandard.ZstdCompressor().compress(source.read_bytes()))
  elif kind == 'directory':  # its supported files, sorted; the rest (and hidden files) ignored
    os.makedirs(tmp_path / 'dir' / 'b')
    os.rename(tmp_path / 'train-0.txt', tmp_path / 'dir' / 'a.txt')
    os.rename(tmp_path / 'train-1.txt', tmp_path / 'dir' / 'b' / 'c.txt')
    (tmp_path / 'dir' / 'notes.md').write_text('not a corpus file')
    (tmp_path / 'dir' / '.hidden.txt').write_text('not read')
    train = str(tmp_path / 'dir')
  else:
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

    train = str(tmp_path / 'train.parquet')
    pq.write_table(pa.table({'text': train_docs, 'n': list(range(len(train_docs)))}), train)
  config = files_config(tmp_path, train_files=train, eval_files=str(tmp_path / 'eval.txt'))
  prepared = data.preparation.prepared_data(config)
  assert _texts(prepared.train_records) == train_docs
  assert _texts(prepared.eval_records) == docs['eval.txt']
  assert prepared.tokenizer.vocab_size == 60
  batch = next(data.make_train_iterator(config, 4, seed=0))
  assert batch['input_ids'].shape == (4, 16) and batch['masked_weights'].sum() > 0
  assert len(data.make_eval_iterator(config, 4)) > 0


def test_without_eval_files_a_stable_fraction_is_held_out(tmp_path):
  docs = write_corpus(tmp_path, docs_per_file=200)
  config = files_config(tmp_path, train_files=str(tmp_path / 'train-*.txt'), eval_percent=10.0)
  prepared = data.preparation.prepared_data(config)
  train, held_out = _texts(prepared.train_records), _texts(prepared.eval_records)
  everything = docs['train-0.txt'] + docs['train-1.txt']
  assert sorted(train + held_out) == sorted(everything)
  assert held_out == [t for t in everything if file_corpus.is_held_out(t, 10.0)]
  assert 0.05 < len(held_out) / len(everything) < 0.15
  # Too small a fraction for this corpus: one line saying what to do.
  with pytest.raises(data.DataError, match='too small to hold out data.eval_percent=0.001%'):
    data.prepare(
      files_config(tmp_path, train_files=str(tmp_path / 'train-0.txt'), eval_percent=1e-3)
    )


_PAGE_WORDS = 'ink quill page margin folio index verse gloss'.split()


def _pages(directory, files: int) -> dict:
  """`files` .txt pages of 3-6 paragraphs, no paragraph in two pages: {path: paragraphs}."""
  rng = np.random.default_rng(1)
  pages = {}
  for i in range(files):
    path = str(directory / 'pages' / f'page-{i:03d}.txt')
    pages[path] = [
      f'page {i} paragraph {j}: ' + ' '.join(rng.choice(_PAGE_WORDS, 8)) for j in range(3 + i % 4)
    ]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write('\n\n'.join(pages[path]) + '\n')
  return pages


def test_held_out_text_is_drawn_by_file_so_no_file_is_in_both_splits(tmp_path, caplog):
  pages = _pages(tmp_path, 80)
  config = files_config(tmp_path, train_files=str(tmp_path / 'pages'), eval_percent=10.0)
  with caplog.at_level(logging.WARNING, logger='realformer_jax.data.prepare'):
    prepared = data.preparation.prepared_data(config)  # auto: 8 files expected in eval
  assert 'held out 10% of the files (no file in both splits), data.eval_holdout_by=file' in (
    caplog.text
  )
  train, held_out = set(_texts(prepared.train_records)), set(_texts(prepared.eval_records))
  sides = {
    path: (set(paragraphs) <= train, set(paragraphs) <= held_out)
    for path, paragraphs in pages.items()
  }
  assert all(in_train != in_eval for in_train, in_eval in sides.values())  # whole files only
  eval_pages = sorted(p for p, (_, in_eval) in sides.items() if in_eval)
  assert eval_pages == sorted(
    p for p in pages if file_corpus.is_held_out_file(_sha256_of(p), 10.0)
  )  # chosen by content: a renamed or copied page keeps its side
  assert 2 <= len(eval_pages) <= 20

  # The paragraph rule, kept as an option: every page then has paragraphs in both splits' reach.
  by_document = files_config(
    tmp_path, train_files=str(tmp_path / 'pages'), eval_percent=10.0, eval_holdout_by='document'
  )
  prepared = data.preparation.prepared_data(by_document)
  everything = [t for paragraphs in pages.values() for t in paragraphs]
  assert _texts(prepared.eval_records) == [
    t for t in everything if file_corpus.is_held_out(t, 10.0)
  ]


def _sha256_of(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()  # a page is under the 64 KB a side hashes


def test_holding_out_files_from_too_few_files_is_one_line_naming_the_choice(tmp_path):
  write_corpus(tmp_path)
  with pytest.raises(data.DataError, match=r"of its files .*data.eval_holdout_by='document'"):
    data.prepare(
      files_config(tmp_path, train_files=str(tmp_path / 'train-*.txt'), eval_holdout_by='file')
    )
  with pytest.raises(
    data.DataError, match=r"eval_holdout_by='paragraph' is invalid: must be one of 'auto', 'file'"
  ):
    data.data_config(files_config(tmp_path, eval_holdout_by='paragraph'))


def test_held_out_jsonl_documents_are_drawn_by_a_field_so_no_group_is_in_both_splits(
  tmp_path, caplog
):
  """data.eval_holdout_by='field:doc': the paragraphs of one page (one 'doc' value) are on one
  side, in files that mix pages; the reading line names the rule; bad uses are one line."""
  rng = np.random.default_rng(0)
  words = 'the owl and a cat went to sea in green boat of pea honey money'.split()
  pages = {f'page-{p}': [' '.join(rng.choice(words, 8)) + f' {p}.{i}' for i in range(4)]
           for p in range(60)}  # fmt: skip
  lines = [{'text': t, 'doc': page} for page, texts in pages.items() for t in texts]
  order = rng.permutation(len(lines))  # a page's paragraphs spread over the files
  for part in range(3):
    with open(tmp_path / f'part-{part}.jsonl', 'w') as f:
      f.writelines(json.dumps(lines[i]) + '\n' for i in order[part::3])
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'part-*.jsonl'), eval_percent=20.0,
    eval_holdout_by='field:doc',
  )  # fmt: skip
  with caplog.at_level(logging.WARNING, logger='realformer_jax.data.prepare'):
    prepared = data.preparation.prepared_data(config)
  assert "held out 20% of the document groups by field 'doc' (no group in both splits)" in (
    caplog.text
  )
  train, held_out = set(_texts(prepared.train_records)), set(_texts(prepared.eval_records))
  eval_pages = {p for p, texts in pages.items() if set(texts) <= held_out}
  train_pages = {p for p, texts in pages.items() if set(texts) <= train}
  assert eval_pages | train_pages == set(pages) and not eval_pages & train_pages
  assert eval_pages == {p for p in pages if file_corpus.is_held_out(json.dumps(p), 20.0)}
  assert 4 <= len(eval_pages) <= 24

  (tmp_path / 'notes.txt').write_text('a page of text.\n')
  with pytest.raises(data.DataError, match=r"field:doc'.*notes.txt is a .txt file"):
    data.prepare(files_config(tmp_path, train_files=str(tmp_path / 'notes.txt'),
                              eval_holdout_by='field:doc'))  # fmt: skip
  with pytest.raises(data.DataError, match=r"part-0.jsonl: line 1 has no field 'page'"):
    data.prepare(files_config(tmp_path, train_files=str(tmp_path / 'part-*.jsonl'),
                              eval_holdout_by='field:page'))  # fmt: skip
  (tmp_path / 'null').mkdir()
  with open(tmp_path / 'null' / 'part.jsonl', 'w') as f:  # a null was one group of its own
    f.write(json.dumps({'text': 'a', 'doc': 'x'}) + '\n' + json.dumps({'text': 'b', 'doc': None}))
  with pytest.raises(data.DataError, match=r"part.jsonl: line 2 has null in field 'doc'"):
    data.prepare(files_config(tmp_path / 'null', train_files=str(tmp_path / 'null' / '*.jsonl'),
                              eval_holdout_by='field:doc'))  # fmt: skip
  with pytest.raises(data.DataError, match=r"eval_holdout_by='field:' is invalid: .*'field:NAME'"):
    data.data_config(files_config(tmp_path, eval_holdout_by='field:'))


def test_a_changed_file_gets_a_new_store_never_the_old_one(tmp_path):
  write_corpus(tmp_path)
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'train-*.txt'), eval_files=str(tmp_path / 'eval.txt')
  )
  first = data.preparation.packed_train_store(config)
  with open(tmp_path / 'train-1.txt', 'a') as f:
    f.write('\nan extra document about owls.\n')
  # A new process would see the new manifest; this one memoizes by config, so clear that.
  data.preparation._PREPARED.clear()
  data.preparation._PACKED.clear()
  second = data.preparation.packed_train_store(config)
  assert os.path.dirname(os.path.dirname(first.path)) != os.path.dirname(
    os.path.dirname(second.path)
  )
  assert len(second) >= len(first)
  corpus_dir = os.path.dirname(os.path.dirname(second.path))
  manifest = json.load(open(os.path.join(corpus_dir, file_corpus.MANIFEST)))
  assert [os.path.basename(f['path']) for f in manifest['train_files']] == [
    'train-0.txt',
    'train-1.txt',
  ]
  assert all(f['bytes'] > 0 and f['mtime_ns'] > 0 for f in manifest['train_files'])
  assert all(re.fullmatch('[0-9a-f]{64}', f['sha256']) for f in manifest['train_files'])
  assert os.path.basename(corpus_dir) == 'files-' + manifest['corpus_digest'][:12]
  assert second.record['corpus_digest'] == manifest['corpus_digest']
  assert data.preparation.corpus_digest(config) == manifest['corpus_digest']


def _bad_inputs(tmp_path):
  (tmp_path / 'empty.txt').write_bytes(b'')
  (tmp_path / 'binary.txt').write_bytes(b'fine text\nmore\x00binary')
  (tmp_path / 'latin1.txt').write_bytes('first line\ncaf\u00e9\n'.encode('latin-1'))
  (tmp_path / 'notjson.jsonl').write_text('{"text": "ok"}\n{not json}\n')
  (tmp_path / 'nofield.jsonl').write_text('{"text": "ok"}\n{"body": "no text here"}\n')
  (tmp_path / 'tiny.txt').write_text('owls watch.\n')
  (tmp_path / 'data.csv').write_text('a,b\n')
  (tmp_path / 'plain.txt.gz').write_text('not gzip at all\n')
  import zstandard  # pylint: disable=import-outside-toplevel

  # Two frames, the second cut short: zstandard's own stream reader ends at the cut silently.
  frame = zstandard.ZstdCompressor().compress(b'seven wise owls watch the old oaks.\n' * 500)
  (tmp_path / 'truncated.txt.zst').write_bytes(frame + frame[: len(frame) // 2])
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  pq.write_table(pa.table({'content': ['some text']}), str(tmp_path / 'nocolumn.parquet'))
  os.symlink(tmp_path / 'gone.txt', tmp_path / 'dangling.txt')  # an unmounted share, say
  os.makedirs(tmp_path / 'nothing_here')
  (tmp_path / 'nothing_here' / 'notes.md').write_text('no corpus file')


@pytest.mark.parametrize(
  'train_files, message',
  [
    ('missing-*.txt', r"data.train_files: '.*missing-\*.txt' matches no file"),
    ('dangling.txt', r'dangling.txt is a symbolic link to .*gone.txt, which does not exist'),
    ('nothing_here', r'directory .*nothing_here holds no file in a supported format'),
    ('empty.txt', r'empty.txt: the file is empty'),
    ('binary.txt', r'binary.txt: binary data \(a NUL byte\) at byte offset 14'),
    ('latin1.txt', r'latin1.txt: not UTF-8 text at byte offset 14 \(line 2\)'),
    ('notjson.jsonl', r'notjson.jsonl: line 2 is not JSON'),
    ('nofield.jsonl', r"nofield.jsonl: line 2 has no field 'text' .*\['body'\]"),
    ('nocolumn.parquet', r"nocolumn.parquet: Parquet file has no column 'text'.*\['content'\]"),
    ('data.csv', r"data.csv: unknown file format '.csv'"),
    ('plain.txt.gz', r'plain.txt.gz: cannot be read \(Not a gzipped file'),
    (
      'truncated.txt.zst',
      r'truncated.txt.zst: cannot be read \(the file ends inside a zstd frame: truncated\)',
    ),
    ('tiny.txt', r'packs into 1 sequences of max_len=16, fewer than one global batch \(4\)'),
  ],
)
def test_bad_input_is_one_line_naming_the_file(tmp_path, train_files, message):
  _bad_inputs(tmp_path)
  (tmp_path / 'eval.txt').write_text('seven wise owls watch the old oaks.\n')
  config = files_config(
    tmp_path,
    train_files=str(tmp_path / train_files),
    eval_files=str(tmp_path / 'eval.txt'),
    fit_vocab_to_corpus=True,
  )
  with pytest.raises(data.DataError, match=message) as error:
    data.make_train_iterator(config, 4, seed=0)
  assert '\n' not in str(error.value)


def test_a_zst_file_without_zstandard_is_one_line_naming_the_extra(tmp_path, monkeypatch):
  (tmp_path / 'corpus.jsonl.zst').write_bytes(b'(compressed)')
  monkeypatch.setitem(sys.modules, 'zstandard', None)  # as if not installed
  with pytest.raises(data.DataError) as raised:
    list(text_files.documents(str(tmp_path / 'corpus.jsonl.zst'), 'text'))
  assert str(raised.value) == (
    f'{tmp_path}/corpus.jsonl.zst: reading .zst needs the zstandard package: pip install '
    "'realformer_jax[zst]' (or pip install zstandard)."
  )


def test_eval_files_need_train_files():
  with pytest.raises(data.DataError, match='eval_files needs train_files'):
    data.validate_data_config(dict(data.default_data_config(), eval_files='x.txt'))


def test_a_fresh_data_dir_prepared_by_another_process_meanwhile(tmp_path):
  """Issue 30: the second of two first-time runs made its builder before the first finished
  preparing, then read no splits. Here the other process holds the preparation lock while
  this one starts; once it has prepared and released, this one must find the splits."""
  data_dir = str(tmp_path / 'tfds')
  config = data.default_data_config()
  config.data_dir = data_dir
  os.makedirs(data_dir)
  started, result = threading.Event(), {}

  def second_run():
    started.set()
    try:
      result['builder'] = sources.load_builder(data.data_config(config))
    except data.DataError as e:
      result['error'] = e

  with cache_lock.exclusive_lock(data_dir, 'prepare-bible_web'):
    thread = threading.Thread(target=second_run)
    thread.start()
    started.wait()
    time.sleep(0.5)  # it made its builder (unprepared) and now waits for the lock
    corpus.BibleWeb(data_dir=data_dir).download_and_prepare(file_format='array_record')
  thread.join()
  assert 'error' not in result, result.get('error')
  assert set(result['builder'].info.splits) == {'train', 'validation'}


def test_every_phase_reports_progress_in_plain_lines(tmp_path, monkeypatch, capfd):
  """Plain lines on stderr, each from its start (not in absl's log format), and each byte
  count says what it counts: the files as stored, or the documents' text."""
  from realformer_jax.data import preparation, progress  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(progress, 'PROGRESS_SECONDS', 0.0)
  write_corpus(tmp_path)
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'train-*.txt'), eval_files=str(tmp_path / 'eval.txt')
  )
  capfd.readouterr()
  preparation.packed_train_store(config)
  lines = capfd.readouterr().err
  files, text = r'[\d,.]+ MB of files', r'[\d,.]+ MB of text'
  assert re.search(
    rf'^prepare reading: {files} / [\d,.]+ MB \(\d+%\), [\d.]+ MB/s, [\d,]+ documents, ETA \d+ s$',
    lines,
    re.M,
  )
  assert re.search(rf'^prepare reading: done, {files}, [\d.]+ MB/s, 140 documents in', lines, re.M)
  # At once when training starts (then a line every few seconds: this one is too short).
  assert re.search(r'^prepare tokenizer: training bpe with 60 pieces, 4 threads', lines, re.M)
  assert re.search(
    r'^prepare tokenizer: done, trained bpe with 60 pieces on .* in [\d.]+ s', lines, re.M
  )
  assert re.search(
    rf'^prepare encoding\+packing: {text} / [\d,.]+ MB \(\d+%\), [\d.]+ MB/s, [\d,]+ documents, '
    r'[\d,]+ tokens, ETA \d+ s$',
    lines,
    re.M,
  )
  assert re.search(
    rf'^prepare encoding\+packing: done, {text}, .*120 documents, [\d,]+ tokens in', lines, re.M
  )
  assert '\x1b' not in lines and '\r' not in lines  # plain lines, no escape codes


def _stores(data_dir) -> dict:
  """{split: documents} of the only corpus under `data_dir`, from its manifest's shards."""
  (corpus_dir,) = [d for d in os.listdir(data_dir) if d.startswith('files-')]
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  with open(os.path.join(data_dir, corpus_dir, file_corpus.MANIFEST)) as f:
    manifest = json.load(f)
  documents = {}
  for split, record in manifest['splits'].items():
    documents[split] = []
    for path, _ in record['shards']:
      reader = array_record_module.ArrayRecordReader(os.path.join(data_dir, path))
      documents[split] += reader.read(0, reader.num_records())
      reader.close()
  return documents


def _shards(data_dir) -> dict:
  shard_dir = os.path.join(data_dir, 'file-shards')
  stats = {name: os.stat(os.path.join(shard_dir, name)) for name in os.listdir(shard_dir)}
  return {n: (s.st_ino, s.st_mtime_ns) for n, s in stats.items() if n.endswith('.array_record')}


def test_a_killed_preparation_reads_only_unfinished_files_again(tmp_path, monkeypatch):
  write_corpus(tmp_path, train_files=3)
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'train-*.txt'), eval_files=str(tmp_path / 'eval.txt')
  )
  monkeypatch.setattr(file_corpus, 'SMALL_FILE_BYTES', 0)  # a shard per file, not one group
  read_chunk = file_corpus._read_chunk
  calls = []

  def killed_after_the_first_file(chunk):
    if calls:
      raise KeyboardInterrupt  # what a kill leaves: the first shard published, no stores
    calls.append(chunk)
    return read_chunk(chunk)

  monkeypatch.setattr(file_corpus, '_read_chunk', killed_after_the_first_file)
  with pytest.raises(KeyboardInterrupt):
    data.prepare(config)
  first = _shards(config.data_dir)
  assert len(first) == 1
  assert not [n for n in os.listdir(os.path.join(config.data_dir, 'file-shards')) if '.tmp.' in n]
  monkeypatch.setattr(file_corpus, '_read_chunk', read_chunk)
  data.prepare(config)
  resumed = _shards(config.data_dir)
  assert len(resumed) == 4 and all(resumed[name] == stat for name, stat in first.items())
  clean = files_config(
    tmp_path,
    data_dir=str(tmp_path / 'clean'),
    train_files=config.train_files,
    eval_files=config.eval_files,
  )
  data.prepare(clean)
  assert _stores(config.data_dir) == _stores(clean.data_dir)

  # A changed file invalidates its own shard only; the others are not read again.
  with open(tmp_path / 'train-1.txt', 'a') as f:
    f.write('\nan extra document about owls.\n')
  data.preparation._PREPARED.clear()
  data.prepare(config)
  changed = _shards(config.data_dir)
  assert len(changed) == 5 and all(changed[name] == stat for name, stat in resumed.items())


@pytest.mark.parametrize(
  'name, content',
  [
    ('crlf.txt', 'a\r\nb\r\n\r\n  \t\nc\u00e9\n\n\n d \r\r\n\ne'),
    # No carriage return: split by one regular expression (_split_text_documents). Blank
    # lines of Unicode whitespace, leading and trailing blank lines, whitespace inside lines.
    ('lf.txt', '\n \n a\n\u00a0\n\x0bb\u3000\nc\n\x1c\n\n\nd \u2028\n\u2028\n\x85\ne\n  \n'),
    ('lines.jsonl', '{"text": "x"}\r\n\n{"text": "y\\u00e9"}\n   \n{"text": "z"}'),
  ],
)
def test_reading_a_file_in_one_block_gives_the_streamed_documents(
  tmp_path, monkeypatch, name, content
):
  """Uncompressed files are read and decoded in one piece (text_files._block_text); the
  documents must be those of reading line by line (CRLF, blank and whitespace lines, no final
  newline), for the whole file and for its exact byte ranges."""
  path = tmp_path / name
  path.write_bytes(content.encode())
  size = len(content.encode())
  monkeypatch.setattr(text_files, 'CHUNK_BYTES', 8)  # several ranges in a tiny file
  ranges = [None] + [
    text_files.exact_range(str(path), *r, size) for r in text_files.byte_ranges(str(path), size)
  ]
  block = [list(text_files.documents(str(path), 'text', r)) for r in ranges]
  monkeypatch.setattr(text_files, '_block_text', lambda *args: None)
  streamed = [list(text_files.documents(str(path), 'text', r)) for r in ranges]
  assert block == streamed
  assert sum(block[1:], []) == block[0] and len(ranges) > 2

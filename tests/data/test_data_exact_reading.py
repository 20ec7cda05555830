"""Reading exactly what was hashed, in-process (the command-level checks are in
tests/experiments/test_prepare_data_command.py): every format reads only a file's hashed bytes
when it has grown since; a file rewritten in place between hash and read is one error line;
document boundaries found by scanning blocks are those of reading line by line; huge documents
are cut for encoding at whitespace only; a phase that waits on one long job still prints."""

import gzip
import json
import os
import re

import numpy as np
import pytest
from data_fixtures import files_config, write_corpus

from realformer_jax import data
from realformer_jax.data import encoding, file_corpus, progress, text_files


def _parquet(path, texts):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  pq.write_table(pa.table({'text': texts}), str(path))


@pytest.mark.parametrize('name', ['a.txt', 'a.jsonl', 'a.txt.gz', 'a.txt.zst', 'a.parquet'])
def test_a_grown_file_gives_the_documents_of_its_hashed_bytes(tmp_path, name):
  path = tmp_path / name
  old, new = ['first document.', 'second document.'], ['appended document.']

  def write(texts, mode):
    if name.endswith('.jsonl'):
      payload = ''.join(json.dumps({'text': t}) + '\n' for t in texts).encode()
    else:
      payload = ('\n\n'.join(texts) + '\n\n').encode()
    if name.endswith('.gz'):
      payload = gzip.compress(payload)  # a second member, as `cat a.gz b.gz` makes
    if name.endswith('.zst'):
      import zstandard  # pylint: disable=import-outside-toplevel

      payload = zstandard.ZstdCompressor().compress(payload)  # a second frame
    with open(path, mode) as f:
      f.write(payload)

  if name.endswith('.parquet'):
    _parquet(path, old)
    size = path.stat().st_size
    with open(path, 'ab') as f:
      f.write(b'a writer still at work' * 100)
  else:
    write(old, 'wb')
    size = path.stat().st_size
    write(new, 'ab')
    assert list(text_files.documents(str(path), 'text')) == old + new
  assert list(text_files.documents(str(path), 'text', (0, size))) == old


def test_a_file_rewritten_between_hash_and_read_is_one_error_line(tmp_path, monkeypatch):
  write_corpus(tmp_path, train_files=1)
  # A file of SMALL_FILE_BYTES or more: hashed, read, hashed again (a smaller one is read once,
  # hashed and parsed from the same bytes, so it cannot change between the two).
  monkeypatch.setattr(file_corpus, 'SMALL_FILE_BYTES', 0)
  real_hash, calls = text_files.sha256_of_range, []

  def hash_then_rewrite(path, start, end):
    digest = real_hash(path, start, end)
    if not calls:  # the first file, once: same size, other bytes
      calls.append(path)
      with open(path, 'r+b') as f:
        f.write(b'THE')
    return digest

  monkeypatch.setattr(text_files, 'sha256_of_range', hash_then_rewrite)
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'train-0.txt'), eval_files=str(tmp_path / 'eval.txt')
  )
  with pytest.raises(
    data.DataError,
    match=r'train-0.txt: its bytes 0-[\d,]+ changed while it '
    r'was prepared .* --rehash',
  ) as raised:
    data.prepare(config)
  assert '\n' not in str(raised.value)
  # Nothing was published under the hash of the old content.
  assert not [p for p in (tmp_path / 'cache' / 'file-shards').iterdir() if p.suffix == '.json']


def _boundary_by_lines(path: str, offset: int, size: int) -> int:
  """text_files._boundary as it was written before the block scan: line by line."""
  if offset <= 0 or offset >= size:
    return min(max(offset, 0), size)
  with open(path, 'rb') as f:
    f.seek(offset - 1)
    f.readline()
    if not path.endswith('.txt'):
      return f.tell()
    while line := f.readline():
      if not line.strip():
        return f.tell()
  return size


def test_boundaries_scanned_in_blocks_are_those_of_reading_lines(tmp_path, monkeypatch):
  monkeypatch.setattr(text_files, '_SCAN_BLOCK', 5)  # matches across many block edges
  rng = np.random.default_rng(0)
  pieces = ['a', 'bc ', '\n', '\n', ' \n', '\t\t\n', '\r\n', '  ', 'x' * 12, '\u00e9']
  for trial in range(60):
    text = ''.join(rng.choice(pieces, int(rng.integers(0, 40))))
    for name in ('t.txt', 't.jsonl'):
      path = tmp_path / name
      path.write_bytes(text.encode())
      size = path.stat().st_size
      with open(path, 'rb') as f:
        for offset in range(size + 1):
          expected = _boundary_by_lines(str(path), offset, size)
          assert text_files._boundary(f, str(path), offset, size) == expected, (trial, text)


def test_huge_documents_are_cut_for_encoding_at_whitespace_only(monkeypatch):
  monkeypatch.setattr(encoding, 'PIECE_BYTES', 16)
  text = b'seven wise owls\nwatch the\told oaks ' + b'x' * 40 + b' end'
  pieces = encoding.pieces_of(text)
  assert b''.join(pieces) == text and len(pieces) > 2
  for piece in pieces[1:]:
    assert piece[:1] in (b' ', b'\n', b'\t')  # each cut is just before whitespace
  assert max(len(p) for p in pieces[:-2]) <= 16  # longer only where no whitespace is
  assert encoding.pieces_of(b'short') == [b'short']


def test_a_phase_waiting_on_one_long_job_still_prints(monkeypatch, capfd):
  monkeypatch.setattr(progress, 'PROGRESS_SECONDS', 0.1)
  with progress.Progress('encoding+packing', 'text', total_bytes=10) as phase:
    import time  # pylint: disable=import-outside-toplevel

    time.sleep(0.5)  # no update: one huge document's job
    phase.done()
    time.sleep(0.3)
  lines = capfd.readouterr().err.splitlines()
  waiting = [
    line
    for line in lines
    if re.fullmatch(
      r'prepare encoding\+packing: 0.0 MB of text '
      r'/ 0.0 MB \(0%\), .*ETA \?',
      line,
    )
  ]
  assert len(waiting) >= 2
  assert lines[-1].startswith('prepare encoding+packing: done')  # nothing after the summary


def test_a_tokenizer_cached_before_byte_sampling_is_reused_so_started_runs_resume(
  tmp_path, monkeypatch
):
  """A corpus larger than the tokenizer's sample had its tokenizer cached under a key without
  'sampling' before samples were taken by bytes, then under 'byte windows' while windows
  stopped at a file's end; runs started on it record its digest, so it is reused (said in a
  note), not trained again under the new key."""
  from data_fixtures import files_config, write_corpus  # pylint: disable=import-outside-toplevel

  from realformer_jax import data  # pylint: disable=import-outside-toplevel
  from realformer_jax.data import preparation, tokenizers  # pylint: disable=import-outside-toplevel

  write_corpus(tmp_path, train_files=2, docs_per_file=80)
  config = files_config(
    tmp_path,
    train_files=str(tmp_path / 'train-*.txt'),
    eval_files=str(tmp_path / 'eval.txt'),
    tokenizer_sample_chars=2_000,
  )
  keys, paths = [], []
  real = tokenizers.cache_path

  def spy(*args, **kwargs):
    keys.append(dict(kwargs['key']))
    paths.append(real(*args, **kwargs))
    return paths[-1]

  monkeypatch.setattr(tokenizers, 'cache_path', spy)
  first = data.prepare(config)
  assert [k.get('sampling') for k in keys[:3]] == [
    None,
    'byte windows',
    'byte windows across files',
  ]
  new = next(p for p in (tmp_path / 'cache').rglob('spm-*.model'))
  assert str(new) == paths[2]
  for earlier, when in (
    (paths[0], 'trained before samples were taken by bytes'),
    (paths[1], 'trained while sample windows stopped at the end of a file'),
  ):
    os.replace(new, earlier)  # as the cache of a data_dir prepared before the change
    monkeypatch.setattr(preparation, '_PREPARED', {})  # as a new process
    notes = []
    monkeypatch.setattr(preparation, 'say', notes.append)
    again = data.prepare(config)
    assert any(f'reusing the tokenizer {when}' in n for n in notes), notes
    assert not new.exists() and again.source == earlier
    assert again._model_proto == first._model_proto  # pylint: disable=protected-access
    new = type(new)(earlier)

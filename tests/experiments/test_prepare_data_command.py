"""`experiments.prepare_data` on the corpus faults of issue 59, through the real command (a
subprocess, toy overrides): a file appended to while it is prepared is read as it was hashed; a
dangling directory link, a FIFO, eval files that are train files, a data_dir under a file, a
one-document file asked to hold out a fraction and a corpus smaller than one global batch are
each one `error:` line; files of other formats are named in one note and every line is plain,
the reading line saying when its megabytes are compressed ones; the tokenizer's sample spans
every file of a corpus of a few large documents; a same-size edit with its time restored needs
--rehash (the fast check's documented limit); stale ids directories of dead processes and a
damaged tokenizer cache are cleaned up; Ctrl-C during tokenizer training answers at once."""

import concurrent.futures
import gzip
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import repo_paths
from data_fixtures import write_corpus
from toy_flags import TRAIN_TOY_FLAGS

from realformer_jax.data import tokenizers

pytestmark = pytest.mark.slow  # every test starts the command (~2-5 s CPU each)

_LAUNCHER = os.path.join(repo_paths.TESTS, 'prepare_fault_launcher.py')
# The training toy flags, with a tokenizer small enough for a few KB of text.
_TOY = dict(
  TRAIN_TOY_FLAGS, **{'data.vocab_size': 60, 'data.tokenizer_model_type': 'bpe', 'data.max_len': 16}
)


def _prepare(data_dir, *flags, faults: str = '', env=None, **popen) -> subprocess.CompletedProcess:
  """`python -m experiments.prepare_data --config=configs/tiny.py` at toy size on `data_dir`,
  with `flags` after the toy ones (so they win), through the fault launcher if `faults`."""
  argv = (
    [sys.executable, _LAUNCHER] if faults else [sys.executable, '-m', 'experiments.prepare_data']
  )
  argv += ['--config=configs/tiny.py', f'--config.data.data_dir={data_dir}']
  argv += [f'--config.{k}={v}' for k, v in _TOY.items()] + list(flags)
  env = dict(os.environ, **(env or {}), REALFORMER_PREPARE_FAULTS=faults)
  if popen:
    return subprocess.Popen(argv, cwd=repo_paths.REPO, env=env, text=True, **popen)
  return subprocess.run(
    argv, cwd=repo_paths.REPO, env=env, capture_output=True, text=True, timeout=300
  )


def _ok(result) -> str:
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout + result.stderr


def _manifest(data_dir, output: str) -> dict:
  corpus = re.search(r'prepared corpus (files-[0-9a-f]+)', output)[1]
  with open(os.path.join(data_dir, corpus, 'corpus.json')) as f:
    return json.load(f)


def _records(data_dir, shard: str) -> list[bytes]:
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  reader = array_record_module.ArrayRecordReader(os.path.join(data_dir, shard))
  try:
    return reader.read(0, reader.num_records())
  finally:
    reader.close()


def test_a_file_appended_to_while_it_is_prepared_is_read_as_it_was_hashed(tmp_path):
  docs = write_corpus(tmp_path, train_files=1)
  train, data_dir = str(tmp_path / 'train-0.txt'), str(tmp_path / 'cache')
  flags = [f'--config.data.train_files={train}', f'--config.data.eval_files={tmp_path}/eval.txt']
  appended = '\n\nan appended document about seven owls.\n'
  first = _ok(_prepare(data_dir, *flags, '--workers=1', faults=f'append_after_hash:{appended}'))
  assert f'FAULT: appended to {train}' in first
  manifest = _manifest(data_dir, first)
  assert manifest['splits']['train']['documents'] == len(docs['train-0.txt']) == 60
  ((shard, count),) = manifest['splits']['train']['shards']
  # The shard named by the old content holds the old content, not the appended document.
  assert [d.decode() for d in _records(data_dir, shard)] == docs['train-0.txt']
  # The next start sees the new content: a new corpus, and the old shard is left as it was.
  second = _manifest(data_dir, _ok(_prepare(data_dir, *flags)))
  assert second['corpus_digest'] != manifest['corpus_digest']
  assert second['splits']['train']['documents'] == 61
  assert len(_records(data_dir, shard)) == count == 60


def _bad_corpora(tmp_path) -> dict:
  """{name: (flags, the error line's pattern)}, each a corpus the command must refuse."""
  write_corpus(tmp_path)
  eval_flag = f'--config.data.eval_files={tmp_path}/eval.txt'
  folder = tmp_path / 'folder'
  os.makedirs(folder)
  (folder / 'a.txt').write_text('seven wise owls watch the old oaks.\n')
  os.symlink(tmp_path / 'unmounted', folder / 'more')  # a directory that is not there
  deep = tmp_path / 'deep' / 'x'
  os.makedirs(deep)
  (deep / 'a.txt').write_text('seven wise owls watch the old oaks.\n')
  os.symlink(tmp_path / 'unmounted', deep / 'gone')
  piped = tmp_path / 'piped'
  os.makedirs(piped)
  (piped / 'a.txt').write_text('seven wise owls watch the old oaks.\n')
  os.mkfifo(piped / 'b.txt')
  (tmp_path / 'copy.txt').write_bytes((tmp_path / 'train-1.txt').read_bytes())
  (tmp_path / 'a_file').write_text('not a directory')
  (tmp_path / 'one_line.txt').write_text(' '.join(['seven wise owls watch the old oaks.'] * 300))
  train = f'--config.data.train_files={tmp_path}/train-*.txt'
  return {
    'dangling directory link': (
      [f'--config.data.train_files={folder}', eval_flag],
      rf'data.train_files: {folder}/more is a symbolic link to {tmp_path}/unmounted, which does '
      'not exist',
    ),
    'dangling link under **': (
      [f'--config.data.train_files={tmp_path}/deep/**/*.txt', eval_flag],
      rf'data.train_files: {deep}/gone is a symbolic link to .*, which does not exist',
    ),
    'fifo': (
      [f'--config.data.train_files={piped}', eval_flag],
      rf'data.train_files: {piped}/b.txt is a named pipe \(FIFO\).*not a regular file',
    ),
    'eval files are train files': (
      [train, f'--config.data.eval_files={tmp_path}/train-1.txt'],
      rf'data.eval_files: {tmp_path}/train-1.txt is the same file as {tmp_path}/train-1.txt in '
      'data.train_files: evaluation would run on training data',
    ),
    'eval files copy train files': (
      [train, f'--config.data.eval_files={tmp_path}/copy.txt'],
      rf'data.eval_files: {tmp_path}/copy.txt has the same content as {tmp_path}/train-1.txt in '
      'data.train_files',
    ),
    'data_dir under a file': (
      [train, eval_flag, f'--config.data.data_dir={tmp_path}/a_file/cache'],
      rf'data.data_dir={tmp_path}/a_file/cache is under {tmp_path}/a_file, which is a file',
    ),
    'one document to hold out from': (
      [f'--config.data.train_files={tmp_path}/one_line.txt'],
      r'too small to hold out data.eval_percent=1.0% of its documents for evaluation \(none of '
      r'its 1 document\(s\) fell there; in a .txt file a blank line ends a document',
    ),
    'fewer sequences than one global batch': (
      [train, eval_flag, '--config.train.global_batch_size=4096'],
      r'packs into \d+ sequences of max_len=16, fewer than one global batch \(4096\)',
    ),
  }


def test_bad_corpora_are_one_error_line_each(tmp_path):
  cases = _bad_corpora(tmp_path)
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    runs = {
      name: pool.submit(_prepare, str(tmp_path / f'cache-{i}'), *flags)
      for i, (name, (flags, _)) in enumerate(cases.items())
    }
  for name, (_, pattern) in cases.items():
    result = runs[name].result()
    errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    assert result.returncode == 1 and len(errors) == 1, (name, result.stderr[-2000:])
    assert re.search(pattern, errors[0]), (name, errors[0])
    assert 'Traceback' not in result.stderr, name


def test_left_out_files_are_named_and_every_line_is_plain(tmp_path):
  write_corpus(tmp_path)
  os.makedirs(tmp_path / 'corpus')
  for name in ('train-0.txt', 'train-1.txt'):
    os.rename(tmp_path / name, tmp_path / 'corpus' / name)
  for name in ('notes.md', 'c.text', 'README'):
    (tmp_path / 'corpus' / name).write_text('not a corpus file\n')
  output = _ok(
    _prepare(
      str(tmp_path / 'cache'),
      f'--config.data.train_files={tmp_path}/corpus',
      f'--config.data.eval_files={tmp_path}/eval.txt',
    )
  )
  assert re.search(
    rf'^note: data.train_files: left out 3 file\(s\) under {tmp_path}/corpus in no supported '
    r'format \(.txt, .jsonl, .json, .parquet, optionally .gz or .zst\): README, c.text, '
    r'notes.md$',
    output,
    re.M,
  )
  # Plain lines from their first column (not absl's 'W1128 12:41:46.1 ... progress.py:87]'),
  # each byte count saying what it counts.
  assert re.search(r'^prepare reading: done, [\d.,]+ MB of files, ', output, re.M)
  assert re.search(r'^prepare encoding\+packing: done, [\d.,]+ MB of text, ', output, re.M)
  assert not re.search(r'^[IWE]\d{4} ', output, re.M)


def test_the_reading_line_says_its_megabytes_are_compressed(tmp_path):
  """A .gz corpus: the reading phase counts the bytes as stored, the encoding phase the text;
  each summary line says which, so 'MB of files' is not read as text."""
  write_corpus(tmp_path, docs_per_file=1000)  # ~0.2 MB of text a file
  for name in ('train-0.txt', 'train-1.txt', 'eval.txt'):
    with open(tmp_path / name, 'rb') as f, gzip.open(tmp_path / f'{name}.gz', 'wb') as out:
      out.write(f.read())
  output = _ok(
    _prepare(
      str(tmp_path / 'cache'),
      f'--config.data.train_files={tmp_path}/train-*.txt.gz',
      f'--config.data.eval_files={tmp_path}/eval.txt.gz',
    )
  )
  read = re.search(r'^prepare reading: done, ([\d.,]+) MB of compressed files, ', output, re.M)
  encoded = re.search(r'^prepare encoding\+packing: done, ([\d.,]+) MB of text, ', output, re.M)
  assert read and encoded, output
  assert float(read[1].replace(',', '')) < float(encoded[1].replace(',', ''))


# Six scripts, one a file: a character never sampled is a piece the tokenizer lacks.
_ALPHABETS = (
  'abcdefghijklmnopqrst',
  'αβγδεζηθικλμνξοπρστυ',
  'абвгдежзиклмнопрсту',
  'աբգդեզէըթժիլխծկհձղճմ',
  'აბგდევზთიკლმნოპჟრსტუ',
  'אבגדהוזחטיכלמנסעפצקר',
)


def test_the_tokenizer_sample_spans_every_file_by_bytes(tmp_path):
  """Six files of one large document each (a sentence a line, no blank line): the sample
  stepped over documents trained on one file; by bytes it reads every file. A corpus of one
  document used to have no text to train on."""
  rng = np.random.default_rng(0)
  for i, alphabet in enumerate(_ALPHABETS):
    letters = list(alphabet)
    lines = [' '.join(''.join(rng.choice(letters, 5)) for _ in range(8)) + '.' for _ in range(400)]
    (tmp_path / f'book-{i}.txt').write_text('\n'.join(lines) + '\n')  # one document
  (tmp_path / 'eval.txt').write_text('abcde fghij.\n')
  common = [f'--config.data.eval_files={tmp_path}/eval.txt', '--config.data.vocab_size=300']
  # ~23 KB a file; a sample of 40,000 characters is a fraction of each.
  spread = _prepare(
    str(tmp_path / 'cache'),
    f'--config.data.train_files={tmp_path}/book-*.txt',
    '--config.data.tokenizer_sample_chars=40000',
    *common,
  )
  single = _prepare(
    str(tmp_path / 'cache-single'),
    f'--config.data.train_files={tmp_path}/book-0.txt',
    '--config.data.tokenizer_sample_chars=5000',
    *common,
  )
  path = re.search(r'tokenizer (\S+\.model) \(', _ok(spread))[1]
  tokenizer = tokenizers.load(path)
  for alphabet in _ALPHABETS:
    assert tokenizer.unk_id not in tokenizer.encode(alphabet), alphabet
  with open(path + '.json') as f:
    sample = json.load(f)['sample']
  assert sample['method'] == 'windows spread evenly over the train text by bytes'
  _ok(single)


def test_a_same_size_edit_with_its_time_restored_needs_rehash(tmp_path):
  """The fast check's documented limit, one flag away; on the way, the ids directories that
  killed preparations left in TMPDIR are removed (of dead processes only), and a tokenizer
  cache damaged in place is trained again with a note."""
  write_corpus(tmp_path, train_files=1)
  train, data_dir = tmp_path / 'train-0.txt', str(tmp_path / 'cache')
  flags = [f'--config.data.train_files={train}', f'--config.data.eval_files={tmp_path}/eval.txt']
  tmpdir = tmp_path / 'tmp'
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  host = socket.gethostname()
  stale = tmpdir / f'realformer-encode-{host}-{dead.pid}-abc123'
  alive = tmpdir / f'realformer-encode-{host}-{os.getpid()}-def456'
  for directory in (stale, alive):
    os.makedirs(directory)
    (directory / 'ids.int32').write_bytes(bytes(1024))
  first = _ok(_prepare(data_dir, *flags, env={'TMPDIR': str(tmpdir)}))
  assert not stale.exists() and alive.exists()

  before = os.stat(train)
  text = train.read_bytes()
  train.write_bytes(text.replace(b'owls', b'OWLS', 1))  # same size
  os.utime(train, ns=(before.st_atime_ns, before.st_mtime_ns))
  digest = _manifest(data_dir, first)['corpus_digest']
  assert _manifest(data_dir, _ok(_prepare(data_dir, *flags)))['corpus_digest'] == digest
  rehashed = _manifest(data_dir, _ok(_prepare(data_dir, *flags, '--rehash')))
  assert rehashed['corpus_digest'] != digest
  output = _ok(_prepare(data_dir, *flags))
  assert _manifest(data_dir, output)['corpus_digest'] == rehashed['corpus_digest']

  model = re.search(r'tokenizer (\S+\.model) \(', output)[1]
  stat = os.stat(model)
  with open(model, 'r+b') as f:
    f.write(b'\xff' * 64)  # damaged in place, its size and time kept
  os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  repaired = _ok(_prepare(data_dir, *flags))
  assert re.search(
    rf'note: cache {re.escape(model)} is damaged \(its size and time are as recorded, but its '
    r'bytes are not a SentencePiece model\): training the tokenizer again',
    repaired,
  )
  tokenizers.load(model)


def test_ctrl_c_during_tokenizer_training_answers_at_once(tmp_path):
  write_corpus(tmp_path, train_files=1)
  process = _prepare(
    str(tmp_path / 'cache'),
    f'--config.data.train_files={tmp_path}/train-0.txt',
    f'--config.data.eval_files={tmp_path}/eval.txt',
    faults='blocking_trainer',
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )
  lines = queue.Queue()
  threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()

  def wait_for(text: str, seconds: float) -> float:
    deadline = time.monotonic() + seconds
    seen = []
    while time.monotonic() < deadline:
      try:
        seen.append(lines.get(timeout=deadline - time.monotonic()))
      except queue.Empty:
        break
      if text in seen[-1]:
        return time.monotonic()
    process.kill()
    raise AssertionError(f'no {text!r} in {seen}')

  try:
    wait_for('FAULT: trainer blocked', 120)
    time.sleep(0.5)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    answered = wait_for('prepare tokenizer: interrupted', 10)
    assert answered - sent < 5  # the trainer's call goes on for ~60 s
    assert process.wait(timeout=20) == 130
  finally:
    process.kill()

"""corpus_changes.since_prepared: what a listing of the files tells of a file corpus since its
store was prepared (a recorded corpus.json, written here as file_corpus writes it). The refusal
through the real command: tests/train/test_faults_issue68_edges.py."""

import json
import os
import time
import types

from realformer_jax.data import corpus_changes, text_files

STORE = 'packed-L16-0123456789ab.int32'


def _corpus(tmp_path, names):
  directory = tmp_path / 'corpus'
  directory.mkdir(exist_ok=True)
  for name in names:
    (directory / name).write_text(f'{name} holds a document.\n')
  return directory


def _record(tmp_path, directory):
  """corpus.json of the corpus under data_dir, beside the packed store STORE, as prepared now."""
  corpus_dir = tmp_path / 'data' / 'files-0123456789ab'
  (corpus_dir / 'packed').mkdir(parents=True)
  (corpus_dir / 'packed' / f'{STORE}.json').write_text('{}')
  files = [text_files.fingerprint(p) for p in sorted(map(str, directory.glob('*.txt')))]
  (corpus_dir / 'corpus.json').write_text(json.dumps({'train_files': files}))
  return str(corpus_dir / 'corpus.json')


def _config(tmp_path, directory):
  return types.SimpleNamespace(
    train_files=f'{directory}/*.txt', eval_files='', data_dir=str(tmp_path / 'data')
  )


def test_added_files_are_named_up_to_three_and_counted(tmp_path):
  directory = _corpus(tmp_path, ['a.txt', 'b.txt'])
  manifest = _record(tmp_path, directory)
  _corpus(tmp_path, ['c.txt', 'd.txt', 'e.txt', 'f.txt'])
  changes = corpus_changes.since_prepared(_config(tmp_path, directory), STORE)
  assert changes.verb == 'grew'
  assert changes.before[0] == 2 and changes.now[0] == 6
  line = changes.describe(since='checkpoint step 8')
  listed = ', '.join(str(directory / n) for n in ('c.txt', 'd.txt', 'e.txt'))
  assert line.startswith(f'grew since checkpoint step 8 (4 files added: {listed} (+1 more)): ')
  assert line.endswith(f'the run trained on 2 files of 0.00 MB ({manifest})')


def test_removed_and_resized_files_are_named(tmp_path):
  directory = _corpus(tmp_path, ['a.txt', 'b.txt', 'c.txt'])
  _record(tmp_path, directory)
  (directory / 'a.txt').unlink()
  with open(directory / 'b.txt', 'a') as f:
    f.write('more\n')
  changes = corpus_changes.since_prepared(_config(tmp_path, directory), STORE)
  assert changes.verb == 'changed'
  assert changes.removed == [str(directory / 'a.txt')]
  assert changes.resized == [(str(directory / 'b.txt'), 24, 29)]


def test_a_touched_or_unchanged_corpus_is_left_to_preparation(tmp_path):
  """Same sizes in the same order may be the same content (a touch): not judged by a listing."""
  directory = _corpus(tmp_path, ['a.txt', 'b.txt'])
  config = _config(tmp_path, directory)
  _record(tmp_path, directory)
  assert corpus_changes.since_prepared(config, STORE) is None
  later = time.time() + 100
  os.utime(directory / 'a.txt', (later, later))
  assert corpus_changes.since_prepared(config, STORE) is None


def test_no_recorded_corpus_is_no_check(tmp_path):
  """A TFDS run (no train_files), a store not found under data_dir: nothing to compare."""
  directory = _corpus(tmp_path, ['a.txt'])
  _record(tmp_path, directory)
  _corpus(tmp_path, ['b.txt'])
  config = _config(tmp_path, directory)
  assert corpus_changes.since_prepared(config, 'packed-L16-another.int32') is None
  assert corpus_changes.since_prepared(config, None) is None
  tfds = types.SimpleNamespace(train_files='', eval_files='', data_dir=config.data_dir)
  assert corpus_changes.since_prepared(tfds, STORE) is None

"""A file corpus's manifest and digest are joined from texts each chunk's reader made
(file_corpus._listing): the bytes json encodes the whole lists as, for grouped small files and
a file read in byte ranges alike."""

import hashlib
import json
import os

import numpy as np
from data_fixtures import files_config, write_corpus

from realformer_jax import data
from realformer_jax.data import file_corpus, text_files


def _pages(directory, files: int) -> None:
  """`files` small .txt files of 1-4 documents in two folders."""
  rng = np.random.default_rng(0)
  words = 'the owl and a cat went to sea in green boat of pea honey money'.split()
  for i in range(files):
    os.makedirs(directory / f'part-{i % 2}', exist_ok=True)
    documents = [' '.join(rng.choice(words, 12)) + '.' for _ in range(rng.integers(1, 5))]
    (directory / f'part-{i % 2}' / f'page-{i:03d}.txt').write_text('\n\n'.join(documents) + '\n')


def test_the_manifest_and_digest_are_the_json_of_the_whole_lists(tmp_path, monkeypatch):
  monkeypatch.setattr(text_files, 'CHUNK_BYTES', 40_000)  # train-0.txt in ranges
  monkeypatch.setattr(file_corpus, 'SMALL_FILE_BYTES', 40_000)
  monkeypatch.setattr(file_corpus, 'GROUP_MIN_BYTES', 0)  # the pages in several groups
  write_corpus(tmp_path, train_files=1, docs_per_file=400)
  _pages(tmp_path / 'pages', 40)
  config = files_config(
    tmp_path,
    train_files=f'{tmp_path}/pages/part-*/*.txt,{tmp_path}/train-0.txt',
    eval_files=f'{tmp_path}/eval.txt',
  )
  corpus = file_corpus.open_corpus(data.config.data_config(config), config.data_dir, 1)

  with open(os.path.join(corpus.directory, file_corpus.MANIFEST), 'rb') as f:
    written = f.read()
  manifest = json.loads(written)
  # as atomic_files.write_json(..., indent=None) writes it: sorted keys, json's separators
  assert written == json.dumps(manifest, sort_keys=True).encode()
  assert [len(manifest[f'{s}_files']) for s in file_corpus.SPLITS] == [41, 1]
  large = manifest['train_files'][-1]
  assert large['path'].endswith('train-0.txt') and large['bytes'] > 40_000  # in ranges
  identity = {k: v for k, v in manifest.items() if k not in ('corpus_digest', 'splits')}
  for split in file_corpus.SPLITS:
    identity[f'{split}_files'] = [
      {'format': f['format'], 'sha256': f['sha256']} for f in manifest[f'{split}_files']
    ]
  digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
  assert manifest['corpus_digest'] == corpus.digest == digest
  page = manifest['train_files'][0]
  assert (
    page['sha256']
    == hashlib.sha256(
      hashlib.sha256(open(page['path'], 'rb').read()).hexdigest().encode()
    ).hexdigest()
  )  # a file read whole: the digest of its one chunk's digest

"""Your own files as the corpus, identified by their content and read into document shards.

`data.train_files` (and `data.eval_files`, else a held-out fraction) are read by text_files.py
in chunks: a small or compressed file is one chunk, a large uncompressed one a chunk per
`text_files.CHUNK_BYTES` (bounds moved to document boundaries). Each chunk becomes a shard
under `<data_dir>/file-shards/`, one array_record file per split it feeds, named by a hash of
the chunk's bytes (SHA-256) and the reading settings. `workers` processes read chunks at once.

Identity. A corpus is its content: its digest hashes every chunk's SHA-256, in file order, with
the reading settings (text feature, held-out percent or eval files). It names the corpus
directory `<data_dir>/files-<digest>/` (which holds `corpus.json`, the tokenizers and the
packed stores, whose names derive from it), so a touched, renamed, moved or copied file that is
unchanged keeps every store and a run resumable, and an edited one gives a new corpus that is
never mixed with the old. A chunk is read as exactly the bytes that were hashed (a file appended
to meanwhile, up to its hashed end), and hashed again before its shard is published: a file
rewritten in place meanwhile is a DataError, never a shard named by content it does not hold.
Path, size and modification time are only a fast "unchanged" check:
`<data_dir>/file-shards/fingerprints/` remembers each file's chunk digests under its path, size
and time, so an unchanged corpus is not read at all on a later start; a file whose
fingerprint is new is hashed (a fast pass, ~GB/s) and read only if that content was never read.
Its limit: an edit that keeps the size and restores the time keeps the old digests until
`forget_fingerprints` (experiments.prepare_data --rehash). Eval files that are train files (by
real path or by content) are refused.
`corpus.json` records the corpus digest (`corpus_digest`), each file's path, size, time and
SHA-256 (of its chunk digests), and the shards of each split with their document and byte counts.

The splits are the shards in file order, read through one grain source each (no joined copy),
so the documents are the same whatever the number of workers. Held out when `eval_files` is
empty: a document goes to eval when a stable hash of its text falls in the lowest
`data.eval_percent` percent (default 1%), so duplicates never straddle the split and the choice
does not depend on file order or chunking.

Shards are written under a lock of their own (store/cache_lock.py) through a temporary name and a
rename, with a sidecar holding their counts (store/cache_integrity.py), so a killed preparation
reads again only the chunks it had not finished, concurrent preparations (processes, or hosts
sharing the data_dir) read each chunk once, and a temporary file left by a dead writer is removed by
the next one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import json
import os
import threading
from typing import Optional

from realformer_jax import atomic_files
from realformer_jax.data import text_files, workers
from realformer_jax.data.errors import DataError
from realformer_jax.data.progress import Progress
from realformer_jax.data.store import cache_integrity, cache_lock

# Bump when reading or the shard layout changes, so old shards are not reused. 2: content
# identity and chunks (1 named corpora by path, size and time, and joined the shards).
_REVISION = 2
SPLITS = ('train', 'eval')
_SHARD_DIR = 'file-shards'
_FINGERPRINT_DIR = 'fingerprints'
MANIFEST = 'corpus.json'
# What a shard's sidecar counts of its documents.
_COUNTS = ('documents', 'text_bytes')
# A record per chunk (random access for the tokenizer sample, and what grain asks for: it logs an
# error on other group sizes), uncompressed: the shard is written once and read once more by
# the encoding workers. CPU ms per MB of text to write + read, measured on generated English
# (2026-11-26/27): array_record's default zstd 30 + 14, snappy 8-13 + 7-12, uncompressed 4 + 5;
# the files are 0.71x, 0.99x and 1.09x the text (a document alone barely compresses with
# snappy). Readers take any options, so shards written before stay valid.
_SHARD_OPTIONS = 'group_size:1,uncompressed'


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A prepared file corpus: `records[split]` is a grain MapDataset of {text_feature: bytes}."""

  name: str  # 'files-<digest[:12]>'
  directory: str  # <data_dir>/<name>: the manifest, tokenizers/ and packed/
  digest: str  # SHA-256 of the content and reading settings
  records: dict  # split -> grain.MapDataset over the split's shards
  shards: dict  # split -> [(path, documents, text bytes)] in file order (documents > 0)
  text_bytes: dict  # split -> UTF-8 bytes of its documents


@dataclasses.dataclass(frozen=True)
class _Chunk:
  """One job: bytes [start, end) of a file (nominal; the worker settles exact bounds), read
  into one shard per split it feeds."""

  path: str
  size: int
  start: int
  end: int
  split: str  # 'train' or 'eval': where its documents go, unless held out
  held_out: Optional[float]  # eval_percent when a train file's documents are split by hash
  text_feature: str
  shard_dir: str
  known: Optional[tuple] = None  # (start, end, sha256) from the fingerprint index


def open_corpus(config, data_dir: str, num_workers: Optional[int] = None) -> Corpus:
  """The corpus of `config`'s files, its chunks read into shards first where needed, by
  `num_workers` processes (None: workers.choose)."""
  shard_dir = os.path.join(data_dir, _SHARD_DIR)
  held_out = None if config.eval_files else config.eval_percent
  sources = {'train': text_files.expand(config.train_files, 'train_files')}
  if config.eval_files:
    sources['eval'] = text_files.expand(config.eval_files, 'eval_files')
    by_path = ([(p, os.path.realpath(p)) for p in sources[s]] for s in SPLITS)
    _check_apart(*by_path, 'is the same file as')
  fingerprints = {s: [text_files.fingerprint(p) for p in paths] for s, paths in sources.items()}
  os.makedirs(os.path.join(shard_dir, _FINGERPRINT_DIR), exist_ok=True)
  chunks = []  # (split, file index, _Chunk)
  for split, files in fingerprints.items():
    for index, file in enumerate(files):
      known = _known_chunks(shard_dir, file)
      ranges = known or text_files.byte_ranges(file['path'], file['bytes'])
      for chunk_range in ranges:
        chunk = _Chunk(
          path=file['path'],
          size=file['bytes'],
          start=chunk_range[0],
          end=chunk_range[1],
          split=split,
          held_out=held_out if split == 'train' else None,
          text_feature=config.text_feature,
          shard_dir=shard_dir,
          known=tuple(chunk_range) if known else None,
        )
        chunks.append((split, index, chunk))
  todo = [
    entry for entry in chunks if not (entry[2].known and _is_done(entry[2], entry[2].known[2]))
  ]
  results = {}
  jobs = [c for _, _, c in todo]
  total = sum(c.end - c.start for c in jobs)
  num_workers = min(workers.choose(num_workers, total), max(len(jobs), 1))
  if num_workers > 1:
    _import_meanwhile('grain')
  with Progress('reading', _bytes_read(jobs), total_bytes=total) as progress:
    for (split, index, chunk), result in zip(
      todo, workers.ordered_results(_read_chunk, jobs, num_workers)
    ):
      results[split, index, chunk.start] = result
      documents = sum(n['documents'] for n in result['counts'].values())
      progress.update(chunk.end - chunk.start, documents)
    if todo:
      before = ', the others were read before' if len(todo) < len(chunks) else ''
      progress.done(f', {num_workers} worker(s) ({len(todo)} of {len(chunks)} chunks read{before})')
  files = {split: [[] for _ in fingerprints[split]] for split in fingerprints}
  for split, index, chunk in chunks:
    result = results.get((split, index, chunk.start)) or _finished(chunk, *chunk.known)
    files[split][index].append(result)
  return _assemble(config, data_dir, fingerprints, files)


def _bytes_read(jobs) -> str:
  """What the reading phase's MB are: the files' bytes as stored, which for a .gz / .zst file
  are its compressed bytes (the encoding phase counts text), said as such."""
  compressed = sum(bool(text_files.compression_of(chunk.path)) for chunk in jobs)
  if not compressed:
    return 'files'
  return 'compressed files' if compressed == len(jobs) else 'files as stored (some compressed)'


def forget_fingerprints(config, data_dir: str) -> int:
  """Forgets the digests remembered under `data_dir` of `config`'s files (none where it names
  no files), so the next preparation hashes each again; returns how many were forgotten."""
  if not config.train_files:
    return 0
  shard_dir = os.path.join(data_dir, _SHARD_DIR)
  paths = text_files.expand(config.train_files, 'train_files')
  if config.eval_files:
    paths += text_files.expand(config.eval_files, 'eval_files')
  forgotten = 0
  for path in paths:
    with contextlib.suppress(FileNotFoundError):
      os.remove(_fingerprint_path(shard_dir, text_files.fingerprint(path)))
      forgotten += 1
  return forgotten


def _assemble(config, data_dir: str, fingerprints: dict, files: dict) -> Corpus:
  """The corpus from every chunk's result ({split: [[chunk result] per file]}): its digest,
  manifest and split sources; remembers each file's chunk digests under its fingerprint."""
  shard_dir = os.path.join(data_dir, _SHARD_DIR)
  identity = {'revision': _REVISION, 'text_feature': config.text_feature}
  if not config.eval_files:
    identity['eval_percent'] = config.eval_percent
  for split in fingerprints:
    identity[f'{split}_files'] = [
      _file_identity(file, chunks) for file, chunks in zip(fingerprints[split], files[split])
    ]
  if 'eval' in fingerprints:
    by_content = (
      [(f['path'], i['sha256']) for f, i in zip(fingerprints[s], identity[f'{s}_files'])]
      for s in SPLITS
    )
    _check_apart(*by_content, 'has the same content as')
  digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
  shards = {split: [] for split in SPLITS}
  counts = {split: {'documents': 0, 'text_bytes': 0} for split in SPLITS}
  manifest = dict(identity, corpus_digest=digest)
  for split in fingerprints:
    for file, chunks in zip(fingerprints[split], files[split]):
      if not sum(n['documents'] for c in chunks for n in c['counts'].values()):
        raise DataError(f'{file["path"]}: the file is empty (no document in it).')
      for chunk in chunks:
        for part, path in chunk['outputs'].items():
          for key in _COUNTS:
            counts[part][key] += chunk['counts'][part][key]
          if chunk['counts'][part]['documents']:
            shards[part].append((path, *(chunk['counts'][part][k] for k in _COUNTS)))
      _remember(shard_dir, file, [(c['start'], c['end'], c['sha256']) for c in chunks])
    manifest[f'{split}_files'] = [
      dict(file, **_file_identity(file, chunks))
      for file, chunks in zip(fingerprints[split], files[split])
    ]
  for split in SPLITS:
    if not counts[split]['documents']:
      raise DataError(_empty_split_message(config, split, counts, fingerprints['train']))
  manifest['splits'] = {
    s: dict(counts[s], shards=[[os.path.relpath(p, data_dir), n] for p, n, _ in shards[s]])
    for s in SPLITS
  }
  name = 'files-' + digest[:12]
  directory = os.path.join(data_dir, name)
  os.makedirs(directory, exist_ok=True)
  atomic_files.write_json(os.path.join(directory, MANIFEST), manifest)
  return Corpus(
    name=name,
    directory=directory,
    digest=digest,
    records={s: _open([p for p, _, _ in shards[s]], config.text_feature) for s in SPLITS},
    shards=shards,
    text_bytes={s: counts[s]['text_bytes'] for s in SPLITS},
  )


def _file_identity(file: dict, chunk_results: list[dict]) -> dict:
  """A file as the corpus digest sees it: its format and the digest of its chunks' digests
  (not its path or time)."""
  chunk_digests = ''.join(c['sha256'] for c in chunk_results)
  return {
    'format': text_files.format_of(file['path']) + text_files.compression_of(file['path']),
    'sha256': hashlib.sha256(chunk_digests.encode()).hexdigest(),
  }


def is_held_out(text: str, eval_percent: float) -> bool:
  """A document's side of the held-out split: a stable hash of its text, not its position."""
  bucket = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], 'little') % 10_000
  return bucket < eval_percent * 100


def _shard_outputs(chunk: _Chunk, sha256: str) -> dict[str, str]:
  """{split: path} of the shard holding the chunk whose exact bytes hash to `sha256`."""
  key = {
    'sha256': sha256,
    'format': text_files.format_of(chunk.path),
    'split': chunk.split,
    'held_out': chunk.held_out,
    'text_feature': chunk.text_feature,
    'revision': _REVISION,
  }
  name = 'shard-' + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
  splits = SPLITS if chunk.held_out is not None else (chunk.split,)
  return {s: os.path.join(chunk.shard_dir, f'{name}-{s}.array_record') for s in splits}


def _is_done(chunk: _Chunk, sha256: str) -> bool:
  return all(cache_integrity.problem(p) is None for p in _shard_outputs(chunk, sha256).values())


def _finished(chunk: _Chunk, start: int, end: int, sha256: str) -> dict:
  outputs = _shard_outputs(chunk, sha256)
  counts = {}
  for split, path in outputs.items():
    with open(cache_integrity.sidecar_path(path)) as f:
      record = json.load(f)
    counts[split] = {'documents': record['documents'], 'text_bytes': record['text_bytes']}
  return {'start': start, 'end': end, 'sha256': sha256, 'outputs': outputs, 'counts': counts}


def _read_chunk(chunk: _Chunk) -> dict:
  """Settles the chunk's exact bytes and their hash, then writes its shard unless a shard of
  the same content exists (under the shard's lock). Runs in a worker process."""
  if chunk.known:  # the file's fingerprint is unchanged: its bounds and hash are remembered
    start, end, sha256 = chunk.known
  else:
    start, end = text_files.exact_range(chunk.path, chunk.start, chunk.end, chunk.size)
    sha256 = text_files.sha256_of_range(chunk.path, start, end)
  outputs = _shard_outputs(chunk, sha256)
  name = os.path.basename(outputs[chunk.split]).rsplit('-', 1)[0]
  with cache_lock.exclusive_lock(chunk.shard_dir, name):
    if not _is_done(chunk, sha256):
      for path in outputs.values():
        cache_integrity.remove_stale_temporaries(path)
      _write_shard(chunk, (start, end), sha256, outputs)
  return _finished(chunk, start, end, sha256)


def _write_shard(chunk: _Chunk, byte_range, sha256: str, outputs: dict[str, str]) -> None:
  """Each split's documents into `<shard>.tmp.<pid>`, published with a sidecar of its counts
  (a kill between two publications leaves the shard unfinished: it is read again, whole)."""
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  tmp = {split: f'{path}.tmp.{os.getpid()}' for split, path in outputs.items()}
  counts = {split: {'documents': 0, 'text_bytes': 0} for split in outputs}
  writers = {}
  try:
    for split, path in tmp.items():
      writers[split] = array_record_module.ArrayRecordWriter(path, _SHARD_OPTIONS)
    for text in text_files.documents(chunk.path, chunk.text_feature, byte_range):
      data = text.encode()
      split = chunk.split
      if chunk.held_out is not None:
        split = 'eval' if is_held_out(text, chunk.held_out) else 'train'
      writers[split].write(data)
      counts[split]['documents'] += 1
      counts[split]['text_bytes'] += len(data)
    for split in list(writers):
      writers.pop(split).close()
    _check_unchanged(chunk, byte_range, sha256)
    source = {'path': chunk.path, 'start': byte_range[0], 'end': byte_range[1], 'sha256': sha256}
    for split, path in outputs.items():
      cache_integrity.publish(tmp[split], path, dict(source=source, split=split, **counts[split]))
  finally:
    for writer in writers.values():
      try:  # a full disk makes close() fail again: the first error is the one to report
        writer.close()
      except Exception:  # pylint: disable=broad-except
        pass
    for path in tmp.values():
      if os.path.exists(path):
        os.remove(path)


def _check_unchanged(chunk: _Chunk, byte_range, sha256: str) -> None:
  """The bytes just read still hash to `sha256` (what names the shard), or one DataError line:
  the file was rewritten in place since it was hashed (or since its digest was remembered under
  the same size and modification time). A file appended to is read only to its hashed end, so
  this holds for it."""
  if text_files.sha256_of_range(chunk.path, *byte_range) != sha256:
    raise DataError(
      f'{chunk.path}: its bytes {byte_range[0]:,}-{byte_range[1]:,} changed while it was '
      'prepared (they no longer hash to what was hashed before reading, or to the digest '
      'remembered for its size and modification time): prepare again once nothing writes to '
      'it, with experiments.prepare_data --rehash to hash every file again.'
    )


def _fingerprint_path(shard_dir: str, file: dict) -> str:
  digest = hashlib.sha256(file['path'].encode()).hexdigest()[:24]
  return os.path.join(shard_dir, _FINGERPRINT_DIR, f'{digest}.json')


def _known_chunks(shard_dir: str, file: dict) -> Optional[list]:
  """[(start, end, sha256)] of the file when its path, size and time are those remembered."""
  try:
    with open(_fingerprint_path(shard_dir, file)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  if record.get('file') != file or record.get('revision') != _REVISION:
    return None
  return [tuple(c) for c in record['chunks']]


def _remember(shard_dir: str, file: dict, chunk_digests: list) -> None:
  record = {'file': file, 'revision': _REVISION, 'chunks': [list(c) for c in chunk_digests]}
  try:
    atomic_files.write_json(_fingerprint_path(shard_dir, file), record, indent=None)
  except OSError:
    pass  # only a shortcut: without it the file is hashed again next time


def _check_apart(train: list, held_out: list, relation: str) -> None:
  """DataError when an eval file is a train file. `train`, `held_out`: (path, key) pairs, the
  key a file's real path or its content digest."""
  train_paths = {}
  for path, key in train:
    train_paths.setdefault(key, path)
  for path, key in held_out:
    if key in train_paths:
      raise DataError(
        f'data.eval_files: {path} {relation} {train_paths[key]} in data.train_files: '
        'evaluation would run on training data; give held-out files, or no eval_files to hold '
        'out data.eval_percent of the documents.'
      )


def _empty_split_message(config, split: str, counts: dict, train_files: list) -> str:
  if split == 'eval':
    documents = counts['train']['documents']
    why = f'none of its {documents:,} document(s) fell there'
    if any(text_files.format_of(f['path']) == '.txt' for f in train_files):
      why += '; in a .txt file a blank line ends a document, so a file without one is one document'
    return (
      f'data.train_files={config.train_files!r}: the corpus is too small to hold out '
      f'data.eval_percent={config.eval_percent}% of its documents for evaluation ({why}): give '
      'data.eval_files or raise data.eval_percent.'
    )
  return f'data.train_files={config.train_files!r}: every document was held out for evaluation.'


def _import_meanwhile(module: str) -> None:
  """Imports `module` in a thread while the workers read: this process only waits for them, and
  `_open` needs grain, whose import (orbax's with it) takes ~1 CPU s. A failed import is left to
  the import in `_open`, which reports it."""

  def run():
    try:
      importlib.import_module(module)
    except Exception:  # pylint: disable=broad-except
      pass

  threading.Thread(target=run, name=f'import {module}', daemon=True).start()


def _open(paths: list[str], text_feature: str):
  """A grain MapDataset of the documents in `paths`, in order (grain is imported here: the
  reading workers do not need it)."""
  import grain  # pylint: disable=import-outside-toplevel

  source = grain.sources.ArrayRecordDataSource(paths)
  return grain.MapDataset.source(source).map(functools.partial(_as_record, text_feature))


def _as_record(text_feature: str, data: bytes) -> dict:
  record = data
  for key in reversed(text_feature.split('/')):
    record = {key: record}
  return record

"""Your own files as the corpus: read once into train / eval document stores with a manifest.

`data.train_files` (and `data.eval_files`, else a held-out fraction) are read by text_files.py
and written, one document per record, into two array_record files under

    <data_dir>/files-<digest>/documents-train.array_record   (+ .json: its manifest)
    <data_dir>/files-<digest>/documents-eval.array_record

from which the rest of the pipeline (tokenizer training, packing, masking, floors) reads
exactly as it reads a TFDS split: random access through grain. The digest hashes the manifest:
every source file's path, size and modification time, the text feature and the held-out
percent. So a changed corpus gets a new directory (and with it a new tokenizer and packed store,
whose keys hold this name) and is never mixed with an old one; the old directory stays until
you delete it. The `.json` sidecars (cache_integrity.py) hold the manifest with document and
byte counts, and a damaged store is read again from the files, with a note.

Held out when `eval_files` is empty: a document goes to eval when a stable hash of its text
falls in the lowest `data.eval_percent` percent (default 1%), so duplicates never straddle the
split and the choice does not depend on file order.

Reading streams (one document in memory at a time) under the cache lock, so concurrent
processes on one machine or hosts sharing the data_dir read the files once. Each source file
is read into its own shard under `<data_dir>/file-shards/` (by `workers` processes at once),
published atomically with a sidecar naming the file's size and modification time; the shards
are then joined in source order, so the stores are the same whatever the number of workers.
A killed preparation reads again only the files whose shards were not finished, and a changed
file invalidates only its own shard (the shard's name hashes the file's fingerprint).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import time
from typing import Optional

from realformer_jax import extras
from realformer_jax.data import cache_integrity, cache_lock, text_files
from realformer_jax.data.errors import DataError

grain = extras.lazy('grain')

_log = logging.getLogger(__name__)
# Bump when reading or the store layout changes, so old stores are not reused.
_REVISION = 1
SPLITS = ('train', 'eval')
# Progress is logged at most this often (seconds) while reading.
_PROGRESS_SECONDS = 10.0
# Shards (one per source file) live beside the corpora, under <data_dir>/: a changed file gets
# a new corpus directory but keeps the unchanged files' shards.
_SHARD_DIR = 'file-shards'
# Records copied per read when the shards are joined into the split stores.
_JOIN_RECORDS = 4096


def manifest(config) -> dict:
  """What the document stores are built from: the files (path, size, time) and settings."""
  train = [text_files.fingerprint(p) for p in text_files.expand(config.train_files, 'train_files')]
  record = {'train_files': train, 'text_feature': config.text_feature, 'revision': _REVISION}
  if config.eval_files:
    record['eval_files'] = [
      text_files.fingerprint(p) for p in text_files.expand(config.eval_files, 'eval_files')
    ]
  else:
    record['eval_percent'] = config.eval_percent
  return record


def corpus_name(record: dict) -> str:
  return 'files-' + hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]


def store_paths(corpus_dir: str) -> dict[str, str]:
  return {split: os.path.join(corpus_dir, f'documents-{split}.array_record') for split in SPLITS}


def open_corpus(
  config, data_dir: str, workers: int = 1
) -> tuple[str, str, dict[str, grain.MapDataset]]:
  """(corpus name, its directory, {'train': records, 'eval': records}), read on first use.

  A record is {text_feature: utf-8 bytes} (nested for 'a/b'), as a TFDS text feature reads.
  `workers` > 1 reads that many source files at once, each in its own process.
  """
  record = manifest(config)
  name = corpus_name(record)
  corpus_dir = os.path.join(data_dir, name)
  paths = store_paths(corpus_dir)
  if any(cache_integrity.problem(p) is not None for p in paths.values()):
    os.makedirs(corpus_dir, exist_ok=True)
    with cache_lock.exclusive_lock(corpus_dir, 'documents'):
      reasons = {s: cache_integrity.problem(p) for s, p in paths.items()}
      if any(r is not None for r in reasons.values()):  # else another process read them
        for split, reason in reasons.items():
          if reason is not None and os.path.exists(paths[split]):
            cache_integrity.note_rebuild(paths[split], reason, 'reading the files again')
        _build(config, record, paths, workers)
  return (
    name,
    corpus_dir,
    {split: _open(path, config.text_feature) for split, path in paths.items()},
  )


def is_held_out(text: str, eval_percent: float) -> bool:
  """A document's side of the held-out split: a stable hash of its text, not its position."""
  bucket = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], 'little') % 10_000
  return bucket < eval_percent * 100


def _build(config, record: dict, paths: dict[str, str], workers: int) -> None:
  """Reads every source file into its shard (skipping finished ones), then joins the shards,
  in source order, into the split stores: the same stores whatever the number of workers."""
  shard_dir = os.path.join(os.path.dirname(os.path.dirname(paths['train'])), _SHARD_DIR)
  os.makedirs(shard_dir, exist_ok=True)
  held_out = None if config.eval_files else config.eval_percent
  jobs = [
    _ShardJob(file, split, held_out if split == 'train' else None, config.text_feature, shard_dir)
    for split in SPLITS
    for file in record.get(f'{split}_files', [])
  ]
  todo = [job for job in jobs if not job.is_done()]
  if len(jobs) > len(todo):
    _log.info(
      'reading corpus: %d of %d files already read (shards in %s)',
      len(jobs) - len(todo),
      len(jobs),
      shard_dir,
    )
  if workers > 1 and len(todo) > 1:
    context = multiprocessing.get_context('spawn')  # no fork of a process that runs JAX threads
    with context.Pool(min(workers, len(todo))) as pool:
      for _ in pool.imap_unordered(_read_shard, todo):
        pass
  else:
    progress = _Progress(sum(job.file['bytes'] for job in todo))
    for job in todo:
      _read_shard(job, progress)
  counts = _join_shards(jobs, record, paths)
  for split in SPLITS:
    if not counts[split]['documents']:
      raise DataError(_empty_split_message(config, split))
  _log.info(
    'read corpus: %d train / %d eval documents',
    counts['train']['documents'],
    counts['eval']['documents'],
  )


@dataclasses.dataclass(frozen=True)
class _ShardJob:
  """One source file read into `<shard>-<split>.array_record` per split it feeds."""

  file: dict  # its fingerprint: path, size, modification time
  split: str  # 'train' or 'eval': where its documents go, unless held out
  held_out: Optional[float]  # eval_percent when a train file's documents are split by hash
  text_feature: str
  shard_dir: str

  @property
  def outputs(self) -> dict[str, str]:
    """{split: path} of the stores this file writes; the name hashes everything they hold."""
    key = dataclasses.asdict(self)
    del key['shard_dir']
    digest = hashlib.sha256(json.dumps(dict(key, revision=_REVISION), sort_keys=True).encode())
    splits = SPLITS if self.held_out is not None else (self.split,)
    name = f'shard-{digest.hexdigest()[:16]}'
    return {s: os.path.join(self.shard_dir, f'{name}-{s}.array_record') for s in splits}

  def is_done(self) -> bool:
    return all(cache_integrity.problem(p) is None for p in self.outputs.values())


def _read_shard(job: _ShardJob, progress: Optional['_Progress'] = None) -> None:
  """Reads one file into its shard stores, each published (temp name + rename) with a sidecar
  holding the file's fingerprint and counts. A kill between two publications leaves the shard
  unfinished (`is_done` needs all of its stores), so it is read again, whole."""
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  progress = progress or _Progress(job.file['bytes'])
  outputs = job.outputs
  tmp = {split: f'{path}.tmp.{os.getpid()}' for split, path in outputs.items()}
  counts = {split: {'documents': 0, 'text_bytes': 0} for split in outputs}
  writers = {s: array_record_module.ArrayRecordWriter(p, 'group_size:1') for s, p in tmp.items()}
  try:
    for text in text_files.documents(job.file['path'], job.text_feature):
      data = text.encode()
      split = job.split
      if job.held_out is not None:
        split = 'eval' if is_held_out(text, job.held_out) else 'train'
      writers[split].write(data)
      counts[split]['documents'] += 1
      counts[split]['text_bytes'] += len(data)
      progress.document(len(data))
    progress.file_done(job.file['bytes'])
    for writer in writers.values():
      writer.close()
    writers = {}
    for split, path in outputs.items():
      cache_integrity.publish(tmp[split], path, dict(source=job.file, split=split, **counts[split]))
  finally:
    for writer in writers.values():
      writer.close()
    for path in tmp.values():
      if os.path.exists(path):
        os.remove(path)


def _join_shards(jobs: list[_ShardJob], record: dict, paths: dict[str, str]) -> dict:
  """Copies the shards' documents, in source-file order, into the split stores; their counts."""
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  counts = {split: {'documents': 0, 'text_bytes': 0} for split in SPLITS}
  for split in SPLITS:
    tmp = f'{paths[split]}.tmp.{os.getpid()}'
    writer = array_record_module.ArrayRecordWriter(tmp, 'group_size:1')
    try:
      for job in jobs:
        if split not in job.outputs:
          continue
        reader = array_record_module.ArrayRecordReader(job.outputs[split])
        for start in range(0, reader.num_records(), _JOIN_RECORDS):
          for data in reader.read(start, min(start + _JOIN_RECORDS, reader.num_records())):
            writer.write(data)
            counts[split]['documents'] += 1
            counts[split]['text_bytes'] += len(data)
        reader.close()
      writer.close()
      if counts[split]['documents']:
        cache_integrity.publish(tmp, paths[split], dict(record, split=split, **counts[split]))
    finally:
      writer.close()
      if os.path.exists(tmp):
        os.remove(tmp)
  return counts


def _empty_split_message(config, split: str) -> str:
  if split == 'eval':
    return (
      f'data.train_files={config.train_files!r}: the corpus is too small to hold out '
      f'data.eval_percent={config.eval_percent}% of its documents for evaluation (none fell '
      'there): give data.eval_files or raise data.eval_percent.'
    )
  return f'data.train_files={config.train_files!r}: every document was held out for evaluation.'


def _open(path: str, text_feature: str) -> grain.MapDataset:
  source = grain.sources.ArrayRecordDataSource([path])
  return grain.MapDataset.source(source).map(functools.partial(_as_record, text_feature))


def _as_record(text_feature: str, data: bytes) -> dict:
  record = data
  for key in reversed(text_feature.split('/')):
    record = {key: record}
  return record


class _Progress:
  """Logs MB/s, documents and ETA while the files are read (at most every few seconds)."""

  def __init__(self, total_bytes: int):
    self.total_bytes = max(total_bytes, 1)
    self.start = self.last = time.monotonic()
    self.files_bytes = self.text_bytes = self.documents = 0

  def document(self, num_bytes: int) -> None:
    self.documents += 1
    self.text_bytes += num_bytes
    if time.monotonic() - self.last >= _PROGRESS_SECONDS:
      self.last = time.monotonic()
      seconds = self.last - self.start
      done = max(self.files_bytes, min(self.text_bytes, self.total_bytes))
      eta = seconds * (self.total_bytes - done) / max(done, 1)
      _log.warning(
        'reading corpus: %.1f MB/s, %d documents, %.0f%% of %.1f MB, ETA %.0f s',
        self.text_bytes / 1e6 / seconds,
        self.documents,
        100 * done / self.total_bytes,
        self.total_bytes / 1e6,
        eta,
      )

  def file_done(self, num_bytes: int) -> None:
    self.files_bytes += num_bytes

"""Your own files as the corpus, identified by their content and read into document shards.

`data.train_files` (and `data.eval_files`, else a held-out fraction) are read by text_files.py
in chunks: a compressed or mid-sized file is one chunk, a large uncompressed one a chunk per
`text_files.CHUNK_BYTES` (bounds moved to document boundaries), and files under
SMALL_FILE_BYTES share a chunk, in groups. Each chunk becomes a shard under
`<data_dir>/file-shards/`, one array_record file per split it feeds, named by a hash of the
chunk's bytes (SHA-256 of each file's or range's) and the reading settings; each file keeps its
own segment of the shard. `workers` processes read chunks at once. Nothing is done per file
that scans what grows with the corpus: the shard directory is listed once per preparation.

Identity. A corpus is its content: its digest hashes every chunk's SHA-256, in file order, with
the reading settings (text feature, held-out percent or eval files). It names the corpus
directory `<data_dir>/files-<digest>/` (which holds `corpus.json`, the tokenizers and the
packed stores, whose names derive from it), so a touched, renamed, moved or copied file that is
unchanged keeps every store and a run resumable, and an edited one gives a new corpus that is
never mixed with the old. A chunk is read as exactly the bytes that were hashed (a file appended
to meanwhile, up to its hashed end): a small file is read once, hashed and parsed from those
bytes; a larger one is hashed again before its shard is published, so a file rewritten in place
meanwhile is a DataError, never a shard named by content it does not hold.
Path, size and modification time are only a fast "unchanged" check:
`<data_dir>/file-shards/fingerprints/` remembers each file's chunk digests under its path, size
and time (a group's under its files'), so an unchanged corpus is not read at all on a later
start; a file whose fingerprint is new is hashed (a fast pass, ~GB/s) and read only if that
content was never read.
Its limit: an edit that keeps the size and restores the time keeps the old digests until
`forget_fingerprints` (experiments.prepare_data --rehash). Eval files that are train files (by
device and inode, i.e. through links, or by content) are refused.
`corpus.json` records the corpus digest (`corpus_digest`), each file's path, size, time and
SHA-256 (of its chunk digests), and the shards of each split with their document and byte counts.

The splits are the shards in file order, read through one grain source each (no joined copy),
so the documents are the same whatever the number of workers. Held out when `eval_files` is
empty (`data.eval_holdout_by`): a file, or a document, goes to eval when a stable hash of its
first bytes (or of its text) falls in the lowest `data.eval_percent` percent (default 1%), so
no file is in both splits (or duplicates never straddle the split), and the choice does not
depend on file order or chunking.

Shards are written under a lock of their own (store/cache_lock.py) through a temporary name and a
rename, with a sidecar holding their counts (store/cache_integrity.py), so a killed preparation
reads again only the chunks it had not finished, concurrent preparations (processes, or hosts
sharing the data_dir) read each chunk once, and a temporary file left by a dead writer is removed by
the next one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import importlib
import itertools
import json
import operator
import os
import re
import threading
from typing import Optional

from realformer_jax import atomic_files
from realformer_jax.data import gc_pause, text_files, workers
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
  # split -> [(shard path, first, stop, text bytes)]: documents [first, stop) of a shard are one
  # file's (or one range of a large file's), in file order (stop > first)
  segments: dict
  text_bytes: dict  # split -> UTF-8 bytes of its documents
  # split -> per segment, whether its file ends there (False: a range of a large file that
  # goes on in the next segment)
  ends_file: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Chunk:
  """One job, read into one shard per split it feeds: a byte range of a large file, or several
  small files whole (consecutive in file order: per file, a shard and its sidecar, lock and
  fingerprint cost more than reading it). `pieces`: ((path, size, start, end), ...), nominal
  bounds (the worker settles exact ones)."""

  pieces: tuple
  split: str  # 'train' or 'eval': where its documents go, unless held out
  held_out: Optional[float]  # eval_percent when a train file's documents are split
  held_out_by: str  # HELD_OUT_BY: what the hash that splits them is of
  text_feature: str
  shard_dir: str
  known: Optional[tuple] = None  # ((start, end, sha256), ...) from the fingerprint index
  # Temporary files in shard_dir when preparation began (cache_integrity.temporaries): the
  # stale ones of this chunk's shard are among them (one listing for the whole corpus).
  stale: frozenset = frozenset()
  # The fingerprints (text_files.fingerprint) of the unit's files where the chunk is the whole
  # unit (a group, or a file read in one piece): the worker that reads it remembers their
  # digests and returns their identities, so the preparing process does no per-file hashing.
  files: tuple = ()


# Files under this size may share a shard; a group of them ends after a file whose name hashes
# to a boundary once the group holds GROUP_MIN_BYTES, or at GROUP_MAX_BYTES / GROUP_MAX_FILES.
# The boundary depends on the file's name, not its position, so adding, removing or editing a
# file changes its own group (and rarely the next), not every group after it: the others keep
# their shards. A group of ~0.5-1 MB is a job of ~0.1 s: enough jobs to keep the workers busy.
# A group's files are held in memory from their hash to their shard (at most GROUP_MAX_BYTES
# as stored, a worker).
SMALL_FILE_BYTES = 1 << 20
GROUP_MIN_BYTES = 512 << 10
GROUP_MAX_BYTES = 8 << 20
GROUP_MAX_FILES = 4096
_BOUNDARY_ONE_IN = 8
# data.eval_holdout_by: the unit a held-out fraction is drawn in. 'auto' is 'file' where the
# corpus has files enough for it (AUTO_FILES_HELD_OUT expected in eval), else 'document';
# or FIELD_PREFIX + a JSON field: the documents sharing its value (`held_out_field`).
HELD_OUT_BY = ('auto', 'file', 'document')
FIELD_PREFIX = 'field:'
AUTO_FILES_HELD_OUT = 5
# A file's side of a held-out split is a hash of its first bytes (as stored): the same for
# every range of a large file, read by whichever worker reads the range.
_SIDE_BYTES = 64 << 10


def open_corpus(config, data_dir: str, num_workers: Optional[int] = None) -> Corpus:
  """The corpus of `config`'s files, its chunks read into shards first where needed, by
  `num_workers` processes (None: workers.choose)."""
  with gc_pause.paused():  # tables of an entry per file: see gc_pause
    return _open_corpus(config, data_dir, num_workers)


def _open_corpus(config, data_dir: str, num_workers: Optional[int]) -> Corpus:
  shard_dir = os.path.join(data_dir, _SHARD_DIR)
  check = functools.partial(_check_files, workers.choose(num_workers, 0))
  local = {}  # path -> (fingerprint, file key) of a local file: one stat a file, in the workers
  sources = {'train': text_files.expand(config.train_files, 'train_files', local, check)}
  if config.eval_files:
    sources['eval'] = text_files.expand(config.eval_files, 'eval_files', local, check)
    keys = {s: _file_keys(local, sources[s]) for s in SPLITS}
    if not set(keys['eval']).isdisjoint(keys['train']):
      by_file = (list(zip(sources[s], keys[s])) for s in SPLITS)
      _check_apart(*by_file, 'is the same file as')
  held_out = None if config.eval_files else config.eval_percent
  held_out_by = held_out_unit(config, len(sources['train']))
  if held_out is not None and held_out_field(held_out_by):
    _check_field_rule(sources['train'], held_out_by)
  fingerprints = {s: _fingerprints(local, paths) for s, paths in sources.items()}
  del local  # not held while the corpus is assembled
  os.makedirs(os.path.join(shard_dir, _FINGERPRINT_DIR), exist_ok=True)
  stale = cache_integrity.temporaries(shard_dir)
  chunks = []  # (split, first file index, _Chunk)
  for split, files in fingerprints.items():
    for first, stop in _units(files):
      unit = files[first:stop]
      known = _known_chunks(shard_dir, unit)
      if len(unit) == 1:
        file = unit[0]
        ranges = known[0] if known else text_files.byte_ranges(file['path'], file['bytes'])
        pieces = [((file['path'], file['bytes'], r[0], r[1]),) for r in ranges]
        knowns = [(tuple(r),) for r in known[0]] if known else [None] * len(ranges)
      else:
        pieces = [tuple([(f['path'], f['bytes'], 0, f['bytes']) for f in unit])]
        knowns = [tuple(tuple(k[0]) for k in known)] if known else [None]
      for chunk_pieces, chunk_known in zip(pieces, knowns):
        chunk = _Chunk(
          pieces=chunk_pieces,
          split=split,
          held_out=held_out if split == 'train' else None,
          held_out_by=held_out_by,
          text_feature=config.text_feature,
          shard_dir=shard_dir,
          known=chunk_known,
          stale=stale,
          files=tuple(unit) if len(pieces) == 1 else (),
        )
        chunks.append((split, first, chunk))
  done_before = {}  # chunk index -> its shard per split, for those published before
  for index, (_, _, chunk) in enumerate(chunks):
    if chunk.known and _is_done(outputs := _outputs(chunk, chunk.known)):
      done_before[index] = outputs
  jobs = [chunk for index, (_, _, chunk) in enumerate(chunks) if index not in done_before]
  total = sum(_nominal_bytes(c) for c in jobs)
  num_workers = min(workers.choose(num_workers, total), max(len(jobs), 1))
  if num_workers > 1:
    _import_meanwhile('grain')
  assembly = _Assembly(fingerprints)
  with Progress('reading', _bytes_read(jobs), total_bytes=total) as progress:
    # Each chunk's result taken in file order as it comes back (its bookkeeping done while the
    # workers read the next chunks, not after the last one).
    results = workers.ordered_results(_read_chunk, jobs, num_workers)
    for index, (split, first, chunk) in enumerate(chunks):
      if index in done_before:
        assembly.add(split, first, chunk, _finished(chunk, outputs=done_before[index]))
        continue
      result = next(results)
      assembly.add(split, first, chunk, result)
      documents = sum(n['documents'] for n in result['counts'].values())
      progress.update(_nominal_bytes(chunk), documents)
    del results  # a pool with nothing in flight stays for the encoding (workers.py)
    if jobs:
      before = ', the others were read before' if len(jobs) < len(chunks) else ''
      progress.done(
        f', {num_workers} worker(s) ({len(jobs)} of {len(chunks)} chunks read{before})'
        f'{_held_out_note(held_out, held_out_by)}'
      )
  return assembly.corpus(config, data_dir, held_out_by)


# Files a worker checks in one job (`_check_files`), and the corpus size from which the
# checks run in the workers (below it, starting them first would cost more than it saves).
_CHECK_BATCH_FILES = 4096
_CHECK_IN_WORKERS_FROM = 2 * _CHECK_BATCH_FILES


def _check_files(num_workers: int, paths: list[str], field: str) -> list:
  """`text_files.check_entries` of `paths`, with each local file's fingerprint and key
  (`_local_file`), in `num_workers` processes where the paths are many: the stat, the checks
  and the fingerprint are most of the per-file work before any file is read."""
  jobs = [
    (paths[i : i + _CHECK_BATCH_FILES], field) for i in range(0, len(paths), _CHECK_BATCH_FILES)
  ]
  num_workers = num_workers if len(paths) >= _CHECK_IN_WORKERS_FROM else 1
  return [
    info for batch in workers.ordered_results(_local_files, jobs, num_workers) for info in batch
  ]


@gc_pause.while_running
def _local_files(job: tuple) -> list:
  """Per path of `job` ((paths, field)): None for a directory, else (fingerprint, file key)
  (DataError for what is not a regular file). The key tells one file from another: its device
  and inode, through links (os.path.realpath took a stat per path component, ~15 s for
  100,000 files). Runs in a worker process."""
  paths, field = job
  return [
    None if info is None else (text_files.fingerprint(path, info), (info.st_dev, info.st_ino))
    for path, info in zip(paths, text_files.check_entries(paths, field))
  ]


def _fingerprints(local: dict, paths: list[str]) -> list[dict]:
  """Each path's fingerprint: from its check (`local`), else taken here (a remote file)."""
  try:  # every path local (as a rule): no loop in Python over 100,000 files
    return list(map(operator.itemgetter(0), map(local.__getitem__, paths)))
  except KeyError:
    return [local[p][0] if p in local else text_files.fingerprint(p) for p in paths]


def _file_keys(local: dict, paths: list[str]) -> list:
  """Each path's key: its device and inode (from its check, `local`), else the path itself."""
  try:
    return list(map(operator.itemgetter(1), map(local.__getitem__, paths)))
  except KeyError:
    return [local[p][1] if p in local else p for p in paths]


def held_out_field(held_out_by: str) -> str:
  """The JSON field named by data.eval_holdout_by='field:NAME' ('' for the other rules)."""
  if not held_out_by.startswith(FIELD_PREFIX):
    return ''
  return held_out_by[len(FIELD_PREFIX) :].strip()


def _check_field_rule(files: list[str], held_out_by: str) -> None:
  """DataError before anything is read where a train file has no JSON fields to group by."""
  for path in files:
    if text_files.format_of(path) not in _FIELD_FORMATS:
      raise DataError(
        f"data.eval_holdout_by='{held_out_by}': {path} is a {text_files.format_of(path)} "
        f'file; grouping documents by a field needs JSON lines files '
        f"({', '.join(_FIELD_FORMATS)}): hold out by 'file' or 'document' instead."
      )


_FIELD_FORMATS = ('.jsonl', '.json')


def held_out_unit(config, num_train_files: int) -> str:
  """'file' or 'document': what `data.eval_holdout_by` means for a corpus of
  `num_train_files` files (it matters only without eval_files)."""
  if config.eval_holdout_by != 'auto':
    return config.eval_holdout_by
  expected = num_train_files * config.eval_percent / 100
  return 'file' if expected >= AUTO_FILES_HELD_OUT else 'document'


def _held_out_note(held_out: Optional[float], held_out_by: str) -> str:
  """The held-out rule, as the reading line names it."""
  if held_out is None:
    return ''
  unit = 'files (no file in both splits)' if held_out_by == 'file' else 'documents'
  if held_out_field(held_out_by):
    field = held_out_field(held_out_by)
    unit = f'document groups by field {field!r} (no group in both splits)'
  return f'; held out {held_out:g}% of the {unit}, data.eval_holdout_by={held_out_by}'


def _units(files: list[dict]) -> list[tuple[int, int]]:
  """The files [first, stop) read as one unit: a file of SMALL_FILE_BYTES or more alone (in
  byte ranges where large), smaller consecutive ones in groups (see SMALL_FILE_BYTES)."""
  units, first, size = [], 0, 0
  for index, file in enumerate(files):
    if file['bytes'] >= SMALL_FILE_BYTES:
      if first < index:
        units.append((first, index))
      units.append((index, index + 1))
      first, size = index + 1, 0
      continue
    size += file['bytes']
    count = index + 1 - first
    if (
      (size >= GROUP_MIN_BYTES and _is_boundary(file['path']))
      or size >= GROUP_MAX_BYTES
      or count >= GROUP_MAX_FILES
    ):
      units.append((first, index + 1))
      first, size = index + 1, 0
  if first < len(files):
    units.append((first, len(files)))
  return units


def _is_boundary(path: str) -> bool:
  digest = hashlib.sha256(os.path.basename(path).encode()).digest()
  return int.from_bytes(digest[:4], 'little') % _BOUNDARY_ONE_IN == 0


def _nominal_bytes(chunk: _Chunk) -> int:
  return sum(end - start for _, _, start, end in chunk.pieces)


def _bytes_read(jobs) -> str:
  """What the reading phase's MB are: the files' bytes as stored, which for a .gz / .zst file
  are its compressed bytes (the encoding phase counts text), said as such."""
  # Asked of the paths' distinct ends, as long as the longest compression's suffix: a question
  # per file was ~0.15 CPU s of 100,000 files, before any was read.
  tail = max(map(len, text_files.COMPRESSIONS))
  ends = {piece[0][-tail:] for chunk in jobs for piece in chunk.pieces}
  compressions = {text_files.compression_of(end) for end in ends}
  if compressions <= {''}:
    return 'files'
  return 'compressed files' if '' not in compressions else 'files as stored (some compressed)'


def forget_fingerprints(config, data_dir: str) -> int:
  """Forgets the digests remembered under `data_dir` of `config`'s files (none where it names
  no files), so the next preparation hashes each again; returns how many files' were
  forgotten."""
  if not config.train_files:
    return 0
  shard_dir = os.path.join(data_dir, _SHARD_DIR)
  sources = [text_files.expand(config.train_files, 'train_files')]
  if config.eval_files:
    sources.append(text_files.expand(config.eval_files, 'eval_files'))
  forgotten = 0
  for paths in sources:
    files = [text_files.fingerprint(path) for path in paths]
    for first, stop in _units(files):
      with contextlib.suppress(FileNotFoundError):
        os.remove(_fingerprint_path(shard_dir, files[first:stop]))
        forgotten += stop - first
  return forgotten


class _Assembly:
  """The corpus from every chunk's result, taken in file order (`add`): its digest, manifest
  and split sources (`corpus`); remembers the chunk digests of each file read in ranges under
  its fingerprint. Files read whole come listed by their chunk (`_listing`): nothing is built
  per file here but their segments."""

  def __init__(self, fingerprints: dict):
    self.fingerprints = fingerprints
    # Per file read in ranges, by index: [(start, end, sha256)] of its ranges, its documents.
    self.ranges = {split: {} for split in fingerprints}
    self.documents = {split: {} for split in fingerprints}
    # Per split, in file order: (first file index, the listing of a chunk of whole files, or
    # None for a file read in ranges).
    self.listed = {split: [] for split in fingerprints}
    self.segments = {split: [] for split in SPLITS}
    self.ends_file = {split: [] for split in SPLITS}
    self.counts = {split: {'documents': 0, 'text_bytes': 0} for split in SPLITS}
    self.shards = {split: {} for split in SPLITS}  # {shard path: documents}, in file order
    # The units whose digests are remembered here: files read in ranges, not remembered before.
    self.to_remember = set()

  def add(self, split: str, first: int, chunk: _Chunk, result: dict) -> None:
    """The chunk `chunk` of `split`, whose first file is file `first`, read into `result`."""
    listing = result.get('listing')
    if listing is None:  # a range of a file (a chunk of one piece)
      piece = result['pieces'][0]
      self.ranges[split].setdefault(first, []).append(
        (piece['start'], piece['end'], piece['sha256'])
      )
      if not self.listed[split] or self.listed[split][-1] != (first, None):
        self.listed[split].append((first, None))
      if not chunk.known:
        self.to_remember.add((split, first))
    else:
      self.listed[split].append((first, listing))
    for part, path in result['outputs'].items():
      piece_counts = result['piece_counts'][part]
      documents = [docs for docs, _ in piece_counts]
      total = sum(documents)
      self.counts[part]['documents'] += total
      self.counts[part]['text_bytes'] += sum(text_bytes for _, text_bytes in piece_counts)
      if listing is None:  # one piece: a range of a file
        self.documents[split][first] = self.documents[split].get(first, 0) + total
      if total:
        self.shards[part][path] = self.shards[part].get(path, 0) + total
      # A segment per piece with documents, in comprehensions: this runs in the preparing
      # process, a piece per file of the corpus (a loop was ~0.1 CPU s of 100,000 files).
      begins = itertools.accumulate(documents, initial=0)
      segments = [
        (path, begin, begin + docs, text_bytes)
        for begin, (docs, text_bytes) in zip(begins, piece_counts)
        if docs
      ]
      self.segments[part].extend(segments)
      if listing is not None:  # whole files: each ends with its segment
        self.ends_file[part].extend(itertools.repeat(True, len(segments)))
      elif segments:  # a range: the file ends there where the range ends at the file's end
        self.ends_file[part].append(result['pieces'][0]['end'] == chunk.pieces[0][1])

  def corpus(self, config, data_dir: str, held_out_by: str) -> Corpus:
    """The corpus of the chunks added (all of them, in file order)."""
    shard_dir = os.path.join(data_dir, _SHARD_DIR)
    fingerprints, listed, ranges = self.fingerprints, self.listed, self.ranges
    counts, segments = self.counts, self.segments
    listings = {  # per split, each chunk's listing, or a file's read in ranges
      split: [
        listing
        or _range_file_listing(files[first], ranges[split][first], self.documents[split][first])
        for first, listing in listed[split]
      ]
      for split, files in fingerprints.items()
    }
    identity = {'revision': _REVISION, 'text_feature': config.text_feature}
    if not config.eval_files:
      identity['eval_percent'] = config.eval_percent
      if held_out_by != 'document':  # the rule before there was a choice: its digests stay
        identity['eval_holdout_by'] = held_out_by
    sha256s = {split: _sha256s(listings[split]) for split in fingerprints}
    if 'eval' in fingerprints and not set(sha256s['eval']).isdisjoint(sha256s['train']):
      by_content = (
        [(f['path'], sha256) for f, sha256 in zip(fingerprints[s], _sha256s(listings[s]))]
        for s in SPLITS
      )
      _check_apart(*by_content, 'has the same content as')
    digest = hashlib.sha256()
    for part in _json_parts(identity, _items(listings, 'identities')):
      digest.update(part.encode())
    digest = digest.hexdigest()
    manifest = dict(identity, corpus_digest=digest)
    for split, files in fingerprints.items():
      for (first, _), listing in zip(listed[split], listings[split]):
        if listing['empty'] is not None:
          path = files[first + listing['empty']]['path']
          raise DataError(f'{path}: the file is empty (no document in it).')
      for first in sorted(first for s, first in self.to_remember if s == split):
        _remember(shard_dir, files[first : first + 1], [ranges[split][first]])
    for split in SPLITS:
      if not counts[split]['documents']:
        raise DataError(
          _empty_split_message(config, split, counts, fingerprints['train'], held_out_by)
        )
    shards = self.shards
    manifest['splits'] = {
      s: dict(counts[s], shards=[[os.path.relpath(p, data_dir), n] for p, n in shards[s].items()])
      for s in SPLITS
    }
    name = 'files-' + digest[:12]
    directory = os.path.join(data_dir, name)
    os.makedirs(directory, exist_ok=True)
    # no indentation (json's C encoder), sorted keys: as atomic_files.write_json writes
    text = ''.join(_json_parts(manifest, _items(listings, 'entries')))
    atomic_files.write_bytes(os.path.join(directory, MANIFEST), text.encode())
    return Corpus(
      name=name,
      directory=directory,
      digest=digest,
      records={s: _open(list(shards[s]), config.text_feature) for s in SPLITS},
      segments=segments,
      text_bytes={s: counts[s]['text_bytes'] for s in SPLITS},
      ends_file=self.ends_file,
    )


def _listing(files, identities: list, documents: list) -> dict:
  """What the corpus's digest and manifest hold of some files, in file order (`files`: their
  fingerprints, `identities`: `_file_identities`, `documents`: each file's count in either
  split): their SHA-256s, their identities and manifest entries as JSON (the items of
  `json.dumps` of each list with sorted keys: what the whole list encodes them as), and the
  index of the first file with no document (None). A chunk of whole files is listed where it
  is read (a worker), so the preparing process only joins texts: building and encoding an
  entry per file there took ~0.5 CPU s of 100,000 files, serial after the reading."""
  entries = [dict(file, **identity) for file, identity in zip(files, identities)]
  return {
    'sha256s': [identity['sha256'] for identity in identities],
    'identities': json.dumps(identities, sort_keys=True)[1:-1],
    'entries': json.dumps(entries, sort_keys=True)[1:-1],
    'empty': documents.index(0) if 0 in documents else None,
  }


def _sha256s(listings: list):
  """The files' SHA-256s of `listings`, in order."""
  return itertools.chain.from_iterable(listing['sha256s'] for listing in listings)


def _range_file_listing(file: dict, chunks: list, documents: int) -> dict:
  digests = ''.join(sha256 for _, _, sha256 in chunks)
  return _listing([file], _file_identities([file], [digests]), [documents])


def _items(listings: dict, kind: str) -> dict:
  """{'<split>_files': the JSON items of `kind` of the split's files, per listing, in order}."""
  return {
    f'{split}_files': [listing[kind] for listing in split_listings]
    for split, split_listings in listings.items()
  }


def _json_parts(value: dict, lists: dict) -> list[str]:
  """`json.dumps(value, sort_keys=True)` in parts, with value[key] the list whose JSON items
  are the texts lists[key] (each one or more items, joined by ', '): the same bytes as
  encoding the list of dicts (json's default separators), with no dict built per item and
  the long lists never copied into one string here (hashed, or joined once, by the caller)."""
  placeholders = {json.dumps(f'\0{key}\0'): key for key in lists}  # NUL: in no path or name
  skeleton = json.dumps(dict(value, **{key: f'\0{key}\0' for key in lists}), sort_keys=True)
  parts = []
  for piece in re.split('(' + '|'.join(map(re.escape, placeholders)) + ')', skeleton):
    if piece not in placeholders:
      parts.append(piece)
      continue
    parts.append('[')
    for index, items in enumerate(lists[placeholders[piece]]):
      parts.extend((', ', items) if index else (items,))
    parts.append(']')
  return parts


def _file_identities(files: list[dict], chunk_digests: list[str]) -> list[dict]:
  """Each file as the corpus digest sees it: its format and the digest of its chunks' digests
  (not its path or time). `chunk_digests`: per file, its chunks' SHA-256s joined (a file read
  whole: its one SHA-256). One call a chunk, not a file: a call and a list per file were ~1 us
  of a corpus of many small ones."""
  format_of, compression_of, sha256 = (
    text_files.format_of,
    text_files.compression_of,
    hashlib.sha256,
  )
  return [
    {
      'format': format_of(file['path']) + compression_of(file['path']),
      'sha256': sha256(digests.encode()).hexdigest(),
    }
    for file, digests in zip(files, chunk_digests)
  ]


def _bucket(digest: bytes) -> int:
  """Where a SHA-256 digest falls in 10,000 buckets (the lowest eval_percent * 100 are held
  out)."""
  return int.from_bytes(digest[:8], 'little') % 10_000


def is_held_out(text: str, eval_percent: float) -> bool:
  """A document's side of the held-out split: a stable hash of its text, not its position."""
  return _bucket(hashlib.sha256(text.encode()).digest()) < eval_percent * 100


def is_held_out_file(head_sha256: str, eval_percent: float) -> bool:
  """A file's side (data.eval_holdout_by=file): `head_sha256`, the SHA-256 of its first
  _SIDE_BYTES as stored, so a copied or renamed file stays on its side."""
  return _bucket(bytes.fromhex(head_sha256)) < eval_percent * 100


def _head_sha256(
  path: str, size: int, start: int, end: int, sha256: str, data: Optional[bytes] = None
) -> str:
  """The SHA-256 of the file's first _SIDE_BYTES; that of the range [start, end) when the range
  is exactly those bytes, from `data` (the file's bytes from 0) where read already."""
  head = min(size, _SIDE_BYTES)
  if (start, end) == (0, head):
    return sha256
  if data is not None and start == 0:
    return hashlib.sha256(data[:head]).hexdigest()
  return text_files.sha256_of_range(path, 0, head)


def _shard_outputs(chunk: _Chunk, sha256s: tuple) -> dict[str, str]:
  """{split: path} of the shard holding the chunk whose pieces' exact bytes hash to
  `sha256s`."""
  key = {
    'split': chunk.split,
    'held_out': chunk.held_out,
    'text_feature': chunk.text_feature,
    'revision': _REVISION,
  }
  formats = [text_files.format_of(path) for path, *_ in chunk.pieces]
  if len(chunk.pieces) == 1:  # a file or a range alone: named as before files were grouped
    key.update(sha256=sha256s[0], format=formats[0])
  else:
    key.update(sha256s=list(sha256s), formats=formats)
  if chunk.held_out is not None and chunk.held_out_by != 'document':
    key['held_out_by'] = chunk.held_out_by
  name = 'shard-' + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
  splits = SPLITS if chunk.held_out is not None else (chunk.split,)
  return {s: os.path.join(chunk.shard_dir, f'{name}-{s}.array_record') for s in splits}


def _is_done(outputs: dict[str, str]) -> bool:
  return all(cache_integrity.problem(p) is None for p in outputs.values())


def _outputs(chunk: _Chunk, exact: tuple) -> dict[str, str]:
  return _shard_outputs(chunk, tuple(sha256 for _, _, sha256 in exact))


def _finished(chunk: _Chunk, exact: Optional[tuple] = None, outputs=None) -> dict:
  """The result of a chunk whose shard is published: its pieces' exact (start, end, sha256)
  (`exact`, else those remembered), the shard per split (`outputs`, where known) and its
  documents' counts per piece."""
  exact = exact or chunk.known
  outputs = outputs or _outputs(chunk, exact)
  counts, piece_counts = {}, {}
  for split, path in outputs.items():
    record = cache_integrity.read_record(path)
    counts[split] = {'documents': record['documents'], 'text_bytes': record['text_bytes']}
    # A shard of one piece (written before files were grouped) records only its totals.
    piece_counts[split] = record.get('pieces') or [[record['documents'], record['text_bytes']]]
  result = {'outputs': outputs, 'counts': counts, 'piece_counts': piece_counts}
  if chunk.files:  # whole files: their listing here, in whichever process read the chunk
    identities = _file_identities(chunk.files, [sha256 for _, _, sha256 in exact])
    per_split = [[n for n, _ in per_piece] for per_piece in piece_counts.values()]
    documents = per_split[0] if len(per_split) == 1 else [sum(n) for n in zip(*per_split)]
    result['listing'] = _listing(chunk.files, identities, documents)
  else:  # a range of a file: its exact bounds and digest (no piece per file sent back)
    result['pieces'] = [{'start': s, 'end': e, 'sha256': sha256} for s, e, sha256 in exact]
  return result


@gc_pause.while_running
def _read_chunk(chunk: _Chunk) -> dict:
  """Settles the chunk's exact bytes and their hashes, then writes its shard unless a shard of
  the same content exists (under the shard's lock). Runs in a worker process. A small file is
  read once: hashed and parsed from the same bytes (three opens a file were most of the cost
  of a corpus of tiny files); a larger one is hashed, read, and hashed again."""
  exact, contents = [], []
  known_pieces = chunk.known or itertools.repeat(None)
  read_range, sha256 = text_files.read_range, hashlib.sha256  # per file: no lookups
  for (path, size, start, end), known in zip(chunk.pieces, known_pieces):
    if _read_at_once(path, size, start, end):
      data = read_range(path, 0, size)
      exact.append((0, size, sha256(data).hexdigest()))
      if known and tuple(known) != exact[-1]:
        raise _changed_error(path, (0, size))
      contents.append(data)
      continue
    if known:  # the file's fingerprint is unchanged: bounds and hash are remembered
      exact.append(tuple(known))
    else:
      start, end = text_files.exact_range(path, start, end, size)
      exact.append((start, end, text_files.sha256_of_range(path, start, end)))
    contents.append(None)
  exact = tuple(exact)
  outputs = _outputs(chunk, exact)
  name = os.path.basename(outputs[chunk.split]).rsplit('-', 1)[0]
  with cache_lock.exclusive_lock(chunk.shard_dir, name):
    if not _is_done(outputs):
      for path in outputs.values():
        cache_integrity.remove_stale_temporaries(path, chunk.stale)
      _write_shard(chunk, exact, outputs, contents)
  if chunk.files and not chunk.known:  # a known unit's record holds exactly these already
    _remember(chunk.shard_dir, list(chunk.files), [[piece] for piece in exact])
  return _finished(chunk, exact, outputs)


def _read_at_once(path: str, size: int, start: int, end: int) -> bool:
  """Whether a piece is a small local file read whole (Parquet reads its own way)."""
  return (
    start == 0
    and end == size
    and size < SMALL_FILE_BYTES
    and '://' not in path
    and text_files.format_of(path) != '.parquet'
  )


# What ArrayRecord's writer reports as a RuntimeError while it stands for an OSError.
_WRITER_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def _writer_os_error(error: RuntimeError, directory: str) -> Exception:
  """ArrayRecord's writer reports a failed write(2) as a RuntimeError holding the system's
  words for it ('write() failed: No space left on device; writing PATH; at byte 49152'): the
  OSError it stands for, naming `directory` (the temporary file is gone), so that
  preparation.disk_errors makes it one line; any other error as it was."""
  for code in _WRITER_ERRNOS:
    if os.strerror(code) in str(error):
      return OSError(code, os.strerror(code), directory)
  return error


def _write_shard(chunk: _Chunk, exact: tuple, outputs: dict[str, str], contents: list) -> None:
  """Each split's documents into `<shard>.tmp.<pid>`, published with a sidecar of its counts,
  in all and per piece (a kill between two publications leaves the shard unfinished: it is
  read again, whole). `contents`: per piece, its bytes already read and hashed, or None (then
  the piece is read from its file and hashed again)."""
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  tmp = {split: f'{path}.tmp.{os.getpid()}' for split, path in outputs.items()}
  counts = {split: {'documents': 0, 'text_bytes': 0} for split in outputs}
  piece_counts = {split: [] for split in outputs}
  writers = {}
  try:
    for split, path in tmp.items():
      writers[split] = array_record_module.ArrayRecordWriter(path, _SHARD_OPTIONS)
    # The rule asked once a chunk, not per file or document (a chunk holds thousands of each).
    held_out = chunk.held_out
    by_file = held_out is not None and chunk.held_out_by == 'file'
    by_document = held_out is not None and chunk.held_out_by == 'document'
    field = held_out_field(chunk.held_out_by) if held_out is not None else ''
    for (path, size, _, _), (start, end, sha256), content in zip(chunk.pieces, exact, contents):
      for split in outputs:
        piece_counts[split].append([0, 0])
      side = chunk.split
      if by_file:
        head = _head_sha256(path, size, start, end, sha256, content)
        side = 'eval' if is_held_out_file(head, held_out) else 'train'
      documents, text_bytes = 0, 0  # of the piece, where all go to `side`
      for text in text_files.documents(path, chunk.text_feature, (start, end), content, field):
        if field:  # (text, its field's value as canonical JSON)
          text, group = text
          split = 'eval' if is_held_out(group, held_out) else 'train'
        elif by_document:
          split = 'eval' if is_held_out(text, held_out) else 'train'
        else:
          data = text.encode()
          writers[side].write(data)
          documents += 1
          text_bytes += len(data)
          continue
        data = text.encode()
        writers[split].write(data)
        piece_counts[split][-1][0] += 1
        piece_counts[split][-1][1] += len(data)
      piece_counts[side][-1][0] += documents
      piece_counts[side][-1][1] += text_bytes
      if content is None:
        _check_unchanged(path, (start, end), sha256)
    for split in list(writers):
      writers.pop(split).close()

    def source(index: int) -> dict:  # the first and last pieces only: not one dict a file
      (start, end, sha256), path = exact[index], chunk.pieces[index][0]
      return {'path': path, 'start': start, 'end': end, 'sha256': sha256}

    alone = len(exact) == 1
    for split, path in outputs.items():
      counts[split]['documents'] = sum(n for n, _ in piece_counts[split])
      counts[split]['text_bytes'] = sum(b for _, b in piece_counts[split])
      record = dict(split=split, **counts[split])
      if alone:  # as before files were grouped
        record['source'] = source(0)
      else:  # its files are listed in their fingerprint record (group-<hash>.json)
        record.update(files=len(exact), first=source(0), last=source(-1))
        record['pieces'] = piece_counts[split]
      # a group's record lists its files: no indentation (json's C encoder)
      cache_integrity.publish(tmp[split], path, record, indent=2 if alone else None)
  except RuntimeError as e:
    as_os_error = _writer_os_error(e, chunk.shard_dir)
    if as_os_error is e:
      raise
    raise as_os_error from None
  finally:
    for writer in writers.values():
      try:  # a full disk makes close() fail again: the first error is the one to report
        writer.close()
      except Exception:  # pylint: disable=broad-except
        pass
    for path in tmp.values():
      if os.path.exists(path):
        os.remove(path)


def _check_unchanged(path: str, byte_range, sha256: str) -> None:
  """The bytes just read still hash to `sha256` (what names the shard), or one DataError line:
  the file was rewritten in place since it was hashed (or since its digest was remembered under
  the same size and modification time). A file appended to is read only to its hashed end, so
  this holds for it."""
  if text_files.sha256_of_range(path, *byte_range) != sha256:
    raise _changed_error(path, byte_range)


def _changed_error(path: str, byte_range) -> DataError:
  return DataError(
    f'{path}: its bytes {byte_range[0]:,}-{byte_range[1]:,} changed while it was '
    'prepared (they no longer hash to what was hashed before reading, or to the digest '
    'remembered for its size and modification time): prepare again once nothing writes to '
    'it, with experiments.prepare_data --rehash to hash every file again.'
  )


def _fingerprint_path(shard_dir: str, files: list[dict]) -> str:
  """Where the chunk digests of a unit of files are remembered (a file alone: under its path,
  as before files were grouped)."""
  if len(files) == 1:
    digest = hashlib.sha256(files[0]['path'].encode()).hexdigest()[:24]
  else:
    paths = '\n'.join(file['path'] for file in files)
    digest = 'group-' + hashlib.sha256(paths.encode()).hexdigest()[:24]
  return os.path.join(shard_dir, _FINGERPRINT_DIR, f'{digest}.json')


def _known_chunks(shard_dir: str, files: list[dict]) -> Optional[list]:
  """Per file, [(start, end, sha256)] of its chunks, when the unit's paths, sizes and times are
  those remembered."""
  try:
    with open(_fingerprint_path(shard_dir, files)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  if record.get('revision') != _REVISION:
    return None
  if len(files) == 1:
    if record.get('file') != files[0]:
      return None
    return [[tuple(c) for c in record['chunks']]]
  if record.get('files') != files:
    return None
  return [[tuple(c) for c in chunks] for chunks in record['chunks']]


def _remember(shard_dir: str, files: list[dict], chunk_digests: list) -> None:
  """Remembers each file's [(start, end, sha256)] under the unit's fingerprints."""
  record = {'revision': _REVISION}
  if len(files) == 1:
    record.update(file=files[0], chunks=chunk_digests[0])
  else:  # (start, end, sha256) tuples: JSON lists, as json.dumps writes a tuple
    record.update(files=files, chunks=chunk_digests)
  try:
    atomic_files.write_json(_fingerprint_path(shard_dir, files), record, indent=None)
  except OSError:
    pass  # only a shortcut: without it the file is hashed again next time


def _check_apart(train: list, held_out: list, relation: str) -> None:
  """DataError when an eval file is a train file. `train`, `held_out`: (path, key) pairs, the
  key a file's device and inode or its content digest."""
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


def _empty_split_message(
  config, split: str, counts: dict, train_files: list, held_out_by: str
) -> str:
  if split == 'eval' and held_out_field(held_out_by):
    return (
      f'data.train_files={config.train_files!r}: the corpus is too small to hold out '
      f'data.eval_percent={config.eval_percent}% of its document groups for evaluation (none '
      f"of them fell there; data.eval_holdout_by='{held_out_by}'): give data.eval_files, "
      'raise data.eval_percent, or hold out by file or document.'
    )
  if split == 'eval' and held_out_by == 'file':
    return (
      f'data.train_files={config.train_files!r}: the corpus is too small to hold out '
      f'data.eval_percent={config.eval_percent}% of its files for evaluation (none of its '
      f'{len(train_files):,} file(s) fell there; data.eval_holdout_by=file): give '
      'data.eval_files, raise data.eval_percent, or hold out documents (data.eval_holdout_by='
      "'document': paragraphs of one file may then be in both splits)."
    )
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

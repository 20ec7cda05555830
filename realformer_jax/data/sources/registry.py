"""The record of a data source, and the table preparation asks.

A source is one module and one `register(Source(...))`: the module has

    open_source(config, workers) -> OpenedSource

which reads the fields it needs of the `data` section (data/config.py: dataset, data_dir,
train_files, the splits, text_feature, max_documents, ...), checks them (a one-line DataError
naming the field, file or split, before any text is tokenized) and returns the train and eval
documents as random-access grain datasets of records, plus what names the text. Preparation
(data/preparation.py) does the rest for every source alike: tokenizer, packed store, batches.
`data.source` picks one by name; 'auto' takes the first registered source that claims the
config. The record holds no code of the source: its module is imported when the source is
opened, so naming a source costs nothing (the TFDS ones load tensorflow_datasets only then).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Callable, Optional

from realformer_jax.data.errors import DataError

AUTO = 'auto'
# The corpus shipped inside the package (data/sources/embedded): the data config's default.
EMBEDDED_DATASET = 'bible_web'


@dataclasses.dataclass(frozen=True)
class OpenedSource:
  """What a source gives preparation: the documents and what identifies them."""

  train_records: Any  # grain.MapDataset of records; config.text_feature holds the text
  eval_records: Any  # the held-out documents, read in order as one pass
  description: str  # "dataset 'x'", "corpus files-<digest> (...)": for messages
  dataset_name: str  # e.g. 'bible_web/1.0.0' or 'files-<digest>': names caches
  cache_dir: str  # holds tokenizers/ and packed/ for this text
  # What names the train text in the packed store's key (beside the tokenization settings
  # preparation adds), e.g. {'dataset': ..., 'split': ...}: a changed value is another store.
  key: dict
  split_names: tuple[str, str] = ('train', 'eval')  # for messages
  # The train documents as (source, first, stop) pieces that encoding jobs and the tokenizer
  # sample read (encoding.read_texts): shard paths, or a grain dataset.
  train_segments: tuple = ()
  # UTF-8 bytes of each train segment, where known (None: estimated); the tokenizer's sample
  # spreads over the text by them.
  train_segment_bytes: tuple = ()
  # Per train segment, whether a file ends there (a corpus of files; empty: none does), so
  # the tokenizer's sample windows go on into the next file rather than stop at its end.
  train_segment_ends_file: tuple = ()
  train_text_bytes: Optional[int] = None  # UTF-8 bytes of the train text, where known
  corpus_digest: Optional[str] = None  # a content digest, where the source has one


@dataclasses.dataclass(frozen=True)
class Source:
  """Everything preparation knows about one data source."""

  name: str  # the data.source value; recorded in the packed store's sidecar
  module: str  # the module holding open_source(config, workers), imported on use
  # Whether data.source='auto' takes it for a config (the first registered that does).
  claims: Optional[Callable[[Any], bool]] = None
  # The packed store's key holds 'source': name. Off only for the sources whose stores were
  # packed before sources had names (tfds, embedded): a new key field renames a store, and a
  # run whose checkpoint records the old name would not resume.
  key_names_source: bool = True

  def open(self, config: Any, workers: Optional[int]) -> OpenedSource:
    opened = importlib.import_module(self.module).open_source(config, workers)
    if not isinstance(opened, OpenedSource):
      raise TypeError(f'{self.module}.open_source returned {type(opened).__name__}')
    return opened


_SOURCES: dict[str, Source] = {}


def register(source: Source) -> Source:
  if source.name == AUTO or source.name in _SOURCES:
    raise ValueError(f'data source {source.name!r} is already registered (or reserved)')
  _SOURCES[source.name] = source
  return source


def unregister(name: str) -> None:
  _SOURCES.pop(name, None)


def names() -> tuple[str, ...]:
  return tuple(_SOURCES)


def get(name: str) -> Source:
  if name not in _SOURCES:
    raise DataError(
      f"data.source={name!r}: no such source (registered: {', '.join(_SOURCES)}; or 'auto')"
    )
  return _SOURCES[name]


def for_config(config: Any) -> Source:
  """The source of a data section: data.source by name, or the first that claims it."""
  if config.source != AUTO:
    return get(config.source)
  for source in _SOURCES.values():
    if source.claims is not None and source.claims(config):
      return source
  raise DataError(f"data.source='auto': no registered source claims this config ({names()})")


def data_dir_of(config: Any) -> str:
  return os.path.abspath(os.path.expanduser(config.data_dir))

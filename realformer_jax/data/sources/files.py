"""The `files` source: your own .txt / .jsonl / .json / .parquet files (data.train_files,
data.eval_files), read into content-identified document shards by file_corpus.py."""

from __future__ import annotations

from typing import Any, Optional

from realformer_jax.data import file_corpus
from realformer_jax.data.errors import DataError
from realformer_jax.data.sources.registry import OpenedSource, data_dir_of


def open_source(config: Any, workers: Optional[int] = None) -> OpenedSource:
  """`workers`: processes reading the files at once (None: every core for a large corpus; the
  documents do not depend on it)."""
  if not config.train_files:
    raise DataError('data.source=files: set data.train_files (globs or directories of files)')
  corpus = file_corpus.open_corpus(config, data_dir_of(config), workers)
  limit = config.max_documents if config.max_documents > 0 else None
  train_records, eval_records = (corpus.records[s][:limit] for s in ('train', 'eval'))
  segments, segment_bytes, ends_file, seen = [], [], [], 0
  for (path, first, stop, text_bytes), end in zip(
    corpus.segments['train'], corpus.ends_file['train']
  ):
    take = stop - first if limit is None else min(stop - first, limit - seen)
    if take > 0:
      segments.append((path, first, first + take))
      segment_bytes.append(text_bytes if take == stop - first else None)
      ends_file.append(end)
    seen += stop - first
  return OpenedSource(
    train_records=train_records,
    eval_records=eval_records,
    description=f'corpus {corpus.name} (data.train_files={config.train_files!r})',
    dataset_name=corpus.name,
    cache_dir=corpus.directory,
    # The corpus is named by its content (its directory's digest), not by a split.
    key={'dataset': corpus.name},
    train_segments=tuple(segments),
    train_segment_bytes=tuple(segment_bytes),
    train_segment_ends_file=tuple(ends_file),
    train_text_bytes=corpus.text_bytes['train'] if limit is None else None,
    corpus_digest=corpus.digest,
  )

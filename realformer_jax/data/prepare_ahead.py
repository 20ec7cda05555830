"""Everything a masked-LM training run reads, prepared ahead of it (experiments.prepare_data).

A library function rather than the CLI's own, so tests and benchmarks call it without importing
a module that defines absl flags (two CLIs imported into one process define `--config` twice).
"""

import time
from typing import Optional

from realformer_jax.data import file_corpus, pipeline, preparation, sources
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data.config import data_config as to_data_config


def prepare_ahead(
  data_config,
  workers: Optional[int] = None,
  global_batch_size: Optional[int] = None,
  rehash: bool = False,
) -> dict:
  """Prepares the documents, tokenizer, packed train store and eval split of `data_config`
  with `workers` processes (None: every core for a large corpus); returns what was prepared,
  for the summary line, with the seconds of each phase (tokenizer training on its own).

  `global_batch_size`: the training run's; a corpus packing into fewer sequences is refused
  here as training would refuse it. `rehash`: hash every file of a file corpus again instead of
  trusting the digests remembered under its path, size and modification time (an edit that
  kept both is otherwise not seen: file_corpus.py)."""
  start = time.monotonic()
  data_config = to_data_config(data_config)
  if rehash:
    file_corpus.forget_fingerprints(data_config, sources.data_dir_of(data_config))
  prepared = preparation.prepared_data(data_config, workers)
  prepared_at = time.monotonic()
  store = preparation.packed_train_store(data_config, workers)
  packed_at = time.monotonic()
  if global_batch_size is not None:
    pipeline.check_one_global_batch(data_config, len(store), global_batch_size)
  eval_rows = len(pipeline.eval_sequences(data_config)['input_ids'])
  return {
    'corpus': prepared.description,
    'corpus_digest': store.record.get('corpus_digest'),
    'cache_dir': prepared.cache_dir,
    'tokenizer': prepared.tokenizer.source,
    'vocab_size': prepared.tokenizer.vocab_size,
    # None where the tokenizer was given or found ready (nothing trained in this run).
    'tokenizer_seconds': tokenizer_lib.TRAINED_SECONDS.get(prepared.tokenizer.source),
    'train_store': store.path,
    'train_sequences': len(store),
    'eval_sequences': eval_rows,
    'documents_seconds': prepared_at - start,
    'packing_seconds': packed_at - prepared_at,
    'seconds': time.monotonic() - start,
  }

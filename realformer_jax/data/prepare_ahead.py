"""Everything a masked-LM training run reads, prepared ahead of it (experiments.prepare_data).

A library function rather than the CLI's own, so tests and benchmarks call it without importing
a module that defines absl flags (two CLIs imported into one process define `--config` twice).
"""

import time

from realformer_jax.data import pipeline, preparation
from realformer_jax.data.config import data_config as to_data_config


def prepare_ahead(data_config, workers: int = 1) -> dict:
  """Prepares the documents, tokenizer, packed train store and eval split of `data_config`;
  returns what was prepared, for the summary line."""
  start = time.monotonic()
  data_config = to_data_config(data_config)
  prepared = preparation.prepared_data(data_config, workers)
  store = preparation.packed_train_store(data_config)
  eval_rows = len(pipeline.eval_sequences(data_config)['input_ids'])
  return {
    'corpus': prepared.description,
    'cache_dir': prepared.cache_dir,
    'tokenizer': prepared.tokenizer.source,
    'vocab_size': prepared.tokenizer.vocab_size,
    'train_store': store.path,
    'train_sequences': len(store),
    'eval_sequences': eval_rows,
    'seconds': time.monotonic() - start,
  }

"""Masked-LM data: TFDS text → SentencePiece ids → packed [CLS] ... [SEP] sequences → batches.

    tokenizer = data.prepare(config.data)          # idempotent; before building the model
    train_iter = data.make_train_iterator(config.data, global_batch_size, seed,
                                          jax.process_index(), jax.process_count())
    batch = next(train_iter)                       # dict of numpy arrays, see pipeline.py
    for batch in data.make_eval_iterator(config.data, global_batch_size, ...): ...

The default dataset is the embedded `bible_web` corpus (corpus.py), prepared on first use
without network. Every user-fixable problem raises `DataError` before any model is compiled.
Checkpoint the train iterator with grain's orbax handler
(`grain.checkpoint.CheckpointSave(train_iter)` / `CheckpointRestore(train_iter)`) or store
`train_iter.get_state()` (a JSON-serialisable dict) and call `set_state` on a new iterator.
The state is the global batch position, the same on every process, so it also restores with a
different process count (`saved_train_state` reads it from a grain checkpoint directory).
"""

import importlib

from realformer_jax.data.config import (
  DataConfig,
  data_config,
  default_data_config,
  validate_data_config,
)
from realformer_jax.data.errors import DataError
from realformer_jax.data.tokenizer import Tokenizer

# Names whose modules need the data stack (grain, TFDS: the 'train' extra): imported on first
# use, so that the model and the train step load without it (realformer_jax/extras.py).
_ON_FIRST_USE = {
  'context_free_floors': 'baseline',
  'most_frequent_token_baseline': 'baseline',
  'BATCH_KEYS': 'pipeline',
  'EvalBatches': 'pipeline',
  'local_batch_size': 'pipeline',
  'make_eval_iterator': 'pipeline',
  'make_train_iterator': 'pipeline',
  'saved_train_state': 'pipeline',
  'prepare': 'preparation',
}


def __getattr__(name: str):
  if name not in _ON_FIRST_USE:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(f'{__name__}.{_ON_FIRST_USE[name]}'), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_ON_FIRST_USE))

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

from realformer_jax.data.baseline import context_free_floors, most_frequent_token_baseline
from realformer_jax.data.config import (
  DataConfig,
  data_config,
  default_data_config,
  validate_data_config,
)
from realformer_jax.data.errors import DataError
from realformer_jax.data.pipeline import (
  BATCH_KEYS,
  EvalBatches,
  local_batch_size,
  make_eval_iterator,
  make_train_iterator,
  saved_train_state,
)
from realformer_jax.data.preparation import prepare
from realformer_jax.data.tokenizer import Tokenizer

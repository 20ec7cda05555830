"""Masked-LM data: a source's text (sources/: files, embedded, tfds, or one you register) →
SentencePiece ids → packed [CLS] ... [SEP] sequences → batches.

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

The names below load on first use (PEP 562), so a preparation worker process that imports one
submodule (file_corpus, encoding) does not import TFDS, grain's pipeline or absl flags.
"""

from realformer_jax.extras import public_names

# Public name -> the submodule defining it.
_EXPORTS = {
  'context_free_floors': '.baseline',
  'most_frequent_token_baseline': '.baseline',
  'DataConfig': '.config',
  'data_config': '.config',
  'default_data_config': '.config',
  'validate_data_config': '.config',
  'DataError': '.errors',
  'BATCH_KEYS': '.pipeline',
  'EvalBatches': '.pipeline',
  'local_batch_size': '.pipeline',
  'make_eval_iterator': '.pipeline',
  'make_train_iterator': '.pipeline',
  'saved_train_state': '.pipeline',
  'prepare': '.preparation',
  'Tokenizer': '.tokenizers',
}
__all__ = sorted(_EXPORTS)
# Also a submodule by name: `from realformer_jax import data; data.preparation`.
__getattr__, __dir__ = public_names(globals(), _EXPORTS, submodules=True)

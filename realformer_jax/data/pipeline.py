"""Train and eval iterators: documents → token ids → packed sequences → MLM masking → batches.

Batch contract (numpy; B = global_batch_size // process_count, L = max_len,
P = max_predictions):

    input_ids        int32   [B, L]  corrupted token ids; [PAD] = 0 at padding
    segment_ids      int32   [B, L]  all 0 (one segment per packed sequence)
    input_mask       int32   [B, L]  1 at real tokens ([CLS] and [SEP] included), 0 at padding
    masked_positions int32   [B, P]  indices into L of the predicted tokens; 0 in unused slots
    masked_ids       int32   [B, P]  original ids at those positions; 0 in unused slots
    masked_weights   float32 [B, P]  1.0 for real predictions, 0.0 for unused slots

Train: each process reads records[process_index::process_count], shuffles them per epoch
(deterministically: seed + epoch), repeats forever, packs, shuffles packed sequences in windows
of `shuffle_buffer`, and masks sequence i with default_rng([seed, process_index, i]). The
returned grain DatasetIterator is checkpointable: `get_state()` is a JSON-serialisable dict
and `set_state(state)` on a freshly built iterator (same config, seed and process layout)
resumes with exactly the batches that would have followed.

Eval: the eval split is read in order, packed and masked once with `eval_mask_seed`
(sequence i with default_rng([eval_mask_seed, i])) and cached in memory; sequences are then
dealt to processes (i::process_count), so the evaluated set and its masks do not depend on the
process count. Every process yields the same number of batches; the last ones are padded with
all-zero rows (masked_weights 0), so weighted metrics ignore them and shapes never change.
"""

from __future__ import annotations

import functools
import math

from absl import flags
import grain
import ml_collections
import numpy as np

from realformer_jax.data import masking
from realformer_jax.data import packing
from realformer_jax.data import preparation
from realformer_jax.data import sources
from realformer_jax.data import tokenizer as tokenizer_lib
from realformer_jax.data.errors import DataError

BATCH_KEYS = ('input_ids', 'segment_ids', 'input_mask', 'masked_positions', 'masked_ids',
              'masked_weights')


def local_batch_size(global_batch_size: int, process_index: int, process_count: int) -> int:
  """This process's share of the global batch; DataError if it does not divide evenly."""
  if process_count < 1 or not 0 <= process_index < process_count:
    raise DataError(f'process_index={process_index} is not in [0, process_count={process_count}).')
  if global_batch_size < 1 or global_batch_size % process_count:
    raise DataError(f'global_batch_size={global_batch_size} is not a positive multiple of '
                    f'process_count={process_count}.')
  return global_batch_size // process_count


def make_train_iterator(data_config: ml_collections.ConfigDict, global_batch_size: int,
                        seed: int, process_index: int = 0,
                        process_count: int = 1) -> grain.DatasetIterator:
  """An endless, checkpointable iterator of this process's training batches."""
  batch_size = local_batch_size(global_batch_size, process_index, process_count)
  seed = int(seed)  # May arrive as a numpy or JAX scalar.
  if not 0 <= seed < 2**32:
    raise DataError(f'seed={seed} must be in [0, 2**32) (grain shuffle seeds are uint32).')
  tokenizer = preparation.prepare(data_config)
  documents = train_documents(data_config, seed, process_index, process_count)
  # One background thread tokenizes ahead of the consumer; order stays deterministic.
  stream = documents.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=64))
  if data_config.worker_count > 0:
    # grain's worker start-up reads absl flags; scripts that do not use absl.app never parse them.
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    stream = stream.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=data_config.worker_count))
  stream = packing.PackedSequenceIterDataset(stream, **_packing_ids(data_config, tokenizer))
  if data_config.shuffle_buffer > 0:
    # Consecutive sequences come from the same document: mix them across documents.
    stream = grain.experimental.WindowShuffleIterDataset(
        stream, window_size=data_config.shuffle_buffer, seed=seed)
  stream = stream.map_with_index(functools.partial(
      _mask_example, data_config, tokenizer, (seed, process_index)))
  stream = stream.batch(batch_size, drop_remainder=True)
  return iter(stream)


def train_documents(data_config: ml_collections.ConfigDict, seed: int, process_index: int = 0,
                    process_count: int = 1) -> grain.MapDataset:
  """This process's endless stream of tokenized documents, reshuffled each epoch."""
  prepared = preparation.prepared_data(data_config)
  records = _process_share(prepared.train_records, data_config.train_split, prepared,
                           process_index, process_count)
  documents = records.shuffle(seed=seed).repeat()  # Epoch e is shuffled with seed + e.
  return documents.map(functools.partial(_encode_record, prepared.tokenizer,
                                         data_config.text_feature))


class EvalBatches:
  """A finite, re-iterable sequence of eval batches for one process."""

  def __init__(self, arrays: dict[str, np.ndarray], batch_size: int):
    self._arrays = arrays
    self._batch_size = batch_size

  def __len__(self) -> int:
    return len(self._arrays['input_ids']) // self._batch_size

  def __iter__(self):
    for start in range(0, len(self) * self._batch_size, self._batch_size):
      yield {k: v[start:start + self._batch_size] for k, v in self._arrays.items()}


def make_eval_iterator(data_config: ml_collections.ConfigDict, global_batch_size: int,
                       process_index: int = 0, process_count: int = 1) -> EvalBatches:
  """This process's eval batches: one pass (or `eval_batches` batches); iterate it any times."""
  batch_size = local_batch_size(global_batch_size, process_index, process_count)
  sequences = eval_sequences(data_config, global_batch_size)
  num_batches = math.ceil(len(sequences['input_ids']) / global_batch_size)
  share = {k: v[process_index::process_count] for k, v in sequences.items()}
  padded = {}
  for key, values in share.items():
    padded[key] = np.zeros((num_batches * batch_size,) + values.shape[1:], values.dtype)
    padded[key][:len(values)] = values
  return EvalBatches(padded, batch_size)


def eval_sequences(data_config: ml_collections.ConfigDict,
                   global_batch_size: int | None = None) -> dict[str, np.ndarray]:
  """All masked eval sequences as stacked arrays [N, ...], N capped by eval_batches.

  Built once per (config, cap) and kept in memory: evaluation runs many times per training job.
  """
  limit = -1
  if data_config.eval_batches > 0 and global_batch_size:
    limit = data_config.eval_batches * global_batch_size
  key = (data_config.to_json(), limit)
  if key not in _EVAL_CACHE:
    if len(_EVAL_CACHE) >= _EVAL_CACHE_SIZE:
      _EVAL_CACHE.pop(next(iter(_EVAL_CACHE)))
    _EVAL_CACHE[key] = _build_eval_sequences(data_config, limit)
  return _EVAL_CACHE[key]


_EVAL_CACHE: dict[tuple[str, int], dict[str, np.ndarray]] = {}
_EVAL_CACHE_SIZE = 4


def _build_eval_sequences(data_config: ml_collections.ConfigDict,
                          limit: int) -> dict[str, np.ndarray]:
  prepared = preparation.prepared_data(data_config)
  tokenizer = prepared.tokenizer
  records = prepared.eval_records
  documents = (_encode_record(tokenizer, data_config.text_feature, records[i])
               for i in range(len(records)))
  examples = []
  for index, sequence in enumerate(packing.pack_documents(
      documents, **_packing_ids(data_config, tokenizer))):
    if index == limit:
      break
    examples.append(_mask_example(data_config, tokenizer, (data_config.eval_mask_seed,),
                                  index, sequence))
  if not examples:
    raise DataError(f"{prepared.description} split '{data_config.eval_split}' "
                    f'produced no sequences.')
  arrays = {k: np.stack([e[k] for e in examples]) for k in BATCH_KEYS}
  for values in arrays.values():
    values.flags.writeable = False  # Shared by every EvalBatches built from this cache entry.
  return arrays


def _process_share(records: grain.MapDataset, split: str, prepared, process_index: int,
                   process_count: int) -> grain.MapDataset:
  share = records[process_index::process_count]
  if len(share) == 0:
    raise DataError(f"{prepared.description} split '{split}' has {len(records)} records: "
                    f'too few for process {process_index} of {process_count}.')
  return share


def _encode_record(tokenizer: tokenizer_lib.Tokenizer, text_feature: str,
                   record: dict) -> np.ndarray:
  return tokenizer.encode(sources.text_of(record, text_feature))


def _packing_ids(data_config, tokenizer) -> dict[str, int]:
  return dict(max_len=data_config.max_len, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
              pad_id=tokenizer.pad_id)


def _mask_example(data_config, tokenizer, seed_prefix: tuple[int, ...], index: int,
                  sequence: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  # The example's own generator: its mask depends on (seed, index) only.
  rng = np.random.default_rng([*seed_prefix, index])
  masked = masking.mask_sequence(
      sequence['input_ids'], rng, is_special_V=tokenizer.is_special_V,
      regular_ids=tokenizer.regular_ids, mask_id=tokenizer.mask_id,
      max_predictions=data_config.max_predictions, mask_rate=data_config.mask_rate,
      mask_token_rate=data_config.mask_token_rate,
      random_token_rate=data_config.random_token_rate)
  return {
      'input_ids': masked['input_ids'],
      'segment_ids': sequence['segment_ids'],
      'input_mask': sequence['input_mask'],
      'masked_positions': masked['masked_positions'],
      'masked_ids': masked['masked_ids'],
      'masked_weights': masked['masked_weights'],
  }

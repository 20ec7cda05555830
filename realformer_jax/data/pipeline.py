"""Train and eval iterators: documents → token ids → packed sequences → MLM masking → batches.

Batch contract (numpy; B = global_batch_size // process_count, L = max_len,
P = max_predictions):

    input_ids        int32   [B, L]  corrupted token ids; [PAD] = 0 at padding
    segment_ids      int32   [B, L]  all 0 (one segment per packed sequence)
    input_mask       int32   [B, L]  1 at real tokens ([CLS] and [SEP] included), 0 at padding
    masked_positions int32   [B, P]  indices into L of the predicted tokens; 0 in unused slots
    masked_ids       int32   [B, P]  original ids at those positions; 0 in unused slots
    masked_weights   float32 [B, P]  1.0 for real predictions, 0.0 for unused slots

Train: the train split is packed once, in stored order, into a cached store of N rows
(store/packed_store.py). The data is then a function of the global position g only: the endless
stream reads row order[g], where epoch g // N is a permutation of the N rows from `seed`
(reshuffled each epoch), and masks it with default_rng([seed, g]). Global batch b is positions
[b*G, (b+1)*G) (G = global_batch_size), and process p yields its contiguous block
[b*G + p*B, b*G + (p+1)*B), which is where jax.make_array_from_process_local_data puts process
p's rows when the batch axis's devices are in process order (as jax.make_mesh orders them); so
the global batches (rows, masks and their order) are the same for any process count, and each
process reads only its own rows. Batches cross epoch boundaries (none is
dropped or short). "Process" here is a data-parallel process group: the training loop passes
each process its group's index and the group count (train/data_shards.py), so the processes
that share a block of rows (a sequence or tensor axis across hosts) read the same rows.

The returned grain DatasetIterator is checkpointable: `get_state()` is a JSON-serialisable dict
holding the next global position (plus seed and store name, checked on restore), identical on
every process; `set_state(state)` on a freshly built iterator (same config and seed) resumes
with exactly the batches that would have followed, for any process count. grain's orbax
handler names its file by process index and count, so after changing the process count read
the state with `saved_train_state(directory)` instead of `CheckpointRestore`.

Eval: the eval split is read in order, packed and masked once with `eval_mask_seed`
(sequence i with default_rng([eval_mask_seed, i])) and cached in memory; sequences are then
dealt to processes (i::process_count), so the evaluated set and its masks do not depend on the
process count. Every process yields the same number of batches; the last ones are padded with
all-zero rows (masked_weights 0), so weighted metrics ignore them and shapes never change.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import numpy as np
from absl import flags
from etils import epath

from realformer_jax import extras
from realformer_jax.data import config as config_lib
from realformer_jax.data import encoding, masking, packing, preparation
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data.errors import DataError, check_saved_state
from realformer_jax.data.store import packed_store

grain = extras.require('grain')

BATCH_KEYS = (
  'input_ids',
  'segment_ids',
  'input_mask',
  'masked_positions',
  'masked_ids',
  'masked_weights',
)


def local_batch_size(global_batch_size: int, process_index: int, process_count: int) -> int:
  """This process's share of the global batch; DataError if it does not divide evenly."""
  if process_count < 1 or not 0 <= process_index < process_count:
    raise DataError(f'process_index={process_index} is not in [0, process_count={process_count}).')
  if global_batch_size < 1 or global_batch_size % process_count:
    raise DataError(
      f'global_batch_size={global_batch_size} is not a positive multiple of '
      f'process_count={process_count}.'
    )
  return global_batch_size // process_count


def check_one_global_batch(data_config, sequences: int, global_batch_size: int) -> None:
  """DataError when the packed train split holds fewer sequences than one global batch: what
  training refuses, and so what preparing ahead (experiments.prepare_data) refuses too."""
  if sequences < global_batch_size:
    raise DataError(
      f'{preparation.prepared_data(data_config).description} packs into {sequences} '
      f'sequences of max_len={data_config.max_len}, fewer than one global batch '
      f'({global_batch_size}): give more text or a smaller batch.'
    )


def make_train_iterator(
  data_config: config_lib.DataConfig,
  global_batch_size: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
) -> grain.DatasetIterator:
  """An endless, checkpointable iterator of this process's training batches.

  Its batches are rows [p*B, (p+1)*B) of the global batches, which do not depend on
  process_count (see the module docstring).
  """
  data_config = config_lib.data_config(data_config)
  local_batch_size(global_batch_size, process_index, process_count)
  seed = int(seed)  # May arrive as a numpy or JAX scalar.
  if not 0 <= seed < 2**32:
    raise DataError(f'seed={seed} must be in [0, 2**32) (grain shuffle seeds are uint32).')
  store = preparation.packed_train_store(data_config)
  check_one_global_batch(data_config, len(store), global_batch_size)
  batches = train_batches(data_config, global_batch_size, seed, process_index, process_count)
  return TrainIterator(
    batches,
    global_batch_size=global_batch_size,
    seed=seed,
    store=store.name,
    worker_count=data_config.worker_count,
  )


def train_batches(
  data_config: config_lib.DataConfig,
  global_batch_size: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
  store: packed_store.PackedStore | None = None,
) -> grain.MapDataset:
  """This process's endless training batches as a MapDataset: element b is its share of global
  batch b. Random access, so an iterator can start at any batch.

  `store` defaults to the config's packed train split (tests pass an instrumented one).
  """
  data_config = config_lib.data_config(data_config)
  batch_size = local_batch_size(global_batch_size, process_index, process_count)
  tokenizer = preparation.prepare(data_config)
  if store is None:
    store = preparation.packed_train_store(data_config)
  # The row at global position g: epoch g // N is a permutation of the N rows, reshuffled each
  # epoch (grain seeds epoch e with shuffle_seed + e; hashing `seed` first keeps seeds s and
  # s + 1 from sharing permutations one epoch apart).
  shuffle_seed = int(np.random.SeedSequence([seed, _SHUFFLE_SEED_TAG]).generate_state(1)[0])
  rows = grain.MapDataset.range(len(store)).shuffle(seed=shuffle_seed).repeat()
  positions = rows.map_with_index(_with_position)
  # Blocks of B consecutive positions; global batch b is blocks b*n ... b*n + n - 1 in process
  # order, so this process's block of global batch b is block b*n + p. drop_remainder: an
  # endless stream has none, and grain sizes a kept one as ceil(2^63 - 1 / B) in floating
  # point, 2^63 for B = 1 (one sequence per step), too long to slice.
  blocks = positions.batch(batch_size, drop_remainder=True)[process_index::process_count]
  return blocks.map(functools.partial(_load_and_mask_block, data_config, tokenizer, store, seed))


def _with_position(position: int, row: int) -> tuple[int, int]:
  return position, row


# Separates the shuffle seed's derivation from other uses of `seed`.
_SHUFFLE_SEED_TAG = 0x5EED


class TrainIterator(grain.DatasetIterator):
  """Iterates `train_batches` from a global batch position; the state is that position.

  `get_state()` is {'next_position': global sequence position of the next batch (batches
  taken * global_batch_size), 'seed', 'store'}: the same on every process, whatever the
  process count, so a state saved with n processes restores with m (and with any global batch
  size dividing the position). `set_state` checks seed and store (the packed data) match.
  """

  def __init__(
    self,
    batches: grain.MapDataset,
    *,
    global_batch_size: int,
    seed: int,
    store: str,
    worker_count: int = 0,
  ):
    super().__init__()
    self._batches = batches
    self._global_batch_size = global_batch_size
    self._seed = seed
    self._store = store
    self._worker_count = worker_count
    self._next_batch = 0
    self._iterator = None

  def _start(self) -> grain.DatasetIterator:
    stream = self._batches[self._next_batch :].to_iter_dataset(
      grain.ReadOptions(num_threads=1, prefetch_buffer_size=_PREFETCH_BATCHES)
    )
    if self._worker_count > 0:
      # grain's worker start-up reads absl flags; scripts that do not use absl.app never parse
      # them.
      if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
      stream = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=self._worker_count))
    return iter(stream)

  def __next__(self) -> dict[str, np.ndarray]:
    if self._iterator is None:
      self._iterator = self._start()
    batch = next(self._iterator)
    self._next_batch += 1
    return batch

  def get_state(self) -> dict[str, Any]:
    return {
      'next_position': self._next_batch * self._global_batch_size,
      'seed': self._seed,
      'store': self._store,
    }

  def set_state(self, state: dict[str, Any]) -> None:
    check_saved_state(
      'Train iterator state',
      state,
      {'seed': self._seed, 'store': self._store},
      ' (a changed corpus, tokenizer or data setting; a file corpus prepared before corpora '
      'were identified by content is such a change: start that run in a new workdir, or keep '
      'the code it started with)',
    )
    position = int(state['next_position'])
    if position % self._global_batch_size:
      raise DataError(
        f'Train iterator state position {position} is not a multiple of '
        f'global_batch_size={self._global_batch_size}.'
      )
    self.close()
    self._next_batch = position // self._global_batch_size

  def close(self) -> None:
    if self._iterator is not None:
      self._iterator.close()
      self._iterator = None

  def __str__(self) -> str:
    return (
      f'TrainIterator(next_batch={self._next_batch}, global_batch_size={self._global_batch_size})'
    )


# Batches computed ahead by the reader thread (each is B rows masked).
_PREFETCH_BATCHES = 4


def _load_and_mask_block(
  data_config, tokenizer, store, seed: int, block: tuple[np.ndarray, np.ndarray]
) -> dict[str, np.ndarray]:
  positions_B, rows_B = block
  ids_BL = store.rows(rows_B)
  examples = [
    _mask_example(
      data_config,
      tokenizer,
      (seed,),
      int(g),
      packing.sequence_from_ids(ids_L, pad_id=tokenizer.pad_id),
    )
    for g, ids_L in zip(positions_B, ids_BL)
  ]
  return {k: np.stack([e[k] for e in examples]) for k in BATCH_KEYS}


def saved_train_state(directory) -> dict[str, Any]:
  """The train iterator state that grain's orbax handler saved in `directory`, by any process
  count (its `process_<i>-of-<n>.json` files all hold the same state here); for
  `train_iter.set_state(...)` when the process count changed since the save."""
  files = sorted(epath.Path(directory).glob('process_*-of-*.json'))
  if not files:
    raise DataError(f'No grain iterator state (process_*-of-*.json) in {directory}.')
  states = [json.loads(f.read_text()) for f in files]
  if any(state != states[0] for state in states):
    raise DataError(
      f'The iterator states in {directory} differ between processes: they were '
      f'not saved by this pipeline at one step.'
    )
  return states[0]


class EvalBatches:
  """A finite, re-iterable sequence of eval batches for one process."""

  def __init__(self, arrays: dict[str, np.ndarray], batch_size: int):
    self._arrays = arrays
    self._batch_size = batch_size

  def __len__(self) -> int:
    return len(self._arrays['input_ids']) // self._batch_size

  def __iter__(self):
    for start in range(0, len(self) * self._batch_size, self._batch_size):
      yield {k: v[start : start + self._batch_size] for k, v in self._arrays.items()}


def make_eval_iterator(
  data_config: config_lib.DataConfig,
  global_batch_size: int,
  process_index: int = 0,
  process_count: int = 1,
) -> EvalBatches:
  """This process's eval batches: one pass (or `eval_batches` batches); iterate it any times."""
  data_config = config_lib.data_config(data_config)
  batch_size = local_batch_size(global_batch_size, process_index, process_count)
  sequences = eval_sequences(data_config, global_batch_size)
  num_batches = math.ceil(len(sequences['input_ids']) / global_batch_size)
  share = {k: v[process_index::process_count] for k, v in sequences.items()}
  padded = {}
  for key, values in share.items():
    padded[key] = np.zeros((num_batches * batch_size,) + values.shape[1:], values.dtype)
    padded[key][: len(values)] = values
  return EvalBatches(padded, batch_size)


def eval_sequences(
  data_config: config_lib.DataConfig, global_batch_size: int | None = None
) -> dict[str, np.ndarray]:
  """All masked eval sequences as stacked arrays [N, ...], N capped by eval_batches.

  Built once per (config, cap) and kept in memory: evaluation runs many times per training job.
  """
  data_config = config_lib.data_config(data_config)
  limit = -1
  if data_config.eval_batches > 0 and global_batch_size:
    limit = data_config.eval_batches * global_batch_size
  key = (data_config, limit)
  if key not in _EVAL_CACHE:
    if len(_EVAL_CACHE) >= _EVAL_CACHE_SIZE:
      _EVAL_CACHE.pop(next(iter(_EVAL_CACHE)))
    _EVAL_CACHE[key] = _build_eval_sequences(data_config, limit)
  return _EVAL_CACHE[key]


_EVAL_CACHE: dict[tuple[config_lib.DataConfig, int], dict[str, np.ndarray]] = {}
_EVAL_CACHE_SIZE = 4


def _build_eval_sequences(data_config: config_lib.DataConfig, limit: int) -> dict[str, np.ndarray]:
  prepared = preparation.prepared_data(data_config)
  tokenizer = prepared.tokenizer
  records = prepared.eval_records
  documents = (
    _encode_record(tokenizer, data_config.text_feature, records[i]) for i in range(len(records))
  )
  examples = []
  for index, sequence in enumerate(
    packing.pack_documents(documents, **_packing_ids(data_config, tokenizer))
  ):
    if index == limit:
      break
    examples.append(
      _mask_example(data_config, tokenizer, (data_config.eval_mask_seed,), index, sequence)
    )
  if not examples:
    raise DataError(
      f"{prepared.description} split '{data_config.eval_split}' produced no sequences."
    )
  arrays = {k: np.stack([e[k] for e in examples]) for k in BATCH_KEYS}
  for values in arrays.values():
    values.flags.writeable = False  # Shared by every EvalBatches built from this cache entry.
  return arrays


def _encode_record(
  tokenizer: tokenizer_lib.Tokenizer, text_feature: str, record: dict
) -> np.ndarray:
  return tokenizer.encode(encoding.text_of(record, text_feature))


def _packing_ids(data_config, tokenizer) -> dict[str, int]:
  return dict(
    max_len=data_config.max_len,
    cls_id=tokenizer.cls_id,
    sep_id=tokenizer.sep_id,
    pad_id=tokenizer.pad_id,
  )


def _mask_example(
  data_config, tokenizer, seed_prefix: tuple[int, ...], index: int, sequence: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
  # The example's own generator: its mask depends on (seed, index) only.
  rng = np.random.default_rng([*seed_prefix, index])
  masked = masking.mask_sequence(
    sequence['input_ids'],
    rng,
    is_special_V=tokenizer.is_special_V,
    regular_ids=tokenizer.regular_ids,
    mask_id=tokenizer.mask_id,
    max_predictions=data_config.max_predictions,
    mask_rate=data_config.mask_rate,
    mask_token_rate=data_config.mask_token_rate,
    random_token_rate=data_config.random_token_rate,
  )
  return {
    'input_ids': masked['input_ids'],
    'segment_ids': sequence['segment_ids'],
    'input_mask': sequence['input_mask'],
    'masked_positions': masked['masked_positions'],
    'masked_ids': masked['masked_ids'],
    'masked_weights': masked['masked_weights'],
  }

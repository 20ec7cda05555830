"""Batches of encoded examples: an endless, checkpointable train stream and padded eval batches.

Train: example arrays [N, ...] are read in a permutation per epoch (epoch e shuffled by
default_rng([seed, e])); the stream is a function of the global position g only, global batch b
is positions [b*G, (b+1)*G) and process p reads its block [b*G + p*B, b*G + (p+1)*B), as in the
pretraining pipeline (realformer_jax/data/pipeline.py), so the global batches do not depend on
the process count and the state (the next position) restores with any process count.

Eval: every example once, in order, padded with rows of weight 0 and index -1 to whole global
batches; process p gets its block of each global batch.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from realformer_jax import extras
from realformer_jax.data import EvalBatches, local_batch_size
from realformer_jax.data.errors import DataError, check_saved_state

grain = extras.require('grain')


class ExampleIterator(grain.DatasetIterator):
  """This process's share of endless shuffled global batches over `arrays` ([N, ...] each)."""

  def __init__(
    self,
    arrays: dict[str, np.ndarray],
    global_batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
  ):
    super().__init__()
    self._arrays = arrays
    self._num = len(next(iter(arrays.values())))
    if self._num == 0:
      raise DataError('no training examples')
    self._global = global_batch_size
    self._local = local_batch_size(global_batch_size, process_index, process_count)
    self._offset = process_index * self._local
    self._seed = int(seed)
    self._next_position = 0
    self._permutation: tuple[int, np.ndarray] = (-1, np.zeros(0, np.int64))

  def _rows(self, positions: np.ndarray) -> np.ndarray:
    rows = np.empty(len(positions), np.int64)
    for i, position in enumerate(positions):
      epoch = int(position) // self._num
      if self._permutation[0] != epoch:
        self._permutation = (
          epoch,
          np.random.default_rng([self._seed, epoch]).permutation(self._num),
        )
      rows[i] = self._permutation[1][int(position) % self._num]
    return rows

  def __next__(self) -> dict[str, np.ndarray]:
    start = self._next_position + self._offset
    rows = self._rows(np.arange(start, start + self._local))
    self._next_position += self._global
    return {name: values[rows] for name, values in self._arrays.items()}

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def get_state(self) -> dict[str, Any]:
    return {'next_position': self._next_position, 'seed': self._seed, 'num_examples': self._num}

  def set_state(self, state: dict[str, Any]) -> None:
    mine = {'seed': self._seed, 'num_examples': self._num}
    check_saved_state('Fine-tuning iterator state', state, mine)
    self._next_position = int(state['next_position'])

  def close(self) -> None:
    pass


def eval_batches(
  arrays: dict[str, np.ndarray],
  global_batch_size: int,
  process_index: int = 0,
  process_count: int = 1,
) -> EvalBatches:
  """This process's eval batches over all rows of `arrays`, padded with zero rows (whose
  'weights' are 0 and index arrays, named '*_index', are -1)."""
  local = local_batch_size(global_batch_size, process_index, process_count)
  num = len(next(iter(arrays.values())))
  num_batches = max(1, math.ceil(num / global_batch_size))
  share = {}
  for name, values in arrays.items():
    fill = -1 if name.endswith('_index') else 0
    padded = np.full((num_batches * global_batch_size,) + values.shape[1:], fill, values.dtype)
    padded[:num] = values
    blocks = padded.reshape((num_batches, process_count, local) + values.shape[1:])
    share[name] = blocks[:, process_index].reshape((num_batches * local,) + values.shape[1:])
  return EvalBatches(share, local)

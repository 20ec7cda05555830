"""The train iterator's position survives orbax checkpoints and worker processes."""

import numpy as np
import pytest

from data_fixtures import bible_config
from data_fixtures import bible_tokenizer  # noqa: F401  (pytest fixture)
from realformer_jax import data


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _assert_same_batches(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])


def test_orbax_composite_checkpoint_restores_the_iterator(tmp_path, bible_tokenizer):
  ocp = pytest.importorskip('orbax.checkpoint')
  import grain  # pylint: disable=g-import-not-at-top

  config = bible_config()
  iterator = data.make_train_iterator(config, 8, seed=0)
  _take(iterator, 5)
  manager = ocp.CheckpointManager(tmp_path)
  manager.save(5, args=ocp.args.Composite(
      state=ocp.args.StandardSave({'step': np.full((), 5, np.int32)}),
      data_iter=grain.checkpoint.CheckpointSave(iterator)))
  manager.wait_until_finished()
  following = _take(iterator, 3)

  fresh = data.make_train_iterator(config, 8, seed=0)
  restored = ocp.CheckpointManager(tmp_path).restore(5, args=ocp.args.Composite(
      state=ocp.args.StandardRestore({'step': np.zeros((), np.int32)}),
      data_iter=grain.checkpoint.CheckpointRestore(fresh)))
  assert restored.data_iter is fresh and restored.state['step'] == 5
  _assert_same_batches(following, _take(fresh, 3))


def test_worker_process_gives_the_in_process_batches_and_restores(bible_tokenizer):
  in_process = _take(data.make_train_iterator(bible_config(), 8, seed=4), 6)
  config = bible_config(worker_count=1)  # One worker masks the same batches in order.
  iterator = data.make_train_iterator(config, 8, seed=4)
  try:
    _assert_same_batches(_take(iterator, 3), in_process[:3])
    state = iterator.get_state()
    restored = data.make_train_iterator(config, 8, seed=4)
    try:
      restored.set_state(state)
      _assert_same_batches(_take(restored, 3), in_process[3:])
    finally:
      restored.close()
  finally:
    iterator.close()

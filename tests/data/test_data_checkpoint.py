"""The train iterator's position survives orbax checkpoints and worker processes."""

import numpy as np
import pytest
from data_fixtures import (
  assert_same_batches,
  bible_config,
  bible_tokenizer,  # noqa: F401  (pytest fixture)
  take,
)

from realformer_jax import data


def test_orbax_composite_checkpoint_restores_the_iterator(tmp_path, bible_tokenizer):
  ocp = pytest.importorskip('orbax.checkpoint')
  import grain  # pylint: disable=g-import-not-at-top

  config = bible_config()
  iterator = data.make_train_iterator(config, 8, seed=0)
  take(iterator, 5)
  manager = ocp.CheckpointManager(tmp_path)
  manager.save(
    5,
    args=ocp.args.Composite(
      state=ocp.args.StandardSave({'step': np.full((), 5, np.int32)}),
      data_iter=grain.checkpoint.CheckpointSave(iterator),
    ),
  )
  manager.wait_until_finished()
  following = take(iterator, 3)

  fresh = data.make_train_iterator(config, 8, seed=0)
  restored = ocp.CheckpointManager(tmp_path).restore(
    5,
    args=ocp.args.Composite(
      state=ocp.args.StandardRestore({'step': np.zeros((), np.int32)}),
      data_iter=grain.checkpoint.CheckpointRestore(fresh),
    ),
  )
  assert restored.data_iter is fresh and restored.state['step'] == 5
  assert_same_batches(following, take(fresh, 3))


@pytest.mark.slow
def test_worker_process_gives_the_in_process_batches_and_restores(bible_tokenizer):
  in_process = take(data.make_train_iterator(bible_config(), 8, seed=4), 6)
  config = bible_config(worker_count=1)  # One worker masks the same batches in order.
  iterator = data.make_train_iterator(config, 8, seed=4)
  try:
    assert_same_batches(take(iterator, 3), in_process[:3])
    state = iterator.get_state()
    restored = data.make_train_iterator(config, 8, seed=4)
    try:
      restored.set_state(state)
      assert_same_batches(take(restored, 3), in_process[3:])
    finally:
      restored.close()
  finally:
    iterator.close()

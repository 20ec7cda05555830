"""orbax checkpoints of (train state, dropout key, data iterator position), last K kept.

Layout of `<workdir>/checkpoints/<step>/`:
    state/  TrainState (params, optimizer state, step), written shard by shard
    rng/    the run's base PRNG key data (dropout keys are fold_in(rng, step))
    data/   the data iterator position, one JSON file per process (grain's orbax handler);
            the same on every process, so a restore may use another process count

Restoring takes an abstract target whose leaves carry shardings, so a checkpoint restores
onto any mesh and process count, and optax's state types survive.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import grain
import jax
import orbax.checkpoint as ocp

from realformer_jax import data
from realformer_jax.train.state import TrainState


class Checkpointer:
  """Saves and restores one run's checkpoints under `<workdir>/checkpoints`."""

  def __init__(self, workdir: str, keep: int):
    self.directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=('state', 'rng', 'data'))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, state: TrainState, rng_data: jax.Array, data_iterator: Any,
           step: int) -> None:
    """Saves `state` (whose step is `step`: passed in, so saving does not wait for the step
    to finish before orbax starts). Arrays are copied off the devices before this returns (the
    state may be donated right after); files are written in the background."""
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        rng=ocp.args.StandardSave({'key_data': rng_data}),
        data=grain.checkpoint.CheckpointSave(data_iterator)), force=True)

  def restore(self, step: int, abstract_state: TrainState, abstract_rng_data: Any,
              data_iterator: Any) -> tuple[TrainState, jax.Array]:
    """(state, rng key data) at `step`; `data_iterator` is moved to the saved position."""
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        rng=ocp.args.StandardRestore({'key_data': abstract_rng_data})))
    # Read directly rather than through grain's handler, whose file name holds the process
    # count: the pipeline's position is the same on every process, so this also restores a
    # checkpoint saved with a different number of processes.
    data_iterator.set_state(data.saved_train_state(os.path.join(self.directory, str(step),
                                                                'data')))
    return restored.state, restored.rng['key_data']

  def restore_state(self, step: int, abstract_state: TrainState) -> TrainState:
    """Only the train state at `step` (no data iterator or PRNG key): for loading weights."""
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state)))
    return restored.state

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


class BestCheckpoint:
  """The parameters of the best evaluation so far, by one eval metric, under `<workdir>/best`.

  Next to the latest checkpoints (which resume a run) a fine-tuning run keeps the parameters
  that scored best on its eval split: orbax keeps one checkpoint, chosen by `best_fn` over the
  metrics saved with each, and reads those metrics back from disk, so the choice survives a
  resume. The saved metrics are the eval metrics ('eval/<name>'), stored beside the params.
  """

  def __init__(self, workdir: str, metric: str, mode: str = 'max'):
    if mode not in ('max', 'min'):
      raise ValueError(f'best checkpoint mode {mode!r}: must be max or min')
    self.directory = best_directory(workdir)
    self.metric = f'eval/{metric}'
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=1, create=True, best_fn=lambda metrics: metrics[self.metric],
            best_mode=mode),
        item_names=('params',))

  def offer(self, step: int, state: TrainState, eval_metrics: dict) -> None:
    """Saves `state.params` if its `eval_metrics` beat the best so far (orbax decides and
    deletes the loser)."""
    if step in self._manager.all_steps():  # a resumed run re-evaluates a saved step
      return
    self._manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(
        state.params)), metrics={k: float(v) for k, v in eval_metrics.items()}, force=True)

  def best_step(self) -> Optional[int]:
    return self._manager.best_step()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def best_directory(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'best')


def restore_best_params(workdir: str, abstract_params: Any) -> tuple[Any, int, dict]:
  """(params, step, eval metrics) of the best checkpoint in `workdir` (BestCheckpoint), onto
  the shardings `abstract_params` carries."""
  directory = best_directory(workdir)
  manager = ocp.CheckpointManager(directory, item_names=('params',))
  try:
    steps = manager.all_steps()
    if not steps:
      raise FileNotFoundError(f'{directory}: no best checkpoint (has the run evaluated yet?)')
    step = max(steps)  # only the best is kept
    restored = manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params)))
    metrics = manager.metrics(step)
  finally:
    manager.close()
  return restored.params, step, metrics or {}

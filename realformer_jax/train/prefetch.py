"""Batches placed on the devices ahead of the step that consumes them.

A background thread takes host batches from the data iterator and turns them into global,
sharded device arrays (`build.global_batch`), `depth` batches ahead; the loop's
`next()` then only dequeues, so neither the host-side data work nor the host-to-device copy
sits between two train steps.

The data iterator runs ahead of training, so its own position is not the position to save.
Each queued batch carries the iterator state taken right after it was read, and `get_state()`
returns the state after the last batch handed out: a checkpoint resumes exactly after the last
batch trained on (`grain.checkpoint.CheckpointSave` calls `get_state`).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Optional

from jax.sharding import NamedSharding

from realformer_jax import extras
from realformer_jax.train import build

grain = extras.require('grain')

_END = object()


class DevicePrefetcher(grain.DatasetIterator):
  """Iterator of device batches from `host_iterator` (a grain DatasetIterator). A grain
  iterator itself, so grain's orbax handler checkpoints it."""

  def __init__(self, host_iterator: Any, sharding: NamedSharding, depth: int = 2):
    super().__init__()
    if depth < 1:
      raise ValueError(f'prefetch depth {depth}: must be >= 1')
    self._host = host_iterator
    self._sharding = sharding
    self._depth = depth
    self._consumed_state = host_iterator.get_state()
    self._queue: Optional[queue.Queue] = None
    self._thread: Optional[threading.Thread] = None
    self._stop = threading.Event()

  def _fill(self) -> None:
    try:
      while not self._stop.is_set():
        batch = build.global_batch(next(self._host), self._sharding)
        item = (batch, self._host.get_state())
        while not self._stop.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
    except BaseException as error:  # pylint: disable=broad-except
      # Hand the failure (or StopIteration) to the consumer instead of dying silently.
      self._queue.put((_END, error))

  def _start(self) -> None:
    self._stop.clear()
    self._queue = queue.Queue(maxsize=self._depth)
    self._thread = threading.Thread(target=self._fill, name='device-prefetch', daemon=True)
    self._thread.start()

  def __iter__(self) -> 'DevicePrefetcher':
    return self

  def __next__(self) -> dict:
    if self._thread is None:
      self._start()
    batch, state = self._queue.get()
    if batch is _END:
      self._thread = None
      raise state
    self._consumed_state = state
    return batch

  def get_state(self) -> dict:
    """The data position after the last batch returned by `next`."""
    return self._consumed_state

  def set_state(self, state: dict) -> None:
    self.close()
    self._host.set_state(state)
    self._consumed_state = self._host.get_state()

  def close(self) -> None:
    """Stops the thread and drops what it read ahead (set_state rewinds the host iterator)."""
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self._thread = None
      self._queue = None
      self._host.set_state(self._consumed_state)

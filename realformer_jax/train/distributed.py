"""Multi-process start-up and preemption (SIGTERM) notice."""

from __future__ import annotations

import signal
import threading

import jax
import ml_collections
from jax.experimental import multihost_utils


def initialize(dist: ml_collections.ConfigDict) -> None:
  """jax.distributed.initialize from the config (or the cluster environment); a no-op for one
  process. Must run before anything touches a device."""
  if jax.distributed.is_initialized():
    return
  if dist.auto_detect:
    jax.distributed.initialize()
  elif dist.num_processes > 1:
    jax.distributed.initialize(coordinator_address=dist.coordinator_address,
                               num_processes=dist.num_processes, process_id=dist.process_id)


class PreemptionWatcher:
  """Tells the loop when to save and stop.

  One process: our own SIGTERM handler sets a flag. Several: JAX's preemption service (started
  by jax.distributed.initialize) catches the signal and agrees on one step for all processes.
  """

  def __init__(self):
    self._multi_process = jax.process_count() > 1
    self._requested = False
    self._previous = None
    if not self._multi_process and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    self._requested = True

  def requested(self, step: int) -> bool:
    if self._multi_process:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._requested

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

"""Multi-process start-up and preemption (SIGTERM) notice."""

from __future__ import annotations

import contextlib
import os
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
    jax.distributed.initialize(
      coordinator_address=dist.coordinator_address,
      num_processes=dist.num_processes,
      process_id=dist.process_id,
    )


class PreemptionWatcher:
  """Tells the loop when to save and stop.

  One process: our own SIGTERM handler sets a flag, so the signal waits for the end of the
  step, which saves a checkpoint. Several: JAX's preemption service (started by
  jax.distributed.initialize) catches the signal and agrees on one step for all processes.

  After the run has saved and closed everything, `deliver` lets a deferred SIGTERM take the
  effect it would have had without the loop: the process ends (or the handler that was there
  before runs). Only inside `return_on_preemption()` (the CLIs, which then exit 0) does the run
  return {'preempted': True} instead. A library caller that got that dict back took it for a
  finished run: an experiment grid failed on its missing eval metrics, and a test failed alone
  while the rest of its pytest session went on (tests/test_train_loop.py's pipeline test, under
  a stray SIGTERM on a shared machine).
  """

  def __init__(self):
    self._multi_process = jax.process_count() > 1
    self._requested = False
    self._installed = False
    self._previous = None
    if not self._multi_process and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
      self._installed = True

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    self._requested = True

  def requested(self, step: int) -> bool:
    if self._multi_process:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._requested

  def close(self) -> None:
    """Puts the previous SIGTERM handler back."""
    if self._installed and self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    self._installed = False

  def deliver(self) -> None:
    """A SIGTERM the run deferred now takes effect (see the class docstring). Call last."""
    if not self._requested or _return_on_preemption:
      return
    self._requested = False
    if callable(self._previous):
      self._previous(signal.SIGTERM, None)
    elif self._previous == signal.SIG_DFL:
      os.kill(os.getpid(), signal.SIGTERM)  # the default action: the process ends here


_return_on_preemption = False


@contextlib.contextmanager
def return_on_preemption():
  """Within this block a run stopped by SIGTERM returns {'preempted': True} once its checkpoint
  is saved, and its caller decides what follows (the CLIs exit 0)."""
  global _return_on_preemption
  previous, _return_on_preemption = _return_on_preemption, True
  try:
    yield
  finally:
    _return_on_preemption = previous

"""How a run stops when asked: on SIGTERM (a preemption) or Ctrl-C the loop saves the step it is
on, then stops (`PreemptionWatcher`); a second Ctrl-C stops it at once (`SecondInterrupt`).
Inside `return_on_preemption()` (the CLIs) the run returns {'preempted': True, 'signal': name}
instead of letting the signal end the process, and the command exits with `exit_status` (130
after Ctrl-C, 143 after SIGTERM, as a shell reports a process the signal ended): a script's
`train && export` never goes on from a run that did not finish. Before the loop (the data being
prepared), `sigterm_unwinds()` makes SIGTERM unwind as a Ctrl-C does (`Terminated`), so the
worker processes are stopped and half-written files removed."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from typing import Any, Optional

import jax
from jax.experimental import multihost_utils


class SecondInterrupt(KeyboardInterrupt):
  """A second Ctrl-C during training: it stops the run at once, without the checkpoint the first
  one is waiting for. (A plain KeyboardInterrupt: a Ctrl-C before training started.)"""


class Terminated(KeyboardInterrupt):
  """SIGTERM inside `sigterm_unwinds()`: it unwinds what runs as a Ctrl-C would (every cleanup
  that a KeyboardInterrupt runs: the data workers stopped, temporary files removed)."""


@contextlib.contextmanager
def sigterm_unwinds():
  """Within this block (main thread only) SIGTERM raises Terminated instead of ending the process
  at once, leaving worker processes and half-written files behind; the training loop's own
  watcher takes SIGTERM over while it runs (save, then stop)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def raise_terminated(signum, frame):
    del signum, frame
    raise Terminated()

  previous = signal.signal(signal.SIGTERM, raise_terminated)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def exit_status(signal_name: str) -> int:
  """A command's exit status after `signal_name` stopped it (saved first): 128 + its number, as
  a shell reports a process the signal ended (Ctrl-C 130, SIGTERM 143), never 0."""
  return 128 + int(signal.Signals[signal_name])


class PreemptionWatcher:
  """Tells the loop when to save and stop: on SIGTERM (a preemption) or Ctrl-C (SIGINT).

  One process: our own handlers set a flag, so the signal waits for the end of the step,
  which saves a checkpoint. A second Ctrl-C does not wait: it raises SecondInterrupt at once
  (nothing is saved; the CLIs print one line). Several processes: JAX's preemption service
  (started by jax.distributed.initialize) catches SIGTERM and agrees on one step for all
  processes; Ctrl-C keeps its usual effect there.

  After the run has saved and closed everything, `deliver` lets a deferred signal take the
  effect it would have had without the loop: the process ends, or KeyboardInterrupt is raised
  (or the handler that was there before runs). Only inside `return_on_preemption()` (the CLIs,
  which then exit with `exit_status`) does the run return {'preempted': True} instead. A
  library caller that got that dict back took it for a finished run: an experiment grid failed
  on its missing eval metrics, and a test failed alone while the rest of its pytest session
  went on (tests/train/test_train_loop.py's pipeline test, under a stray SIGTERM on a shared
  machine).
  """

  _SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self._multi_process = jax.process_count() > 1
    self.signal: Optional[signal.Signals] = None  # the signal that asked to stop, if any
    self._previous: dict[int, Any] = {}  # the handlers before ours, put back by close
    self._installed = False
    self._announcer: Optional[_Announcer] = None
    self._interrupts = 0  # Ctrl-Cs so far
    if not self._multi_process and threading.current_thread() is threading.main_thread():
      self._previous = {sig: signal.signal(sig, self._on_signal) for sig in self._SIGNALS}
      self._installed = True
      self._announcer = _Announcer()

  def _on_signal(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT:
      # Python runs this handler once for signals that arrived before it could run (a second
      # Ctrl-C pressed while the main thread is busy), so count Ctrl-Cs as the announcer does,
      # by the bytes the C-level handler wrote: one per signal, none lost (CI lost the second).
      counted = self._announcer.interrupts() if self._announcer is not None else None
      before = self._interrupts
      self._interrupts = max(before, counted) if counted else before + 1
      if before >= 2:
        return  # the second Ctrl-C was raised already; the run is stopping
      if self._interrupts >= 2:
        self.signal = None  # a second Ctrl-C: nothing deferred is left to deliver
        raise SecondInterrupt
    self.signal = self.signal or signal.Signals(signum)

  @property
  def signal_name(self) -> str:
    return self.signal.name if self.signal is not None else 'SIGTERM'  # multi-process: JAX's

  def requested(self, step: int) -> bool:
    if self._multi_process:
      return multihost_utils.reached_preemption_sync_point(step)
    return self.signal is not None

  def close(self) -> None:
    """Puts the previous handlers back."""
    if self._announcer is not None:
      self._announcer.close()
      self._announcer = None
    if self._installed:
      for sig, previous in self._previous.items():
        if previous is not None:
          signal.signal(sig, previous)
    self._installed = False

  def deliver(self) -> None:
    """A signal the run deferred now takes effect (see the class docstring). Call last."""
    sig, self.signal = self.signal, None
    if sig is None or _return_on_preemption:
      return
    previous = self._previous.get(sig)
    if callable(previous):
      previous(sig, None)  # Python's own SIGINT handler raises KeyboardInterrupt here
    elif previous == signal.SIG_DFL:
      os.kill(os.getpid(), sig)  # the default action: the process ends here


class _Announcer:
  """Says at once what a SIGTERM or the first Ctrl-C does, and counts the Ctrl-Cs. Python runs a
  signal's handler only between bytecodes, so during a step or a compile (native code: seconds to
  minutes) the handler above waits, and a Ctrl-C looked ignored; two that arrive while it waits
  run it once. The C-level handler writes each signal's number to the wakeup fd
  (signal.set_wakeup_fd) at once, though: a thread reading it prints the line, and the count
  of bytes read is the count of Ctrl-Cs.

  The bytes are read and counted under one lock, by the thread or by `interrupts()` (the
  handler's call, which drains what the thread has not read yet), so the handler never misses
  a byte the thread took but had not counted."""

  def __init__(self):
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)
    os.set_blocking(self._read, False)
    self._lock = threading.RLock()  # re-entrant: a handler may run inside a handler's drain
    self._interrupts = 0
    try:
      self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter: nothing to announce
      os.close(self._read)
      os.close(self._write)
      self._read = self._write = None
      return
    self._thread = threading.Thread(target=self._announce, name='signal-announcer', daemon=True)
    self._thread.start()

  def interrupts(self) -> Optional[int]:
    """The Ctrl-Cs so far, counting every byte written until now (None: not counting)."""
    if self._read is None:
      return None
    self._drain()
    return self._interrupts

  def _announce(self) -> None:
    read = self._read
    while True:
      try:
        select.select([read], [], [])
      except (OSError, ValueError):  # closed under us (close() gave up waiting)
        return
      if not self._drain():
        return  # EOF: close() closed the write end

  def _drain(self) -> bool:
    """Reads and counts what is in the pipe; False at EOF or once the pipe is closed."""
    with self._lock:
      while True:
        try:
          data = os.read(self._read, 64)
        except BlockingIOError:
          return True
        except (OSError, TypeError):  # closed under us (close() ran): nothing more to count
          return False
        if not data:
          return False
        for signum in data:
          if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts == 1:
              _say(
                'Ctrl-C: stopping after the step in progress (a first step may still be '
                'compiling), once its checkpoint is saved; Ctrl-C again stops at once without '
                'saving'
              )
          elif signum == signal.SIGTERM:
            _say('SIGTERM: stopping after the step in progress, once its checkpoint is saved')

  def close(self) -> None:
    if self._write is None:
      return
    signal.set_wakeup_fd(self._previous_fd)
    os.close(self._write)  # the thread reads EOF and ends
    self._thread.join(timeout=5)
    with self._lock:
      os.close(self._read)
      self._read = self._write = None


def _say(line: str) -> None:
  if jax.process_index() == 0:
    print(line, flush=True)  # stdout, as the line that the checkpoint was saved


_return_on_preemption = False


@contextlib.contextmanager
def return_on_preemption():
  """Within this block a run stopped by SIGTERM or Ctrl-C returns {'preempted': True, 'signal':
  its name} once its checkpoint is saved, and its caller decides what follows (the CLIs exit
  with `exit_status`)."""
  global _return_on_preemption
  previous, _return_on_preemption = _return_on_preemption, True
  try:
    yield
  finally:
    _return_on_preemption = previous

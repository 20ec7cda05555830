"""PreemptionWatcher counts every Ctrl-C, even two that arrive while the main thread is in native
code: Python then runs the handler once for both, and the second Ctrl-C was lost (CI: a run
asked twice during a slow evaluation saved a checkpoint and exited 0 instead of stopping)."""

import hashlib
import os
import signal
import threading
import time

import pytest

from realformer_jax.train import preemption


def _native_call_of_about_a_second():
  """One C call that checks no Python signal handler while it runs."""
  hashlib.pbkdf2_hmac('sha256', b'x', b'salt', 2_000_000)


def _send_sigints(count: int, gap_s: float) -> threading.Thread:
  def send():
    for _ in range(count):
      time.sleep(gap_s)
      os.kill(os.getpid(), signal.SIGINT)

  thread = threading.Thread(target=send)
  thread.start()
  return thread


def test_two_ctrl_cs_during_native_code_stop_at_once(capsys):
  watcher = preemption.PreemptionWatcher()
  try:
    sender = _send_sigints(2, gap_s=0.05)
    with pytest.raises(preemption.SecondInterrupt):
      _native_call_of_about_a_second()  # both signals land here; the handler runs after it
      for _ in range(100):  # bytecodes, in case the sender was late (a loaded machine)
        time.sleep(0.05)
    sender.join()
  finally:
    watcher.close()
  assert watcher.signal is None  # nothing deferred is left to deliver
  out = capsys.readouterr().out
  assert out.count('Ctrl-C: stopping after the step in progress') == 1, out


def test_one_ctrl_c_waits_for_the_step(capsys):
  watcher = preemption.PreemptionWatcher()
  try:
    _send_sigints(1, gap_s=0.05).join()
    for _ in range(100):
      if watcher.requested(step=1):
        break
      time.sleep(0.01)
    assert watcher.signal == signal.SIGINT
  finally:
    watcher.close()
  assert 'Ctrl-C: stopping after the step in progress' in capsys.readouterr().out

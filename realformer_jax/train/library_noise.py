"""Keeps a failed run's stderr down to its one `error:` line (used by the experiments/ CLIs).

Every checkpoint failure is reported by checkpointing.py as one CheckpointError line naming the
step, the directory and what to do. Underneath, orbax reports the same failure itself: each
writer thread logs it at ERROR level with a traceback (460 lines for one full disk, measured),
and TensorStore prints `RuntimeError: Event loop is closed` tracebacks when the writes still in
flight complete after orbax has closed the failed save's event loop. `quiet()` drops exactly
those: orbax's log records at ERROR and above, and that one RuntimeError. Everything else
(orbax's warnings, other libraries, our own errors) is untouched, and the CLIs skip this when
--verbosity is given, to see all of it.
"""

from __future__ import annotations

import logging
import os
import sys

_ORBAX_PATH = os.sep + 'orbax' + os.sep


def quiet() -> None:
  logging.getLogger('absl').addFilter(_drop_orbax_errors)
  previous = sys.unraisablehook

  def unraisablehook(unraisable):
    # TensorStore reports an exception raised in its callback as unraisable.
    if not _is_closed_loop_error(unraisable.exc_type, unraisable.exc_value):
      previous(unraisable)

  sys.unraisablehook = unraisablehook


def _drop_orbax_errors(record: logging.LogRecord) -> bool:
  return not (record.levelno >= logging.ERROR and _ORBAX_PATH in (record.pathname or ''))


def _is_closed_loop_error(exc_type, exc_value) -> bool:
  """A late TensorStore callback of a save that already failed (see above)."""
  return exc_type is RuntimeError and str(exc_value) == 'Event loop is closed'

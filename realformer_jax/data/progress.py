"""One plain progress line every few seconds while a preparation phase runs.

    prepare reading: 120.5 MB of files / 1,000.0 MB (12%), 14.2 MB/s, 52,000 documents, ETA 62 s
    prepare encoding+packing: 300.0 MB of text / 1,000.0 MB (30%), 16.0 MB/s, 150,000
        documents, 70,000,000 tokens, ETA 44 s        (one line)

The reading phase counts the files' bytes as stored (a .gz / .zst file's compressed bytes:
'MB of compressed files'), the encoding phase the documents' UTF-8 text: each line says which.

Preparation's lines (progress, and the notes `say` prints) go to stderr as they are, one line
each: never carriage returns or escape codes, so a log file or a pipe reads as well as a
terminal, and never in absl's log format (`W1128 12:41:46.1 ... progress.py:87]`), which made
them read as warnings. They are records of the logger 'realformer_jax.data.prepare' (WARNING),
which prints them with a handler of its own and does not pass them on to the root logger:
silence them with `logging.getLogger('realformer_jax.data.prepare').setLevel(logging.ERROR)`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Callable, Optional


class _PlainLines(logging.Handler):
  """Writes each record's message as one line to the current sys.stderr (looked up at each
  line, so a redirected or captured stderr gets them)."""

  def emit(self, record: logging.LogRecord) -> None:
    try:
      sys.stderr.write(record.getMessage() + '\n')
      sys.stderr.flush()
    except Exception:  # pylint: disable=broad-except
      self.handleError(record)


_log = logging.getLogger('realformer_jax.data.prepare')
_log.addHandler(_PlainLines())
_log.propagate = False
# Seconds between two progress lines of one phase.
PROGRESS_SECONDS = 5.0


def say(line: str) -> None:
  """One plain line of preparation (a note, a summary), as the progress lines are printed."""
  _log.warning('%s', line)


class Progress:
  """Counts bytes, documents and tokens of one phase; logs a line at most every
  PROGRESS_SECONDS, also while no count moves (one job of a huge document takes long), and
  never for a phase shorter than that. Used as a context manager: the lines stop with it.
  `unit` names what the bytes are ('files' as stored, 'compressed files'; 'text': the
  documents' UTF-8)."""

  def __init__(
    self, phase: str, unit: str, total_bytes: Optional[int] = None, total_documents: int = 0
  ):
    self.phase, self.unit = phase, unit
    self.total_bytes = total_bytes
    self.total_documents = total_documents
    self.start = self.last = time.monotonic()
    self.bytes = self.documents = self.tokens = 0
    self._lock, self._stop = threading.Lock(), threading.Event()
    self._beat = threading.Thread(target=self._heartbeat, name=f'{phase} progress', daemon=True)

  def __enter__(self) -> 'Progress':
    self._beat.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._beat.join()

  def _heartbeat(self) -> None:
    while not self._stop.wait(max(PROGRESS_SECONDS, 0.1)):
      self._maybe_log()

  def update(self, num_bytes: int = 0, documents: int = 0, tokens: int = 0) -> None:
    self.bytes += num_bytes
    self.documents += documents
    self.tokens += tokens
    self._maybe_log()

  def _maybe_log(self) -> None:
    with self._lock:
      if time.monotonic() - self.last >= PROGRESS_SECONDS and not self._stop.is_set():
        self.last = time.monotonic()
        _log.warning('prepare %s: %s', self.phase, self._line(eta=True))

  def done(self, what: str = '') -> float:
    """Logs the phase's summary line (the last: no progress line follows); returns its
    seconds."""
    self._stop.set()
    with self._lock:
      seconds = time.monotonic() - self.start
      _log.warning('prepare %s: done, %s in %.1f s%s', self.phase, self._line(), seconds, what)
    return seconds

  def _line(self, eta: bool = False) -> str:
    seconds = max(time.monotonic() - self.start, 1e-9)
    parts = [f'{self.bytes / 1e6:,.1f} MB of {self.unit}']
    if self.total_bytes and eta:
      parts[0] += (
        f' / {self.total_bytes / 1e6:,.1f} MB ({100 * self.bytes / self.total_bytes:.0f}%)'
      )
    parts.append(f'{self.bytes / 1e6 / seconds:.1f} MB/s')
    parts.append(f'{self.documents:,} documents')
    if self.tokens:
      parts.append(f'{self.tokens:,} tokens')
    if eta:
      left = self._fraction_left()
      if left is not None:
        done = 1 - left
        parts.append(f'ETA {seconds * left / done:.0f} s' if done > 0 else 'ETA ?')
    return ', '.join(parts)

  def _fraction_left(self) -> Optional[float]:
    if self.total_bytes:
      return max(0.0, 1 - self.bytes / self.total_bytes)
    if self.total_documents:
      return max(0.0, 1 - self.documents / self.total_documents)
    return None


def wait_for(call: Callable, message: Callable[[], str], interrupted: str):
  """`call()`, run in a thread while this one waits, logging `message()` every PROGRESS_SECONDS.

  For one long call into C++ that reports nothing and that Python cannot interrupt (the
  tokenizer's trainer): run in this thread, a Ctrl-C would wait for it to end (26 s of silence,
  measured); waiting here, a Ctrl-C prints `interrupted` at once and raises KeyboardInterrupt,
  and the abandoned call ends with the process (its thread is a daemon). An exception of the
  call is raised here."""
  outcome = {}

  def run():
    try:
      outcome['value'] = call()
    except BaseException as e:  # pylint: disable=broad-except
      outcome['error'] = e

  thread = threading.Thread(target=run, name='preparation call', daemon=True)
  thread.start()
  try:
    while thread.join(max(PROGRESS_SECONDS, 0.1)) or thread.is_alive():
      _log.warning('%s', message())
  except KeyboardInterrupt:
    say(interrupted)
    raise
  if 'error' in outcome:
    raise outcome['error']
  return outcome['value']

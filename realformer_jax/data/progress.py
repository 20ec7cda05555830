"""One plain progress line every few seconds while a preparation phase runs.

    prepare reading: 120.5 MB / 1,000.0 MB (12%), 14.2 MB/s, 52,000 documents, ETA 62 s
    prepare encoding+packing: 300.0 MB / 1,000.0 MB (30%), 16.0 MB/s, 150,000 documents,
        70,000,000 tokens, ETA 44 s        (one line)

Plain lines through `logging` (WARNING, so they show under the scripts' default verbosity),
never carriage returns or escape codes, so a log file or a pipe reads as well as a terminal.
Every phase ends with one summary line (`done`): its totals, seconds and MB/s.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

_log = logging.getLogger('realformer_jax.data.prepare')
# Seconds between two progress lines of one phase.
PROGRESS_SECONDS = 5.0


class Progress:
  """Counts bytes, documents and tokens of one phase; logs a line at most every
  PROGRESS_SECONDS (and never for a phase shorter than that)."""

  def __init__(self, phase: str, total_bytes: Optional[int] = None, total_documents: int = 0):
    self.phase = phase
    self.total_bytes = total_bytes
    self.total_documents = total_documents
    self.start = self.last = time.monotonic()
    self.bytes = self.documents = self.tokens = 0

  def update(self, num_bytes: int = 0, documents: int = 0, tokens: int = 0) -> None:
    self.bytes += num_bytes
    self.documents += documents
    self.tokens += tokens
    if time.monotonic() - self.last >= PROGRESS_SECONDS:
      self.last = time.monotonic()
      _log.warning('prepare %s: %s', self.phase, self._line(eta=True))

  def done(self, what: str = '') -> float:
    """Logs the phase's summary line; returns its seconds."""
    seconds = time.monotonic() - self.start
    _log.warning('prepare %s: done, %s in %.1f s%s', self.phase, self._line(), seconds, what)
    return seconds

  def _line(self, eta: bool = False) -> str:
    seconds = max(time.monotonic() - self.start, 1e-9)
    parts = [f'{self.bytes / 1e6:,.1f} MB']
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


class Ticker:
  """Logs `message()` every PROGRESS_SECONDS from a thread while a long call runs (the
  tokenizer's trainer is one C++ call that releases the GIL but reports nothing)."""

  def __init__(self, message):
    import threading  # pylint: disable=import-outside-toplevel

    self._message = message
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self):
    while not self._stop.wait(PROGRESS_SECONDS):
      _log.warning('%s', self._message())

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()

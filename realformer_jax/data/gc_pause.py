"""The cyclic garbage collector paused while preparation builds its per-file tables.

Reading a corpus of many files builds tables with an entry per file (fingerprints, chunks, the
manifest) in the preparing process; each full collection traverses all of them, and the
allocations of the per-file work trigger collections again and again. Preparation's tables
hold no reference cycles that need the collector (they are freed by reference counting), so
it is paused for the reading phase and resumes after it, as it was; the same in the workers'
jobs of that phase (`while_running`). On 100,000 files in one process (2026-12-07), perf put
~16% of the CPU of the listing, checks, reading and assembly in the collector; with it paused
(and text_files' format questions remembered) they took 4.22 instead of 5.15 CPU s.
"""

import contextlib
import functools
import gc


@contextlib.contextmanager
def paused():
  """No cyclic collection inside; the collector as it was after (also on an error)."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()


def while_running(fn):
  """`fn` run with the collector paused (a worker's job: the pool pickles it by its name)."""

  @functools.wraps(fn)
  def run(*args, **kwargs):
    with paused():
      return fn(*args, **kwargs)

  return run

"""Preparation's worker processes: jobs run `workers` at a time, results come back in job order.

`ordered_results(fn, jobs, workers)` yields fn(job) for every job in order. With one worker (or
one job) it runs in this process; otherwise in a pool of spawned processes (never forked: the
parent may run JAX threads), kept for the life of the process so the reading and the encoding
phase pay the start-up (imports) once. A spawned worker does not import the parent's `__main__`
(multiprocessing would: a main such as experiments.prepare_data imports jax, 2-3 CPU s
per worker, measured) unless the first job refers to something defined there. At most
`2 * workers` jobs are in flight, so results waiting to be consumed stay bounded whatever the
corpus size. An exception in a job (a DataError naming a file) is raised here, in the parent,
unchanged.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import multiprocessing
import os
import pickle
import sys
import types
from typing import Callable, Iterable, Iterator, Optional, TypeVar

Job = TypeVar('Job')
_POOLS: dict = {}
# Work below which one more worker does not pay for its start-up (a spawned process imports
# the package: seconds on a loaded machine), when the number of workers is left to us.
MIN_BYTES_PER_WORKER = 32 << 20


def choose(requested: Optional[int], work_bytes: int) -> int:
  """Processes for `work_bytes` of text: `requested` as given; None: every core, but no more
  than one per MIN_BYTES_PER_WORKER (a test-sized corpus stays in this process)."""
  if requested is not None:
    return max(1, requested)
  return max(1, min(os.cpu_count() or 1, work_bytes // MIN_BYTES_PER_WORKER))


def ordered_results(fn: Callable, jobs: Iterable[Job], workers: int) -> Iterator:
  jobs = list(jobs)
  if workers <= 1 or len(jobs) <= 1:
    for job in jobs:
      yield fn(job)
    return
  pool_needs_main = _refers_to_main(jobs[0])
  pool = _pool(workers, pool_needs_main)
  pending = collections.deque()
  try:
    for job in jobs:
      pending.append(pool.apply_async(fn, (job,)))
      if len(pending) >= 2 * workers:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()
  except GeneratorExit:
    # The consumer stopped early (zip() over the jobs stops at the last result without asking
    # for the end): a pool with nothing in flight is kept for the next phase, whose workers
    # then skip their start-up (a spawn and the imports: ~0.3 CPU s each, measured).
    if pending:
      _close((workers, pool_needs_main), terminate=True)
    raise
  except BaseException:
    # A failed or interrupted preparation: drop this pool (its workers may be mid-job).
    _close((workers, pool_needs_main), terminate=True)
    raise


def _refers_to_main(job) -> bool:
  """Whether unpickling `job` needs the parent's `__main__` (a function or class defined in the
  user's script; a pickle names a global's module as text, so text that merely contains the
  word errs on the safe side)."""
  return b'__main__' in pickle.dumps(job)


def _pool(workers: int, needs_main: bool = False):
  key = (workers, needs_main)
  if key not in _POOLS:
    with contextlib.nullcontext() if needs_main else _main_hidden():
      _POOLS[key] = multiprocessing.get_context('spawn').Pool(workers)
  return _POOLS[key]


@contextlib.contextmanager
def _main_hidden():
  """While the pool starts its processes, `__main__` is a bare module: spawn then sends no main
  module for the children to import (they need only the job's own modules)."""
  main = sys.modules['__main__']
  sys.modules['__main__'] = types.ModuleType('__main__')
  try:
    yield
  finally:
    sys.modules['__main__'] = main


def _close(key, terminate: bool = False) -> None:
  pool = _POOLS.pop(key, None)
  if pool is not None:
    if terminate:
      pool.terminate()
    else:
      pool.close()
    pool.join()


@atexit.register
def close_all() -> None:
  """Ends the worker processes (at exit; tests call it to measure a fresh start)."""
  for key in list(_POOLS):
    _close(key, terminate=True)

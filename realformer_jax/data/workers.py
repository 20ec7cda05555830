"""Preparation's worker processes: jobs run `workers` at a time, results come back in job order.

`ordered_results(fn, jobs, workers)` yields fn(job) for every job in order. With one worker (or
one job) it runs in this process; otherwise in a pool of spawned processes (never forked: the
parent may run JAX threads), kept for the life of the process so the reading and the encoding
phase pay the start-up (imports) once. At most `2 * workers` jobs are in flight, so results
waiting to be consumed stay bounded whatever the corpus size. An exception in a job (a
DataError naming a file) is raised here, in the parent, unchanged.
"""

from __future__ import annotations

import atexit
import collections
import multiprocessing
import os
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
  pool = _pool(workers)
  pending = collections.deque()
  try:
    for job in jobs:
      pending.append(pool.apply_async(fn, (job,)))
      if len(pending) >= 2 * workers:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()
  except BaseException:
    # A failed or interrupted preparation: drop this pool (its workers may be mid-job).
    _close(workers, terminate=True)
    raise


def _pool(workers: int):
  if workers not in _POOLS:
    _POOLS[workers] = multiprocessing.get_context('spawn').Pool(workers)
  return _POOLS[workers]


def _close(workers: int, terminate: bool = False) -> None:
  pool = _POOLS.pop(workers, None)
  if pool is not None:
    if terminate:
      pool.terminate()
    else:
      pool.close()
    pool.join()


@atexit.register
def close_all() -> None:
  """Ends the worker processes (at exit; tests call it to measure a fresh start)."""
  for workers in list(_POOLS):
    _close(workers, terminate=True)

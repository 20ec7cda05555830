"""The test session's persistent JAX compilation cache, for subprocesses that compile the same
tiny CPU programs again and again (the training CLI of the fault, scale-out and documented-command
tests): a run that finds its programs there skips most of its compile time.

conftest.py makes the directory once per session, before pytest-xdist starts its workers, so the
subprocesses of every worker share it (`session_dir`). It is opt-in (`env`), not exported to every
process: a deviceless compile for a GPU or TPU (experiments.compile, the AOT benchmarks) writes an
entry that JAX 0.10.2 cannot read back ('PjRtCompiler must be constructed with a Client': a
warning on stderr, then it compiles again), and the suite's own processes compile as before, so
what a test measures of a compile in-process is a compile.

The key is the optimized program (source locations aside), the backend and the compile options,
so a cached executable is the one a compile would give; its memory and cost analyses are the
same. A size limit turns on JAX's file lock: two processes never read a half-written entry.
"""

import atexit
import functools
import os
import shutil
import tempfile

VARIABLE = 'REALFORMER_TEST_JIT_CACHE'


@functools.cache
def session_dir() -> str:
  """The directory, made by the first process that asks (conftest.py, in pytest's main process)
  and inherited by the processes it starts through VARIABLE; removed when that process exits."""
  if VARIABLE not in os.environ:
    os.environ[VARIABLE] = tempfile.mkdtemp(prefix='realformer_test_jit_cache_')
    atexit.register(shutil.rmtree, os.environ[VARIABLE], ignore_errors=True)
  return os.environ[VARIABLE]


def env() -> dict[str, str]:
  """The variables that point a subprocess's JAX at the session's cache, for every program."""
  return {
    'JAX_COMPILATION_CACHE_DIR': session_dir(),
    'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',  # tiny programs compile in under 1 s
    'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0',
    'JAX_COMPILATION_CACHE_MAX_SIZE': str(8 << 30),  # > 0: eviction, and with it the file lock
  }

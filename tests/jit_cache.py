"""The test session's persistent JAX compilation cache, for subprocesses that compile the same
tiny CPU programs again and again (the training CLI of the fault, scale-out and documented-command
tests): a run that finds its programs there skips most of its compile time.

conftest.py makes the directory once per session, before pytest-xdist starts its workers, so the
subprocesses of every worker share it (`session_dir`). It is opt-in (`env`), not exported to every
process: a deviceless compile for a GPU or TPU (experiments.compile, the AOT benchmarks) writes an
entry that JAX 0.10.2 cannot read back ('PjRtCompiler must be constructed with a Client': a
warning on stderr, then it compiles again), and the suite's own processes compile as before, so
what a test measures of a compile in-process is a compile. The exception, `in_process`: a test
whose in-process study trains the same CPU programs run after run (one per seed) and measures no
compile (the --quick runs of experiments.study's plans, finetune_compare and
length_extrapolation; train_fixtures.shared_compiles, for the modules whose in-process runs train
tiny_config's programs again).

The key is the optimized program (source locations aside), the backend and the compile options,
so a cached executable is the one a compile would give; its memory and cost analyses are the
same. A size limit turns on JAX's file lock: two processes never read a half-written entry.
"""

import atexit
import contextlib
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


def settings() -> dict[str, object]:
  """JAX's options (jax.config names) that point it at the session's cache, for every program."""
  return {
    'jax_compilation_cache_dir': session_dir(),
    'jax_persistent_cache_min_compile_time_secs': 0.0,  # tiny programs compile in under 1 s
    'jax_persistent_cache_min_entry_size_bytes': 0,
    'jax_compilation_cache_max_size': 8 << 30,  # > 0: eviction, and with it the file lock
  }


def env() -> dict[str, str]:
  """`settings` as the environment variables of a subprocess's JAX."""
  return {name.upper(): str(value) for name, value in settings().items()}


@contextlib.contextmanager
def in_process():
  """The session's cache for this process's own compiles while the block runs (`settings`,
  through jax.config), then the settings as they were. JAX reads them once, at its first
  compile: `reset_cache` makes it read them again on entry and on exit. Imported here, not at
  the top: the scripts that only need `env` start no JAX."""
  # pylint: disable=import-outside-toplevel
  import jax
  from jax.experimental.compilation_cache import compilation_cache

  before = {name: getattr(jax.config, name) for name in settings()}
  for name, value in settings().items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()

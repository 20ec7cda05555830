"""Test-wide JAX settings.

* jax_disable_most_optimizations: CI has 2 cores, and compile time dominates these tiny models.
  XLA:CPU's cheaper fusion emitters (compile_settings.py), for this process and, through
  XLA_FLAGS, for every subprocess a test starts.
* Matmul precision 'highest': the numerics tests compare against float32 / float64 references
  (NumPy, Hugging Face, hand computations) at float32 tolerances, so every matmul in the suite
  is full float32. That is already so on CPU; GPUs default to TF32 (10-bit mantissa, ~1e-3
  relative error) and TPUs to bfloat16 passes. A test about lower precision sets its own with
  `jax.default_matmul_precision(...)`. Subprocess runs (the CLI tests) compare runs with each
  other on the same backend, not with references.
* The session's compilation cache for subprocesses (jit_cache.py) is made here, in pytest's main
  process, so that the pytest-xdist workers (addopts in pyproject.toml) share it.
"""

import compile_settings

compile_settings.export()  # before JAX reads XLA_FLAGS

import jax  # noqa: E402
import jit_cache  # noqa: E402

jax.config.update('jax_disable_most_optimizations', True)
jax.config.update('jax_default_matmul_precision', 'highest')
jit_cache.session_dir()

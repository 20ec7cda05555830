"""An exclusive file lock, so processes preparing the same cache entry take turns.

Two training processes (or a test run beside a training run) may prepare the same dataset or
tokenizer at once. The first to take the lock does the work; the others wait, then find the
finished result. Writers still publish with an atomic rename (realformer_jax/atomic_files.py),
so a reader that does not take the lock never sees a half-written file. fcntl locks work on
local disks and NFS; on object stores (gs://) prepare once from a single process instead.
"""

import contextlib
import fcntl
import os
import re


@contextlib.contextmanager
def exclusive_lock(directory: str, name: str):
  """Holds `<directory>/.locks/<name>.lock` exclusively for the duration of the block."""
  lock_dir = os.path.join(directory, '.locks')
  os.makedirs(lock_dir, exist_ok=True)
  safe_name = re.sub(r'[^A-Za-z0-9_.-]', '_', name)
  with open(os.path.join(lock_dir, safe_name + '.lock'), 'w') as lock_file:
    fcntl.flock(lock_file, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock_file, fcntl.LOCK_UN)

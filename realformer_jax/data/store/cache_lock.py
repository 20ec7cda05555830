"""An exclusive file lock, so processes preparing the same cache entry take turns.

Two training processes (or a test run beside a training run) may prepare the same dataset or
tokenizer at once. The first to take the lock does the work; the others wait, then find the
finished result. Writers still publish with an atomic rename, so a reader that does not take
the lock never sees a half-written file. fcntl locks work on local disks and NFS; on object
stores (gs://) prepare once from a single process instead.
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


def atomic_write(path: str, data: bytes) -> bool:
  """Writes `path` through a temporary file and a rename: readers see all of it or nothing.
  A file that already holds `data` is left alone (a restart on a full disk rewrites nothing),
  and a write that fails (ENOSPC...) removes its temporary file before it raises. Returns
  whether it wrote."""
  if _holds(path, data):
    return False
  tmp_path = f'{path}.tmp.{os.getpid()}'
  try:
    with open(tmp_path, 'wb') as f:
      f.write(data)
    os.replace(tmp_path, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp_path)
    raise
  return True


def _holds(path: str, data: bytes) -> bool:
  try:
    if os.path.getsize(path) != len(data):
      return False
    with open(path, 'rb') as f:
      return f.read() == data
  except OSError:
    return False

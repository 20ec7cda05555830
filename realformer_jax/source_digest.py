"""A digest of Python source folders: the identity of the code a stored result was computed
with (the kernel check's cached verdicts, the rows of the deviceless benchmark tables), so that
a result of other code is recognised as such instead of being mixed in."""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Sequence


@functools.lru_cache(maxsize=None)
def folder_digest(top: str) -> str:
  """sha256 over every .py file below `top`: its path relative to `top` and its bytes."""
  digest = hashlib.sha256()
  for folder, _, names in sorted(os.walk(top)):
    for name in sorted(names):
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        with open(path, 'rb') as f:
          digest.update(os.path.relpath(path, top).encode() + b'\0' + f.read())
  return digest.hexdigest()


def source_digest(folders: Sequence[str]) -> str:
  """16 hex digits over the folders' digests, in the order given."""
  parts = '\n'.join(folder_digest(os.path.abspath(folder)) for folder in folders)
  return hashlib.sha256(parts.encode()).hexdigest()[:16]

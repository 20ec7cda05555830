"""What the kernel checks remember between runs, in one place below both of them: the cache
folder ($REALFORMER_JAX_CACHE, default ~/.cache/realformer_jax), its JSON files of entries
(kernel_check.py's run-time verdicts, device_checks.py's passed device checks) and the hash of
the kernel source every entry is keyed by. Both checks point down here, never at each other.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Optional

from realformer_jax import atomic_files
from realformer_jax.kernels import backends
from realformer_jax.source_digest import source_digest


def path(file_name: str) -> str:
  folder = os.environ.get('REALFORMER_JAX_CACHE') or os.path.join(
    os.path.expanduser('~'), '.cache', 'realformer_jax'
  )
  return os.path.join(folder, file_name)


def load(file_name: str) -> dict:
  """The entries of `file_name` in the cache folder; {} when it is missing or unreadable."""
  try:
    with open(path(file_name)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def save(file_name: str, entries: dict) -> bool:
  """Best effort: a read-only home only costs the next run its check. Returns whether the
  entries are on disk."""
  target = path(file_name)
  try:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    atomic_files.write_json(target, entries, indent=1)
  except OSError:
    return False
  return True


def kernel_source_hash(attention_impl: Optional[str] = None) -> str:
  """Hash of the code a kernel's numbers depend on: kernels/ (every built-in backend's folder
  included) and model/, and the folder of the backend `attention_impl` names where that is
  elsewhere (a backend package of your own: docs/extending.md)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  folders = [os.path.join(root, package) for package in ('kernels', 'model')]
  backend = backends.for_impl(attention_impl) if attention_impl else None
  if backend is not None:
    spec = importlib.util.find_spec(backend.attention)
    own = os.path.dirname(spec.origin) if spec and spec.origin else None
    if own and os.path.commonpath([own, folders[0]]) != folders[0]:
      folders.append(own)
  return source_digest(folders)

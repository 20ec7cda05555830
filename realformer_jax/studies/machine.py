"""The machine and software a measurement or a training run came from, recorded beside its
figures: the CPU model and its vector extensions, the core count, the versions of the numerical
stack, the load when it started. Two runs of one recipe that disagree are first compared here
(a study's runs trained on different days may have run on different CPUs)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform

import jax

# Packages whose version can change a number a run or a benchmark reports.
PACKAGES = ('flax', 'optax', 'numpy', 'jaxlib', 'sentencepiece', 'grain', 'transformers')


def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return ''


def machine_info() -> dict:
  """This machine and its software, as a flat JSON-ready dict."""
  cpu, simd = platform.processor(), ''
  cpuinfo = _read('/proc/cpuinfo').splitlines()
  for line in cpuinfo:
    if line.startswith('model name'):
      cpu = line.split(':', 1)[1].strip()
      break
  for line in cpuinfo:
    if line.startswith('flags'):
      flags = set(line.split(':', 1)[1].split())
      simd = '+'.join(f for f in ('avx2', 'fma', 'avx512f') if f in flags)
      break
  info = {
    'date': datetime.datetime.now().isoformat(timespec='seconds'),
    'cpu': cpu,
    'simd': simd,
    'cores': os.cpu_count(),
    'jax': jax.__version__,
    'backend': jax.default_backend(),
    'python': platform.python_version(),
    'libc': ' '.join(platform.libc_ver()),
    'load_avg_start': os.getloadavg(),
    'glibc_tunables': os.environ.get('GLIBC_TUNABLES', ''),
    'transparent_hugepage': _read('/sys/kernel/mm/transparent_hugepage/enabled'),
  }
  for package in PACKAGES:  # read from the metadata: importing transformers takes seconds
    try:
      info[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  return info

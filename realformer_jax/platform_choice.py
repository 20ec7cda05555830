"""The choice of JAX platform on a machine with accelerator plugins but no accelerator.

With a GPU or TPU plugin installed (the `aot` extra does it: jax-cuda13-plugin and libtpu), a
JAX process that finds no such device still initialises the plugins first: the CUDA plugin
logs a 20-line `RuntimeError: cuDNN not found` traceback before JAX falls back to the CPU, and
libtpu prints `E0000 ...` lines about TPU metadata. `prefer_cpu_without_accelerator()` runs
when realformer_jax is imported, before the package imports JAX: when the machine
has no accelerator device file (NVIDIA `/dev/nvidia0..`, AMD `/dev/kfd`, TPU `/dev/accel*` or
`/dev/vfio/<n>`), it sets JAX_PLATFORMS=cpu, so the plugins are never asked. A machine with one
of those files is left alone (a real GPU is never hidden, and a GPU whose libraries are broken
still shows JAX's traceback); a JAX_PLATFORMS set by the user, even to '', always wins. Left
alone too: a system other than Linux (its accelerators have no such files: e.g. Apple's Metal
plugin), and a JAX that already started its backends before realformer_jax was imported (the
choice can no longer change; the user's script chose).
"""

from __future__ import annotations

import glob
import os
import sys

_DEVICE_FILES = ('/dev/nvidia[0-9]*', '/dev/kfd', '/dev/accel[0-9]*', '/dev/vfio/[0-9]*')

# What the last call decided, for device_check's environment report.
decision = 'not run'


def accelerator_device_files(patterns=_DEVICE_FILES) -> list[str]:
  """Device files of GPUs / TPUs present on this machine (none on a CPU-only one)."""
  return sorted(path for pattern in patterns for path in glob.glob(pattern))


def prefer_cpu_without_accelerator(patterns=_DEVICE_FILES) -> str:
  """Sets JAX_PLATFORMS=cpu when JAX_PLATFORMS is unset and no accelerator is present; returns
  (and records in `decision`) what it did, in words."""
  global decision  # pylint: disable=global-statement
  if 'JAX_PLATFORMS' in os.environ:
    decision = f'JAX_PLATFORMS={os.environ["JAX_PLATFORMS"]!r} (set before start)'
  elif not sys.platform.startswith('linux'):
    decision = f'JAX default ({sys.platform}: accelerators are not found by device files)'
  elif _jax_started():
    decision = 'JAX default (JAX had started before realformer_jax was imported)'
  elif accelerator_device_files(patterns):
    decision = 'JAX default (an accelerator device file is present)'
  else:
    os.environ['JAX_PLATFORMS'] = 'cpu'
    if 'jax' in sys.modules:  # imported but no backend open yet: the flag still applies
      sys.modules['jax'].config.update('jax_platforms', 'cpu')
    decision = 'cpu (no GPU/TPU device file: accelerator plugins not initialised)'
  return decision


def _jax_started() -> bool:
  bridge = getattr(getattr(sys.modules.get('jax'), '_src', None), 'xla_bridge', None)
  return bridge is not None and bridge.backends_are_initialized()


# Once, when realformer_jax is imported (its __init__ imports this module first).
prefer_cpu_without_accelerator()

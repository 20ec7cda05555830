"""One device's memory budget on this host: what 'auto' accumulation fits a step into
(train/build.py: resolve) and what config validation holds the ring's carried rows against
(train/config.py), asked once per run (train/run_setup.py) and handed to both. A deviceless
compile for a target passes the target's instead (aot/train_step.py: memory_budget)."""

from __future__ import annotations

import os

import jax

from realformer_jax.units import GiB


def host_available_bytes() -> int:
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


def memory_budget(train) -> tuple[int, str]:
  """(bytes one device may use, where that figure came from), for this host's devices."""
  if train.device_memory_bytes > 0:
    capacity, source = int(train.device_memory_bytes), 'train.device_memory_bytes'
  else:
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if stats.get('bytes_limit'):
      capacity, source = int(stats['bytes_limit']), f'{device.platform} memory_stats'
    else:  # CPU: the devices share the host's memory
      capacity = host_available_bytes() // jax.local_device_count()
      source = f'available host memory / {jax.local_device_count()} device(s)'
  return int(capacity * train.memory_fraction), (
    f'{source}: {capacity / GiB:.2f} GiB x memory_fraction {train.memory_fraction}'
  )

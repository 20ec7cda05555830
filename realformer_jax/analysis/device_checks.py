"""The record of passed device checks, and the backends it lets 'auto' take.

A backend whose record says `after_device_check` (kernels/backends/registry.py: the Hopper
kernels of kernels/backends/mosaic_gpu/) is never taken by `attention_impl='auto'` or 'pallas'
on trust: `python -m experiments.device_check` must first have passed EVERY one of its kernel
cases, compiled, on this device kind, with this jax / jaxlib and this kernel source (the hash of
analysis/check_cache.py: kernels/ and model/). The check then writes one entry to
`device_checks.json` beside the run-time self-check's verdicts ($REALFORMER_JAX_CACHE, default
~/.cache/realformer_jax); the train setup reads it (`passed_backends`) and kernels/plumbing/
select.py (`for_run`) takes that backend ahead of the platform's default, with one log line
(model.attention_check=False skips this, as it skips the run-time check: the platform's default
then). Any change to the kernels, the model, jax or the device kind is a new key: the backend is
not taken until the check has passed again there. A pass alone is not enough: 'auto' takes the
backend only where the device suite also timed it faster than the platform's default on that
device kind, with this jax and kernel source (`record_speed`: the times go into the same entry;
`faster`). An explicit attention_impl takes any backend, as before.
"""

from __future__ import annotations

import datetime
from typing import Any, Optional, Sequence

from realformer_jax.analysis import check_cache
from realformer_jax.kernels import backends
from realformer_jax.kernels.plumbing import select

FILE = 'device_checks.json'


def key(backend: str, device_kind: str) -> str:
  """What a pass is valid for: the backend, the device kind, jax / jaxlib and the kernel source."""
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel

  impl = backends.get(backend).attention_impl
  return '|'.join(
    (
      backend,
      device_kind,
      jax.__version__,
      jaxlib.__version__,
      check_cache.kernel_source_hash(impl),
    )
  )


def load() -> dict:
  return check_cache.load(FILE)


def record(backend: str, device_kind: str, cases: list[dict]) -> Optional[str]:
  """Writes a pass for `backend` on `device_kind` when every case of it ran compiled and
  passed; returns the key written, or None (nothing recorded: a failed, interpreted or missing
  case). Best effort: a read-only home only means the backend is not taken."""
  own = [c for c in cases if c['kernel'].split(' ')[0] == backend]
  if not own or not all(c['passed'] and '(compiled)' in c['kernel'] for c in own):
    return None
  entries = load()
  entry = key(backend, device_kind)
  entries[entry] = {
    'backend': backend,
    'device_kind': device_kind,
    'cases': len(own),
    'worst_relative_error': max(c['worst_relative_error'] or 0.0 for c in own),
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
  }
  return entry if check_cache.save(FILE, entries) else None


def passed(backend: str, device_kind: str) -> bool:
  return key(backend, device_kind) in load()


def record_speed(
  backend: str, device_kind: str, workload: str, seconds: float, default_seconds: float
) -> bool:
  """Adds to the backend's passed entry the time the device suite measured for `workload` with
  it and with the platform's default kernels (the same run, the same device); False where no
  pass is recorded (a speed alone trusts nothing) or the record cannot be written."""
  entries = load()
  entry = entries.get(key(backend, device_kind))
  if entry is None:
    return False
  entry['speed'] = {'workload': workload, 'seconds': seconds, 'default_seconds': default_seconds}
  return check_cache.save(FILE, entries)


def faster(backend: str, device_kind: str) -> Optional[str]:
  """Why 'auto' may take `backend` on `device_kind`: its entry holds a pass and a measured time
  below the default kernels'; else None."""
  speed = load().get(key(backend, device_kind), {}).get('speed')
  if not speed or not speed['seconds'] < speed['default_seconds']:
    return None
  return (
    f"{speed['workload']}: {speed['seconds']:.3g} s against the default kernels' "
    f'{speed["default_seconds"]:.3g} s'
  )


def passed_backends(devices: Sequence[Any]) -> list[select.PassedBackend]:
  """The backends of the devices' platform that need a passed device check and have one on
  their device kind, each with whether it measured faster there (`faster`): what the train
  setup lets 'auto' / 'pallas' take (select.for_run)."""
  if not devices:
    return []
  platform = select.platform_of(devices)
  kind = getattr(devices[0], 'device_kind', '')
  return [
    select.PassedBackend(backend, kind, faster(backend.name, kind), check_cache.path(FILE))
    for backend in backends.registered()
    if backend.after_device_check and backend.platform == platform and passed(backend.name, kind)
  ]

"""The README's `experiments.sharding_memory` command runs (8 forced CPU devices, in a
subprocess so the device count is set before JAX starts; configs/tiny.py instead of Large) and
its per-device state shrinks as the README's table says: FSDP holds about 1/8 of the replicated
layout's params + optimizer state."""

import re
import subprocess
import sys

import pytest
from scale_out_support import REPO, device_env


def _gib(cell: str) -> float:
  value, unit = cell.split()
  return float(value) * {'GiB': 1.0, 'MiB': 2.0**-10}[unit]


@pytest.mark.slow
def test_sharding_memory_prints_a_row_per_layout():
  command = [
    sys.executable,
    '-m',
    'experiments.sharding_memory',
    '--config=configs/tiny.py',
    '--global_batch_size=8',
    '--max_len=32',
  ]
  done = subprocess.run(
    command, env=device_env(8), cwd=REPO, text=True, capture_output=True, timeout=600, check=False
  )
  assert done.returncode == 0, done.stdout + done.stderr
  out = done.stdout
  assert out.startswith('8 devices'), out
  rows = {}
  for name in ('replicated (data=N)', 'FSDP (fsdp=N)', 'FSDP x tensor (fsdp=N/2, tensor=2)'):
    line = next(l for l in out.splitlines() if l.startswith(name))
    rows[name] = re.findall(r'[\d.]+ (?:GiB|MiB)', line[len(name) :])
  replicated = _gib(rows['replicated (data=N)'][0])
  fsdp = _gib(rows['FSDP (fsdp=N)'][0])
  assert 0.1 < fsdp / replicated < 0.2, out  # 1/8 of the state, plus unsharded small leaves

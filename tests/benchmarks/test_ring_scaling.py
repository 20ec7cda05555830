"""benchmarks/ring_scaling.py's table and verdict from the compile's report.json (no compile:
the reports are written here as experiments.compile writes them)."""

import json

import pytest

from benchmarks import ring_scaling
from realformer_jax.units import GiB


def _report(seconds, ring=None, block_op=None, warnings=()):
  return {
    'memory': {'needed': 40 * GiB, 'budget': 100 * GiB},
    'estimate': {
      'seconds': seconds,
      'ring': ring,
      'ring_block_op': block_op,
      'warnings': list(warnings),
    },
  }


RING = {'link_seconds': 2.0, 'exposed_seconds': 0.0, 'hops': 696, 'link_bytes': 9.1e11}
EINSUM = 'the einsum formula (forward and backward)'


def test_rows_name_the_per_block_op_and_divide_by_d_times_one_device(tmp_path):
  one = _report(36.5)
  fused = _report(
    500.0, RING, 'the triton qk block kernel (forward; ...)', ['x states no FLOPs, costed']
  )
  lines = ring_scaling.table([(1, 131072, one), (8, 1048576, fused)], one)
  assert lines[2].startswith('| 1 | 131,072 | no ring: the one-device qk kernels | 40.0 GiB')
  assert lines[2].endswith('| 1.00x |')
  assert '| 8 | 1,048,576 | the triton qk block kernel (forward; ...) |' in lines[3]
  assert '| 500.0 s (*) | 2.00 s / 0.00 s | 696, 910 GB | 1.71x |' in lines[3]


def test_the_verdict_is_the_largest_ring_against_the_target(tmp_path):
  one = _report(36.5)
  assert ring_scaling.verdict(8, _report(379.0, RING, EINSUM), one).startswith('PASS')
  miss = ring_scaling.verdict(8, _report(706.3, RING, EINSUM), one)
  assert miss.startswith('MISS (ESTIMATED): 8 devices, the einsum formula')
  assert '706.3 s = 2.42x 8 x the one-device step (36.5 s), target <= 1.3x' in miss


def test_a_row_already_compiled_is_read_not_compiled(tmp_path, monkeypatch):
  dump = tmp_path / ring_scaling.row_name('h200', 8, 'einsum')
  dump.mkdir()
  (dump / 'report.json').write_text(json.dumps(_report(1.0)))
  monkeypatch.setattr(ring_scaling.subprocess, 'run', lambda *a, **k: 1 / 0)
  read = ring_scaling.compile_row(str(tmp_path), 'h200', 8, 8, 'einsum')
  assert read == dict(_report(1.0), dump=str(dump))

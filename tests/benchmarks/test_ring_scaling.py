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


def _kernels_csv(folder, *rows):
  folder.mkdir()
  lines = ['count,us_each,ms_total,op_name,warning']
  lines += [
    f'{count},{us},{count * us / 1e3},jit/{name}/pallas_call,{warning}'
    for count, us, name, warning in rows
  ]
  (folder / 'kernels.csv').write_text('\n'.join(lines) + '\n')
  return str(folder)


def test_an_uncosted_block_forward_is_costed_as_the_one_device_forward(tmp_path):
  """96 ring block calls costed at 1 ms by their bytes (the kernel states no FLOPs); the
  1-device forward's call at 900 ms: the adjusted step adds 96 x 0.899 s."""
  one = dict(
    _report(36.5),
    dump=_kernels_csv(tmp_path / 'one', (12, 900_000.0, 'realformer_qk_attention_fwd', '')),
  )
  ring = dict(
    _report(500.0, RING, 'the triton qk block kernel (forward; ...)', ['states no FLOPs']),
    dump=_kernels_csv(
      tmp_path / 'ring',
      (84, 1000.0, 'realformer_qk_ring_block_fwd', 'x states no FLOPs'),
      (12, 1000.0, 'realformer_qk_ring_block_fwd', 'x states no FLOPs'),
    ),
  )
  assert ring_scaling.adjusted_seconds(ring, one) == pytest.approx(500.0 + 96 * 0.899)
  assert ring_scaling.adjusted_seconds(one, one) is None
  assert 'adjusted 586.3 s' in ring_scaling.table([(8, 1048576, ring)], one)[2]
  assert ring_scaling.verdict(8, ring, one).startswith('MISS (ESTIMATED): 8 devices, the triton')
  assert 'adjusted 586.3 s = 2.01x' in ring_scaling.verdict(8, ring, one)

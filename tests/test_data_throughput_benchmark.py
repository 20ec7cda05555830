"""benchmarks/data_throughput.py runs at toy sizes and reports every figure and target."""

import math

import pytest


@pytest.mark.slow
def test_data_throughput_benchmark_reports_every_figure(capsys):
  from benchmarks import data_throughput  # pylint: disable=import-outside-toplevel

  results = data_throughput.main(['--sizes_mb', '0.3,0.6', '--loader_batches', '5'])
  out = capsys.readouterr().out
  for key in ('raw_encode_mb_s_1_threads', 'loader_tokens_per_s'):
    assert math.isfinite(results[key]) and results[key] > 0, key
  small, large = results['prepare_0.3mb'], results['prepare_0.6mb']
  assert (
    small['source_mb'] < large['source_mb'] and small['train_sequences'] < large['train_sequences']
  )
  assert all(r['max_rss_mb'] > 0 and r['mb_s'] > 0 for r in (small, large))
  two_workers = results['prepare_0.6mb_2_workers']  # the default --workers=1,2
  assert two_workers['train_sequences'] == large['train_sequences'] and two_workers['mb_s'] > 0
  assert results['loader_workers_for_1.3M'] >= 1
  assert len(results['targets']) == 3
  assert out.count('PASS') + out.count('MISS') == 3

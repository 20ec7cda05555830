"""benchmarks/data_throughput.py runs at a smoke size and reports every figure and target."""

import math

import pytest


@pytest.mark.slow
def test_data_throughput_benchmark_reports_every_figure(capsys):
  from benchmarks import data_throughput  # pylint: disable=import-outside-toplevel

  results = data_throughput.main(['--size_mb', '0.4', '--small_mb', '0.2', '--loader_batches', '5'])
  out = capsys.readouterr().out
  end_to_end = results['end_to_end']
  assert end_to_end['workers'] == 2 and end_to_end['tokenizer_seconds'] > 0  # trained in it
  assert end_to_end['mb_s'] > 0 and end_to_end['corpus_digest']
  for size in ('0.2', '0.4'):
    one, two = results[f'prepare_{size}mb_1w'], results[f'prepare_{size}mb_2w']
    assert one['tokenizer_seconds'] is None  # given: the pass alone is timed
    assert one['train_sequences'] == two['train_sequences'] > 0
    assert one['corpus_digest'] == two['corpus_digest']
    assert one['max_rss_mb'] > 0 and two['max_worker_rss_mb'] > 0  # the workers ran
  assert results['loader_tokens_per_s'] > 0 and math.isfinite(results['paper_100gb_hours'])
  assert 'GB corpus on one 16-core host' in out
  assert len(results['targets']) == 4
  assert out.count('PASS  ') + out.count('MISS  ') == 4

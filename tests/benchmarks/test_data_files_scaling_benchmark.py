"""benchmarks/data_files_scaling.py runs at a smoke size and reports every figure and target."""

import pytest


@pytest.mark.slow
def test_data_files_scaling_benchmark_reports_every_figure(capsys, tmp_path):
  from benchmarks import data_files_scaling  # pylint: disable=import-outside-toplevel

  results = data_files_scaling.main(['--mb', '0.3', '--files', '4,200', '--root', str(tmp_path)])
  out = capsys.readouterr().out
  runs = results['runs']
  assert runs[4]['tokenizer_seconds'] > 0 and runs[200]['tokenizer_seconds'] > 0
  assert runs[4]['train_sequences'] == runs[200]['train_sequences'] > 0  # the same documents
  assert runs[200]['per_file_ms'] == pytest.approx(
    (runs[200]['without_tokenizer_s'] - runs[4]['without_tokenizer_s']) / 196 * 1e3
  )
  assert results['reading_files'] == 200 and results['reading_speedup'] > 0
  assert '| 200 | 0.3 |' in out and 'per-file overhead' in out and 'without tokenizer' in out
  assert out.count('PASS  ') + out.count('MISS  ') == 4
  # the reading phase alone, 1 and 2 workers: CPU seconds split serial / beside the workers
  estimate = results['reading_estimate']
  two = estimate['runs'][2]
  assert two['workers_cpu_seconds'] > 0 and two['start_up_cpu_seconds'] > 0
  assert estimate['runs'][1]['workers_cpu_seconds'] == pytest.approx(0, abs=0.05)  # no pool
  assert estimate['estimated_speedup'] > 0 and 'ESTIMATED for 2 idle cores' in out
  assert not list(tmp_path.iterdir())  # the corpora are removed

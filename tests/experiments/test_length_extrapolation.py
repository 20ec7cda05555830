"""Smoke test of the length-extrapolation plan through the study command at toy size (--quick:
2 layers, 6 steps, evaluated at n = 16 and 32 after training at 16), two variants and two
seeds: [MASK] accuracy beside the floors at every n, per-layer entropy, paired comparisons (not
testable: toy runs do not learn); then the same command again trains nothing (resume)."""

import json
import math
import os

import jit_cache
import pytest
from data_fixtures import quick_study_argv

from realformer_jax.commands import study as study_command


@pytest.mark.slow
def test_length_extrapolation_quick(tmp_path, capsys):
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  argv = ['--plan=length_extrapolation', *quick_study_argv(out, workdirs, '--runs=E-s*,E-ra-s*')]
  with jit_cache.in_process():  # the seeds' runs compile the same programs
    report = study_command.main(argv)
  assert sorted(report['results']) == ['E-ra-s0', 'E-ra-s1', 'E-s0', 'E-s1']
  for run in report['results'].values():
    assert run['diverged_at_step'] is None and run['steps'] == 6
    for n in ('16', '32'):
      r = run['by_length'][n]
      metrics = r['metrics']
      assert 0.0 <= metrics['mask_accuracy'] <= 1.0 and metrics['mask_predictions'] > 0
      assert r['sequences'] == len(r['sequence_sums']['count']) > 0
      assert 0 < r['floors']['mask_accuracy'] < r['floors']['copy_accuracy'] < 1
      # Two layers, each between one-hot (0) and uniform over n keys (log n).
      assert len(r['entropy_by_layer']) == 2
      assert all(0.0 < e <= math.log(int(n)) + 1e-5 for e in r['entropy_by_layer'])
  summary = report['analysis']
  row = summary['table']['E + residual attention']['32']
  assert row['seeds'] == [0, 1] and len(row['mask_accuracy']) == 2
  assert summary['table']['O (standard)']['16'] is None  # not in this grid
  rows = [
    r
    for r in summary['comparisons']
    if r['a'] == 'E + residual attention' and r['b'] == 'E (entropy-invariant)'
  ]
  assert [r['n'] for r in rows] == [16, 32]
  for r in rows:  # six steps learn nothing: no seed pair qualifies
    assert r['verdict'].startswith('not testable') or r['verdict'] in (
      'holds',
      'does not hold',
      'higher',
      'lower',
      'inconclusive',
    )

  table = open(os.path.join(out, 'results.md')).read()
  assert '## Accuracy at [MASK] (%), beside the floors' in table and '| 32 |' in table
  assert 'copy-aware' in table and '## Attention entropy (nats)' in table
  saved = json.load(open(os.path.join(out, 'results.json')))
  assert saved['lengths'] == [16, 32] and len(saved['runs']) == 4
  assert 'sequence_sums' not in saved['runs']['E-s0']['by_length']['16']
  assert os.path.getsize(os.path.join(out, 'accuracy.png')) > 1000

  capsys.readouterr()
  again = study_command.main(argv)
  assert 'Regenerate: `python -m experiments.study --plan=length_extrapolation --quick`' in table
  assert 'starting' not in capsys.readouterr().out  # nothing trained again
  assert again['analysis'] == json.loads(json.dumps(summary))

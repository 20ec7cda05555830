"""Smoke test of experiments/length_extrapolation.py at toy size (--quick: 2 layers, 6 steps,
evaluated at n = 16 and 32 after training at 16), two variants and two seeds so that intervals
and paired differences are computed; then the same command again trains nothing (resume)."""

import json
import math
import os

from data_fixtures import bible_config
from experiments import length_extrapolation


def test_length_extrapolation_quick(tmp_path, capsys):
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  argv = ['--quick', '--out', out, '--workdirs', workdirs,
          '--data_dir', bible_config().data_dir, '--seeds', '0,1', '--variants', 'E,E-ra']
  report = length_extrapolation.main(argv)
  assert sorted(report['results']) == ['E-ra-s0', 'E-ra-s1', 'E-s0', 'E-s1']
  for run in report['results'].values():
    assert run['diverged'] is None
    assert run['final_eval_at_train_length']['step'] == 6
    for n in ('16', '32'):
      r = run['by_length'][n]
      assert 0.0 <= r['accuracy'] <= 1.0 and r['predictions'] > 0 and r['sequences'] > 0
      # Two layers, each between one-hot (0) and uniform over n keys (log n).
      assert len(r['entropy_by_layer']) == 2
      assert all(0.0 < e <= math.log(int(n)) + 1e-5 for e in r['entropy_by_layer'])
  summary = report['summary']
  accuracy = summary['accuracy']['E + residual attention']['32']
  assert accuracy['n'] == 2 and math.isfinite(accuracy['ci95_half_width'])
  diff = summary['comparisons']['E + residual attention - E (entropy-invariant)']['16']
  assert diff['verdict'] in ('higher', 'lower', 'inconclusive') and diff['n'] == 2
  assert summary['accuracy']['O (standard)']['16'] is None  # not in this grid

  table = open(os.path.join(out, 'results.md')).read()
  assert '| 16 |' in table and '| 32 |' in table and '## Attention entropy (nats)' in table
  saved = json.load(open(os.path.join(out, 'results.json')))
  assert saved['scale']['lengths'] == [16, 32] and len(saved['runs']) == 4
  assert os.path.getsize(os.path.join(out, 'accuracy.png')) > 1000

  capsys.readouterr()
  again = length_extrapolation.main(argv)
  assert '4/4 runs already done' in capsys.readouterr().out
  assert again['summary'] == json.loads(json.dumps(summary))

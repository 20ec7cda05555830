"""Smoke tests of the gradient studies through `python -m experiments.study --plan=NAME --quick`
(synthetic data, 4 layers): grad_norms trains 3 steps, init_grad_sweep measures at init.

One grad_norms variant (ReZero: zero branch gradients at init, nonzero once trained) keeps it to
seconds of compiling; the other variants share every code path but their ModelConfig.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from repo_paths import REPO


def _study(plan: str, tmp_path, *argv: str) -> subprocess.CompletedProcess:
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  command = [sys.executable, '-m', 'experiments.study', f'--plan={plan}', '--quick']
  ended = subprocess.run(
    command + [f'--out={out}', f'--workdirs={workdirs}', *argv],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert ended.returncode == 0, ended.stderr[-3000:]
  return ended


def _run(tmp_path, name: str) -> dict:
  with open(tmp_path / 'out' / 'runs' / f'{name}.json') as f:
    return json.load(f)


@pytest.mark.slow
def test_grad_norms_plan_quick(tmp_path):
  _study('grad_norms', tmp_path, '--runs=rezero-s0')
  r = _run(tmp_path, 'rezero-s0')
  for when in ('init', 'trained'):
    for sublayer in ('attention', 'mlp'):
      values = np.asarray(r[when]['grad_norms'][sublayer])
      assert values.shape == (4,) and np.all(np.isfinite(values)), (when, sublayer)
    assert np.all(np.asarray(r[when]['input_grad_norms']) > 0)
  assert len(r['train_loss']) == 3 and np.all(np.isfinite(r['train_loss']))
  assert r['data'] == 'synthetic' and r['params']['model'] == {
    'ln_placement': 'none',
    'residual_branch': 'rezero',
  }
  # ReZero's branches get no gradient at init (gates are 0), and do once the gates move.
  assert np.all(np.asarray(r['init']['grad_norms']['attention']) == 0)
  assert np.all(np.asarray(r['trained']['grad_norms']['attention']) > 0)
  np.testing.assert_allclose(r['init']['token_cosine'], r['init']['token_cosine'][0], rtol=1e-5)

  table = (tmp_path / 'out' / 'results.md').read_text()
  assert '| rezero |' in table and '| 4 |' in table and '## After 3 steps' in table
  summary = json.loads((tmp_path / 'out' / 'results.json').read_text())['summary']
  assert summary['variants']['rezero']['first_over_last']['attention'][0] is None
  assert summary['wall_seconds'] == r['seconds']
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    return
  assert os.path.getsize(tmp_path / 'out' / 'grad_norms.png') > 1000


@pytest.mark.slow
def test_init_grad_sweep_plan_quick(tmp_path):
  _study('init_grad_sweep', tmp_path)
  for name in ('post-s0', 'relu-s0'):
    r = _run(tmp_path, name)
    for sublayer in ('attention', 'mlp'):
      values = np.asarray(r[sublayer])
      assert values.shape == (4,) and np.all(values > 0) and np.all(np.isfinite(values))
    assert len(r['token_cosine']) == 4
  assert _run(tmp_path, 'relu-s0')['config']['activation'] == 'relu'
  table = (tmp_path / 'out' / 'results.md').read_text()
  assert '| post (the grad_norms setting) | 4 |' in table and '| ReLU FFN | 4 |' in table

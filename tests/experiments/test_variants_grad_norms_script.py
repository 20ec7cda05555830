"""Smoke test of experiments/grad_norms.py in --quick mode (synthetic data, 4 layers, 3 steps).

One variant (ReZero: zero branch gradients at init, nonzero once trained) keeps it to ~10 s of
compiling; the other variants share every code path but their ModelConfig.
"""

import json
import os

import numpy as np
import pytest

from experiments import grad_norms


@pytest.mark.slow
def test_grad_norms_script_quick(tmp_path):
  out = str(tmp_path / 'gn')
  report = grad_norms.main(['--quick', '--variants', 'rezero', '--out', out])
  results = report['results']
  assert set(results) == {'rezero'}
  for name, r in results.items():
    for when in ('init', 'trained'):
      for sublayer in ('attention', 'mlp'):
        values = np.asarray(r[when]['grad_norms'][sublayer])
        assert values.shape == (4,) and np.all(np.isfinite(values)), (name, when, sublayer)
      assert np.all(np.asarray(r[when]['input_grad_norms']) > 0)
    assert len(r['train_loss']) == 3 and np.all(np.isfinite(r['train_loss']))
  # ReZero's branches get no gradient at init (gates are 0), and do once the gates move.
  assert np.all(np.asarray(results['rezero']['init']['grad_norms']['attention']) == 0)
  assert np.all(np.asarray(results['rezero']['trained']['grad_norms']['attention']) > 0)
  np.testing.assert_allclose(
    results['rezero']['init']['token_cosine'],
    results['rezero']['init']['token_cosine'][0],
    rtol=1e-5,
  )

  table = open(os.path.join(out, 'grad_norms.md')).read()
  assert '| rezero |' in table and '| 4 |' in table and '## After 3 steps' in table
  saved = json.load(open(os.path.join(out, 'grad_norms.json')))
  assert saved['meta']['args']['layers'] == 4
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    return
  assert os.path.getsize(os.path.join(out, 'grad_norms.png')) > 1000


@pytest.mark.slow
def test_init_sweep_script_quick(tmp_path):
  from experiments import init_grad_sweep

  out = str(tmp_path / 'sweep')
  results = init_grad_sweep.main(['--quick', '--out', out])
  assert set(results) == {'post', 'ReLU FFN'}
  for r in results.values():
    for sublayer in ('attention', 'mlp'):
      values = np.asarray(r[sublayer])
      assert values.shape == (4,) and np.all(values > 0) and np.all(np.isfinite(values))
    assert len(r['token_cosine']) == 4
  assert results['ReLU FFN']['config']['activation'] == 'relu'
  table = open(os.path.join(out, 'init_sweep.md')).read()
  assert '| post | 4 |' in table and '| ReLU FFN | 4 |' in table

"""The kernels compile for their hardware on this CPU host: `python -m benchmarks.attention_kernels
--quick` (the README's command at toy shape) builds the project's train step with
attention_impl='pallas' for an H100 (Triton kernels) and a TPU v5e slice (Mosaic kernels),
post and RealFormer, and estimates them. A subprocess with JAX_PLATFORMS=cpu, as the command is
run: with the CUDA plugin and libtpu installed, nothing may try to open a device."""

import json
import os
import subprocess
import sys

import pytest
import repo_paths

REPO = repo_paths.REPO

KERNELS = {
  'h100_tiny_post': {'flash_attention_fwd', 'flash_attention_bwd'},
  # The toy head (< READ_BACK_MIN_HEAD_DIM) takes the store path: the backward stores a dQ
  # part per key block and a small kernel sums them (triton/attention.py `reads_dq_back`).
  'h100_tiny_realformer': {
    'realformer_attention_fwd',
    'realformer_attention_bwd',
    'attention_store_dq',
  },
  'v5e_tiny_post': {'flash_attention_fwd', 'flash_attention_dkv', 'flash_attention_dq'},
  'v5e_tiny_realformer': {
    'realformer_attention_fwd',
    'realformer_attention_dkv',
    'realformer_attention_dq',
  },
}


@pytest.mark.slow
def test_kernels_compile_for_an_h100_and_a_tpu_v5e(tmp_path):
  result = subprocess.run(
    [sys.executable, '-m', 'benchmarks.attention_kernels', '--quick', f'--out_dir={tmp_path}'],
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  rows = json.loads((tmp_path / 'results.json').read_text())['rows']
  assert set(rows) == set(KERNELS)
  for name, row in rows.items():
    measured = row['result']
    assert measured['step_s'] > 0 and measured['fits'], (name, measured)
    kernels = {k['op'] for k in measured['attention_kernels']}
    assert kernels == KERNELS[name], (name, kernels)
    # Every kernel is counted once per layer and step (2 layers), none without a cost; an
    # unrolled scan may list each layer's launch apart (a row of count 1 per layer).
    counts = {}
    for k in measured['attention_kernels']:
      counts[k['op']] = counts.get(k['op'], 0) + k['count']
    assert set(counts.values()) == {2}, (name, counts)
    assert not [w for w in measured['warnings'] if 'attention' in w], measured['warnings']
  assert 'ESTIMATES' in result.stdout

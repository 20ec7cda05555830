"""Smoke test of the benchmark script: `--quick` at toy shapes (`--tiny`), every row present,
every number finite."""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

# The benchmark's Hugging Face rows need transformers. Looked up, not imported: importing it
# costs ~6 s CPU (it pulls torch) in every collection of the suite.
if importlib.util.find_spec('transformers') is None:
  pytest.skip('transformers is not installed', allow_module_level=True)

import repo_paths

from benchmarks import profiles
from benchmarks import run as bench

REPO = pathlib.Path(repo_paths.REPO)


@pytest.mark.slow
def test_tiny_benchmark_prints_every_row_with_finite_numbers(tmp_path):
  path = tmp_path / 'bench.json'
  report = bench.main(['--quick', '--tiny', '--json', str(path)])
  saved = json.loads(path.read_text())
  metrics = {(r['section'], r['metric']) for r in saved['rows']}
  train = 'train_tiny'
  for name in ('post', 'realformer', 'pre', 'HF FlaxBertForMaskedLM'):
    assert (train, f'{name} step time') in metrics
    assert (train, f'{name} tokens/s') in metrics
  for metric in (
    'tokens/s ratio post / HF',
    'step time realformer / post',
    'step time pre / post',
    # on a CPU the peak is the matmul timed in the same run, not a datasheet's
    'MFU post (model FLOPs / time / measured matmul peak)',
    'matmul peak (f32 2048^3, best of 3/round)',
  ):
    assert (train, metric) in metrics
  for kind in ('scanned', 'loop'):
    for layers in profiles.PROFILES['tiny'].compile_layers:
      assert ('compile', f'{kind:7s} {layers:2d} layers: trace+lower+compile') in metrics
  for layout in ('post', 'realformer'):
    for remat in ('none', 'full'):
      assert ('memory', f'{layout:10s} remat={remat:5s} peak') in metrics
  assert ('memory', 'realformer - post temp, remat=none') in metrics
  assert ('memory', 'HF FlaxBertForMaskedLM peak') in metrics
  for row in saved['rows']:
    assert row['n'] >= 1, row
    assert math.isfinite(row['median']), row
  # One line per target, and none of them can fail the run.
  assert {t['target'] for t in saved['targets']} == set(profiles.TARGETS)
  assert {t['status'] for t in saved['targets']} <= {'PASS', 'MISS', 'INFO'}
  assert report.rows


@pytest.mark.slow
def test_loop_benchmark_compares_the_loop_with_the_bare_step():
  from data_fixtures import bible_config  # pylint: disable=import-outside-toplevel

  from benchmarks import loop as loop_bench  # pylint: disable=import-outside-toplevel

  result = loop_bench.main(
    [
      '--steps=4',
      '--log_every=2',
      '--rounds=1',
      f'data.data_dir={bible_config().data_dir}',
      'model.num_layers=2',
      'model.hidden_size=32',
      'model.num_heads=2',
      'model.mlp_dim=64',
      'model.max_len=32',
      'data.max_len=32',
      'data.max_predictions=5',
      'train.global_batch_size=8',
    ]
  )
  assert len(result['ratios']) == 1 and result['status'] in ('PASS', 'MISS')
  assert all(math.isfinite(x) and x > 0 for x in result['bare'] + result['loop'])


@pytest.mark.slow
def test_accelerator_profile_code_path_at_toy_shapes(tmp_path):
  # The GPU / TPU profile (bf16, interleaved HF comparison, device-time breakdown from a
  # profiler trace, the accelerator targets) at toy shapes on whatever backend runs the suite.
  path = tmp_path / 'accelerator.json'
  bench.main(
    [
      '--profile',
      'accelerator',
      '--tiny',
      '--sections',
      'train',
      '--json',
      str(path),
      '--trace_dir',
      str(tmp_path / 'traces'),
    ]
  )
  saved = json.loads(path.read_text())
  assert saved['meta']['profile'] == 'accelerator_tiny'
  rows = {(r['section'], r['metric']): r for r in saved['rows']}
  assert ('train_tiny', 'matmul peak (bf16 256^3, best of 3/round)') in rows
  for name in ('post', 'realformer', 'pre', 'HF FlaxBertForMaskedLM'):
    total = rows[('trace_tiny', f'{name}: total device time')]['median']
    parts = [
      r['median']
      for (section, metric), r in rows.items()
      if section == 'trace_tiny'
      and metric.startswith(f'{name}: ')
      and not metric.endswith('total device time')
    ]
    assert total > 0 and math.isclose(sum(parts), total, rel_tol=1e-6)
    assert rows[('trace_tiny', f'{name}: matmul')]['median'] > 0
    assert rows[('train_tiny', f'{name} compile (trace+lower+compile)')]['median'] > 0
  assert (tmp_path / 'traces' / 'post').is_dir()
  assert {t['target'] for t in saved['targets']} == set(profiles.ACCELERATOR_TARGETS)
  assert {t['status'] for t in saved['targets']} == {'INFO'}  # toy shapes: never PASS/MISS


@pytest.mark.slow
def test_long_sequence_benchmark_at_toy_size():
  from benchmarks import long_sequences  # pylint: disable=import-outside-toplevel

  variants = ('realformer saved', 'realformer recomputed')
  results = long_sequences.main(
    [
      '--lengths',
      '64',
      '--hidden',
      '32',
      '--layers',
      '2',
      '--heads',
      '2',
      '--dtype',
      'float32',
      '--run',
      '1',
      '--variants',
      ','.join(variants),
    ]
  )
  assert set(results) == {(64, name) for name in variants}
  for result in results.values():
    assert result['xla_peak_gb'] > 0 and result['step_s'] > 0


def test_long_sequence_targets_print_pass_or_miss():
  # Issue 40's targets on the estimated rows at L = 65,536, BERT-Base only (a toy table has
  # none).
  import argparse  # pylint: disable=import-outside-toplevel

  from benchmarks import long_sequences  # pylint: disable=import-outside-toplevel

  base = argparse.Namespace(hidden=768, layers=12, heads=12, dtype='bfloat16')
  rows = lambda post, qk: {
    'L65536-post': {'compiled': True, 'step_seconds': post},
    'L65536-realformer-qk': {'compiled': True, 'step_seconds': qk},
  }
  miss, passed = long_sequences.target_verdicts(rows(3.6, 7.3), base)
  assert miss.startswith('MISS (ESTIMATED) qk step <= 2x Post-LN') and '2.03x' in miss
  assert passed.startswith('MISS (ESTIMATED) Post-LN step <= 3.5 s') and '3.60 s' in passed
  verdicts = long_sequences.target_verdicts(rows(3.4, 6.8), base)
  assert [line.split()[0] for line in verdicts] == ['PASS', 'PASS']
  toy = argparse.Namespace(hidden=32, layers=2, heads=2, dtype='bfloat16')
  assert long_sequences.target_verdicts(rows(3.4, 6.8), toy) == []


@pytest.mark.slow
def test_aot_profile_code_path_at_toy_shape(tmp_path):
  # The H100 profile compiled on this host (deviceless) and estimated, at toy shape, for ours
  # and Hugging Face's step. A subprocess: the accelerator plugins need JAX_PLATFORMS=cpu
  # from the start (tests/aot/test_aot_compile.py).
  done = subprocess.run(
    [
      sys.executable,
      '-m',
      'benchmarks.run',
      '--profile',
      'aot-h100',
      '--tiny',
      '--out_dir',
      str(tmp_path),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((tmp_path / 'results.json').read_text())
  assert summary['meta']['profile'] == 'aot_tiny'
  assert set(summary['runs']) == {'tiny-realformer', 'tiny-hf'}
  for result in summary['runs'].values():
    assert result['fits'] and result['step_seconds'] > 0 and 0 < result['mfu'] < 1
    assert result['launches'] > 0 and len(result['top']) == 10
    assert abs(sum(result['by_category'].values()) - result['step_seconds']) < 1e-9
  text = (tmp_path / 'results.md').read_text()
  assert "Estimated from XLA's compile for 1 x NVIDIA H100 SXM 80GB" in text
  assert 'ESTIMATES' in text and '| tiny (2 x 16) | HF FlaxBertForMaskedLM |' in text


@pytest.mark.slow
@pytest.mark.parametrize(
  'target, variants', [('h100:1', ('post', 'realformer qk')), ('v5p:1x1x1', ('realformer qk',))]
)
def test_long_sequence_table_for_a_target_at_toy_size(tmp_path, target, variants, capsys):
  # The docstring's deviceless commands: XLA's memory and the ESTIMATED step per row, never
  # under the FLOPs at the datasheet peak; a rerun skips the finished rows. At the default
  # matmul precision, as the command runs (Mosaic refuses the suite's 'highest' for bf16 tiles).
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import long_sequences  # pylint: disable=import-outside-toplevel

  argv = [f'--target={target}', '--lengths=256', '--hidden=32', '--layers=2', '--heads=2']
  argv += [f'--variants={",".join(variants)}', f'--out={tmp_path}']
  with jax.default_matmul_precision('default'):
    results = long_sequences.main(argv)
  assert set(results) == {f'L256-{v.replace(" ", "-")}' for v in variants}
  for row in results.values():
    assert row['compiled'] and row['memory_bytes'] > 0
    assert row['step_seconds'] >= row['flops_at_peak_seconds'] > 0
  table = (tmp_path / 'results.md').read_text()
  assert '| 256 | realformer qk |' in table and 'ESTIMATED' in table
  capsys.readouterr()
  long_sequences.main(argv)
  done = len(variants)
  assert f'{done}/{done} runs already done' in capsys.readouterr().out

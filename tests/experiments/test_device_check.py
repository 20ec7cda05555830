"""`python -m experiments.device_check` (the command for a researcher's first GPU or TPU) runs
on this CPU machine at its toy size and reports each part; and a CPU process of the CLIs prints
no accelerator-plugin noise with the `aot` extra installed (realformer_jax/platform_choice.py).
"""

import json
import os
import subprocess
import sys
import types

import pytest
import repo_paths

from realformer_jax import platform_choice

REPO = repo_paths.REPO
PLUGIN_NOISE = ('Traceback', 'cuDNN', 'Jax plugin configuration error', 'E0000', 'libtpu')


@pytest.mark.slow
def test_device_check_reports_each_part_and_no_plugin_noise(tmp_path):
  env = dict(os.environ)
  env.pop('JAX_PLATFORMS', None)  # the command chooses, as a user's would
  if platform_choice.accelerator_device_files():  # a GPU / TPU machine: keep this test a CPU run
    env['JAX_PLATFORMS'] = 'cpu'
  # The suite's XLA setting (conftest.py): the toy size's time is compilation, mostly of the
  # interpret-mode kernels. The platform choice and the plugin noise do not depend on it.
  env['JAX_DISABLE_MOST_OPTIMIZATIONS'] = 'true'
  out = tmp_path / 'report.json'
  result = subprocess.run(
    [sys.executable, '-m', 'experiments.device_check', f'--out={out}', '--jobs=2'],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert not [n for n in PLUGIN_NOISE if n in result.stderr], result.stderr[-3000:]
  report = json.loads(out.read_text())
  env_part = report['environment']
  assert env_part['backend'] == 'cpu' and env_part['device_count'] >= 1
  assert env_part['versions']['jax'] and env_part['versions']['jaxlib']
  assert report['size'] == 'toy' and 'TOY SIZE' in result.stdout
  kernels = report['kernels']
  assert {r['kernel'] for r in kernels} == {'triton (interpret)', 'mosaic (interpret)'}
  assert all(r['passed'] and r['worst_relative_error'] < 5e-2 for r in kernels), kernels
  training = report['training']
  assert training['passed'] and len(training['losses_kernels']) == 20
  rows = {r['model']: r for r in report['steps']['rows']}
  assert set(rows) == {'post', 'realformer', 'pre'}
  assert all(r['step_s (measured, median)'] > 0 for r in rows.values()), rows
  assert report['steps']['target_for_estimates'] is None  # no deviceless target for a CPU
  assert 'no deviceless ESTIMATE' in result.stdout and 'overall: PASS' in result.stdout


def test_the_cpu_is_chosen_only_without_an_accelerator(tmp_path, monkeypatch):
  monkeypatch.setenv('JAX_PLATFORMS', '')  # records the session's value, restored after
  monkeypatch.delenv('JAX_PLATFORMS')
  fake_jax = types.SimpleNamespace(
    config=types.SimpleNamespace(update=lambda *a: updates.append(a))
  )
  updates = []
  monkeypatch.setitem(sys.modules, 'jax', fake_jax)
  (tmp_path / 'nvidia0').write_text('')
  # An accelerator's device file: JAX keeps its own choice (a real GPU is never hidden).
  decision = platform_choice.prefer_cpu_without_accelerator((str(tmp_path / 'nvidia[0-9]*'),))
  assert 'JAX_PLATFORMS' not in os.environ and updates == [] and 'JAX default' in decision
  # None: the CPU, also for a jax imported but not started.
  decision = platform_choice.prefer_cpu_without_accelerator((str(tmp_path / 'accel[0-9]*'),))
  assert os.environ['JAX_PLATFORMS'] == 'cpu' and updates == [('jax_platforms', 'cpu')]
  # The user's setting always wins.
  monkeypatch.setenv('JAX_PLATFORMS', 'cuda')
  assert 'set before start' in platform_choice.prefer_cpu_without_accelerator(())
  assert os.environ['JAX_PLATFORMS'] == 'cuda'
  # Not Linux (no device files to read), or a JAX whose backends already started: left alone.
  monkeypatch.delenv('JAX_PLATFORMS')
  updates.clear()
  monkeypatch.setattr(sys, 'platform', 'darwin')
  assert 'darwin' in platform_choice.prefer_cpu_without_accelerator(())
  monkeypatch.setattr(sys, 'platform', 'linux')
  bridge = types.SimpleNamespace(backends_are_initialized=lambda: True)
  fake_jax._src = types.SimpleNamespace(xla_bridge=bridge)
  assert 'had started' in platform_choice.prefer_cpu_without_accelerator(())
  assert 'JAX_PLATFORMS' not in os.environ and updates == []


@pytest.mark.slow
def test_a_user_script_importing_the_library_prints_no_plugin_noise():
  # As a user's own script on this machine: JAX_PLATFORMS unset, the library imported first.
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  code = 'import realformer_jax, jax; print(jax.default_backend())'
  result = subprocess.run(
    [sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0, result.stderr[-3000:]
  if not platform_choice.accelerator_device_files():
    assert result.stdout.strip() == 'cpu'
    assert not [n for n in PLUGIN_NOISE if n in result.stderr], result.stderr[-3000:]


def test_the_gpu_cases_check_the_qk_kernels_too():
  # 'auto' takes the carried sum at the probe's length, so the qk kernels need cases of their own.
  # In a subprocess: the command defines absl flags (--out) that another script's import in this
  # process would then define twice.
  code = (
    'import json; from realformer_jax.commands import device_check; '
    "print(json.dumps(device_check.kernel_cases('gpu', 'full')))"
  )
  done = subprocess.run(
    [sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 0, done.stderr[-2000:]
  cases = [tuple(c) for c in json.loads(done.stdout.strip().splitlines()[-1])]
  qk = [c for c in cases if c[4] == 'qk']
  assert {(c[0], c[1], c[2]) for c in qk} == {
    ('triton', 'realformer', 'float32'),
    ('triton', 'realformer', 'bfloat16'),
    ('mosaic_gpu', 'realformer', 'bfloat16'),
  }
  assert len(cases) == len(set(cases)) and all(len(c) == 6 for c in cases)
  # The Hopper kernels are asked only what their record allows: 16-bit, no carried sum.
  assert [c for c in cases if c[0] == 'mosaic_gpu'] == [
    ('mosaic_gpu', 'post', 'bfloat16', None, 'auto', 'none'),
    ('mosaic_gpu', 'pre', 'bfloat16', None, 'auto', 'none'),
    ('mosaic_gpu', 'post', 'bfloat16', None, 'auto', 'full'),
    ('mosaic_gpu', 'realformer', 'bfloat16', None, 'qk', 'none'),
  ]
  assert len([c for c in cases if c[0] == 'triton']) == 10  # both dtypes, the sum, odd length
  # plain attention under full remat (the forward stores no mask, the backward draws it)
  assert ('triton', 'post', 'float32', None, 'auto', 'full') in cases

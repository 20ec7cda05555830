"""Deviceless compiles for accelerator targets on the CI machine (no GPU or TPU needed): the
README's compile commands (H100 x 8 with FSDP, a TPU v5e slice, A100s with --dump) at toy
width, the one-line error of a config that cannot fit, 'auto' accumulation for a target against
a hand calculation, and the estimator on programs XLA really compiled for an H100.

Every case runs in a subprocess started with JAX_PLATFORMS=cpu, as the command itself does: the
accelerator plugins (`pip install -e '.[aot]'`) must not try to open a device, and the suite's
own process keeps its backend.
"""

import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import pytest
import repo_paths

REPO = pathlib.Path(repo_paths.REPO)
ENV = dict(os.environ, JAX_PLATFORMS='cpu')


def _run(*args, fast: bool = False, timeout=600) -> subprocess.CompletedProcess:
  """`fast`: XLA's cheap optimisation level (the suite's conftest setting), where a test
  compares compiled programs with each other rather than with a fully optimised one."""
  env = dict(ENV, JAX_DISABLE_MOST_OPTIMIZATIONS='true') if fast else ENV
  return subprocess.run(
    [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
  )


def _compile_command(*flags, fast: bool = False) -> subprocess.CompletedProcess:
  return _run('-m', 'experiments.compile', '--config=configs/tiny.py', *flags, fast=fast)


# The README's paper-size commands at toy width (as tests/experiments/test_configs.py runs the
# configs' commands): depth, heads, LN placement, remat, dtype and 'auto' accumulation stay.
# Width 64, not test_configs' 48: XLA:GPU, which cannot autotune without a device, found no
# Triton tiling for a [256, 48] GEMM ('Couldn't find output tile sizes').
_TOY_FLAGS = [
  '--config.model.hidden_size=64',
  '--config.model.mlp_dim=128',
  '--config.model.max_len=32',
  '--config.data.max_len=32',
  '--config.data.max_predictions=5',
  '--config.train.global_batch_size=16',
]


# Per config, what its toy width needs besides: BERT-Base's 12 heads do not divide 64.
_TOY_FLAGS_OF = {'configs/long_context.py': ['--config.model.num_heads=4']}


def readme_compile_commands():
  """Every `python -m experiments.compile ...` line of docs/training.md."""
  text = (REPO / 'docs' / 'training.md').read_text()
  return re.findall(r'^(python -m experiments\.compile .*)$', text, flags=re.M)


def test_the_readme_shows_compile_commands_for_an_h100_a_tpu_v5e_and_an_a100():
  targets = [re.search(r'--target=(\S+)', c).group(1) for c in readme_compile_commands()]
  assert targets == ['h100:8', 'v5e:4x4', 'a100-40g:2', 'h200:8']


@pytest.mark.slow
def test_each_readme_compile_command_runs_at_toy_width(tmp_path):
  commands = readme_compile_commands()
  # Two at a time: a compile is mostly one thread, and CI has two cores.
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    runs = list(
      pool.map(
        lambda c: _run(
          *shlex.split(c.replace('/tmp/tiny_a100', str(tmp_path)))[1:],
          *_TOY_FLAGS,
          *_TOY_FLAGS_OF.get(re.search(r'--config=(\S+)', c).group(1), ()),
          fast=True,
        ),
        commands,
      )
    )
  for command, done in zip(commands, runs):
    _check_compile_output(command, done, tmp_path)


def _check_compile_output(command: str, done: subprocess.CompletedProcess, dump_dir) -> None:
  assert done.returncode == 0, (command, done.stderr[-3000:])
  out = done.stdout
  target = re.search(r'--target=(\S+)', command).group(1)
  description = {
    'h100:8': '8 x NVIDIA H100 SXM 80GB',
    'v5e:4x4': '16 x TPU v5e',
    'a100-40g:2': '2 x NVIDIA A100 SXM 40GB',
    'h200:8': '8 x NVIDIA H200 SXM 141GB',
  }[target]
  assert f'Compiling the train step for {description} ({target})' in out
  assert re.search(r'needs +[\d.]+ GiB +of [\d.]+ GiB .*: fits, [\d.]+ GiB to spare', out), out
  assert 'ESTIMATED step time: ' in out and 'ESTIMATED MFU: ' in out
  assert re.search(r'^layer scan: .*; compiled here in [\d.]+ s', out, flags=re.M), out
  if 'mesh.shape' in command:  # FSDP over the 8 GPUs
    assert 'mesh data=1 fsdp=8 tensor=1 sequence=1' in out
  if 'long_context' in command:  # the million-token config: the sequence over the 8 GPUs
    assert 'mesh data=1 fsdp=1 tensor=1 sequence=8' in out and "residual_carry='qk'" in out
    ring = re.search(r'ring attention .*: ([\d,]+) hops per step, .* ms exposed', out)
    assert ring and int(ring.group(1).replace(',', '')) > 0, out
    assert 'ESTIMATED step time with each ring hop hidden behind its block: ' in out
    assert 'ring attention per-block op: the einsum formula (forward and backward)' in out
  if 'realformer_large' in command:  # the paper config: 'auto', chosen for the target
    assert "(grad_accum_steps='auto', chosen for this target)" in out
    # 24 layers on a GPU: scan_unroll='auto' unrolls them (model/layer_unroll.py); a TPU keeps
    # the scan rolled
    if re.search(r'h[12]00', command):
      assert "layer scan: scan_unroll='auto' -> 24 layer(s) per iteration, fully unrolled" in out
  if '--dump' in command:
    report = json.loads((dump_dir / 'report.json').read_text())
    memory = report['memory']
    assert memory['needed'] == (
      memory['arguments'] + memory['outputs'] - memory['aliased'] + memory['temporaries']
    )
    assert 0 < memory['needed'] <= memory['budget'] and memory['fits']
    assert memory['params'] > 0 and memory['optimizer_state'] >= 2 * memory['params']
    assert report['estimate']['seconds'] > 0 and 0 < report['estimate']['mfu'] < 1
    hlo = (dump_dir / 'train_step.hlo.txt').read_text()
    assert hlo.startswith('HloModule') and 'ENTRY' in hlo
    rows = (dump_dir / 'kernels.csv').read_text().splitlines()
    assert rows[0].startswith('kernel,') and len(rows) > 20


@pytest.mark.slow
def test_a_config_that_cannot_fit_ends_with_one_error_line_naming_the_bytes():
  # 1M x 1024 embeddings: parameters, AdamW moments and gradients alone exceed a v5e's 16 GiB.
  done = _compile_command(
    '--target=v5e:2x2',
    '--config.data.vocab_size=1000000',
    '--config.model.hidden_size=1024',
    '--config.model.mlp_dim=1024',
    '--config.train.global_batch_size=4',
    "--config.train.grad_accum_steps='auto'",
    fast=True,
  )
  assert done.returncode == 1
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith(
    "error: train.grad_accum_steps='auto': even one sequence per device "
    'does not fit: the step needs '
  ), last
  needed = int(last.split('the step needs ')[1].split(' bytes')[0].replace(',', ''))
  available = int(15.75 * 2**30 * 0.9)  # XLA:TPU's available HBM x memory_fraction
  assert needed > available
  assert (
    f"remat_policy='full'), the device has {available:,} (TPU v5e: 15.75 GiB of 16 GiB HBM "
    'available to XLA x memory_fraction 0.9)'
  ) in last
  assert 'Traceback' not in done.stderr


_AUTO_SCRIPT = textwrap.dedent("""
    import json
    from realformer_jax.configs import tiny
    from realformer_jax.aot import targets, train_step
    from realformer_jax.train import build

    compiled = {}
    real_compile = build.compile_train_step

    def cached(setup):  # each accumulation compiles once
      key = (setup.spec.train.grad_accum_steps, setup.spec.model.remat_policy)
      if key not in compiled:
        compiled[key] = real_compile(setup)
      return compiled[key]

    build.compile_train_step = cached
    target = targets.parse('h100:1')

    def config(accum, fraction=0.9):
      c = tiny.get_config()
      c.train.global_batch_size = 4  # accumulation 1, 2 or 4
      c.model.dropout_rate = 0.1
      c.train.grad_accum_steps = accum
      c.train.memory_fraction = fraction
      return c

    needs = {a: train_step.compile_for_target(config(a), target).memory.needed
             for a in (1, 2, 4)}
    usable = target.chip.usable_memory_bytes
    budget = (needs[1] + needs[2]) // 2
    lines = []
    auto = train_step.compile_for_target(config('auto', budget / usable), target,
                                         log=lines.append)
    print(json.dumps({'needs': needs, 'budget': auto.budget_bytes,
                      'chosen': auto.spec.train.grad_accum_steps,
                      'need': auto.memory.needed, 'log': lines}))
""")


@pytest.mark.slow
def test_auto_accumulation_for_a_target_equals_the_hand_calculation():
  done = _run('-c', _AUTO_SCRIPT, fast=True)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  needs = {int(a): n for a, n in result['needs'].items()}
  assert needs[1] > needs[2] > needs[4], needs  # smaller microbatches, less memory
  # The hand calculation: the smallest accumulation whose step fits the target's budget.
  by_hand = min(a for a, need in needs.items() if need <= result['budget'])
  assert by_hand == 2
  assert result['chosen'] == by_hand and result['need'] == needs[by_hand]
  assert "2 microbatch(es) of 2 sequence(s) per device, remat_policy='none'" in result['log'][-1]
  assert 'NVIDIA H100 SXM 80GB' in result['log'][-1]


_ESTIMATOR_SCRIPT = textwrap.dedent("""
    import json
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from realformer_jax.aot import roofline, targets

    target = targets.parse('h100:1')
    sharding = NamedSharding(Mesh(target.devices(), ('d',)), PartitionSpec())
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sharding)
    matmul = jax.jit(jnp.matmul).lower(spec(4096, 4096), spec(4096, 4096)).compile()

    def twelve_layers(w, x):
      return jax.lax.scan(lambda h, wl: (jnp.tanh(h @ wl), None), x, w)[0]

    scan = jax.jit(twelve_layers).lower(spec(12, 1024, 1024), spec(2048, 1024)).compile()
    out = {}
    for name, program in (('matmul', matmul), ('scan', scan)):
      est = roofline.estimate(program, target)
      out[name] = {'seconds': est.seconds, 'flops': est.matmul_flops,
                   'gemms': [(k.count, k.matmul_flops, k.seconds) for k in est.kernels
                             if k.category == 'GEMM'],
                   'warnings': list(est.warnings)}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_the_estimator_on_programs_xla_compiled_for_an_h100():
  done = _run('-c', _ESTIMATOR_SCRIPT)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  rate = 805e12  # the H100's roofline bf16 rate (targets.py)
  matmul = result['matmul']
  ((count, flops, seconds),) = matmul['gemms']
  assert count == 1 and flops == 2 * 4096**3
  assert abs(seconds - (flops / rate + 2e-6)) < 1e-9 and not matmul['warnings']
  # The scan's body runs 12 times: one [2048, 1024] x [1024, 1024] GEMM per trip.
  scan = result['scan']
  assert scan['flops'] == 12 * 2 * 2048 * 1024 * 1024
  assert [c for c, _, _ in scan['gemms']] == [12] and not scan['warnings']


@pytest.mark.slow
def test_realformer_base_at_65536_tokens_fits_one_h100_with_the_qk_carry():
  # docs/performance.md's command, as written (full size: the length is the claim). Issue 33's
  # target: it fits, and the carry is the one asked for.
  text = (REPO / 'docs' / 'performance.md').read_text()
  (command,) = re.findall(
    r'^(python -m experiments\.compile (?:.*\\\n)*.*max_len=65536(?:.*\\\n)*.*)$', text, re.M
  )
  done = _run(*shlex.split(command.replace('\\\n', ' '))[1:])
  assert done.returncode == 0, done.stderr[-2000:]
  assert "residual_carry='qk'" in done.stdout and 'x 65536 tokens' in done.stdout
  needs = re.search(r'^  needs .*: fits, ', done.stdout, re.M)
  assert needs, done.stdout
  assert 'ESTIMATED step time' in done.stdout

r"""Is this project correct and fast on this machine? One command, a report to paste into a bug.

    python -m experiments.device_check [--out=report.json] [--size=auto|toy|full]

On whatever backend JAX has (a GPU, a TPU, or the CPU), in four parts:
1. the environment: Python, jax / jaxlib / plugin / libtpu versions, device kind, count, memory;
2. every attention kernel `attention_impl='auto'` can take here against the einsum path: outputs
   and parameter gradients of a two-layer encoder at the run-time self-check's tolerance
   (analysis/kernel_check.py: float32 with 'highest' matmuls and bfloat16; post / pre / realformer;
   attention dropout on, so the masks must be equal; one padded sequence; the kernels' real tile
   sizes, and a length that is not a multiple of the largest tile), PASS / FAIL with the worst
   relative error;
3. 20 training steps of a small RealFormer through the kernels and through the einsum path, from
   the same initialisation and batches: the losses must agree;
4. the train step's time and memory for post / realformer / pre (and Hugging Face's Flax BERT
   when transformers is installed) at BERT-Base 32 x 512 bfloat16, or the largest batch that
   fits, next to the deviceless compile's ESTIMATE for the same device kind when the project
   has a target for it (commands/compile.py). Every figure says whether it was measured or
   estimated.

On a GPU the Triton kernels run compiled, on a TPU the Mosaic ones. On a CPU (`--size=auto`
means toy there) both kernel families run in Pallas interpret mode at toy sizes and the timing
is of a toy model: a smoke test of the command (CI runs it), not a statement about any
accelerator. Exit status 1 when a check FAILs.
"""

import concurrent.futures
import dataclasses
import functools
import json
import platform
import subprocess
import sys
import time
from importlib import metadata

from absl import app, flags

from realformer_jax.commands.cli import fail, parse_flags
from realformer_jax.units import GiB

_OUT = flags.DEFINE_string('out', None, 'Write the report as JSON here.')
_SIZE = flags.DEFINE_enum(
  'size', 'auto', ['auto', 'toy', 'full'], 'auto: full on a GPU / TPU, toy on the CPU.'
)
_STEPS = flags.DEFINE_integer('steps', 20, 'Training steps compared, kernels vs einsum.')
_TABLE = flags.DEFINE_bool(
  'table', True, 'Part 4, the train-step table (benchmarks.device_suite runs its own).'
)
_ESTIMATE = flags.DEFINE_bool(
  'estimate', True, 'Run the deviceless compile for the ESTIMATE column (when a target exists).'
)
_JOBS = flags.DEFINE_integer(
  'jobs', 1, 'Kernel cases checked at once (threads). Their time is nearly all compilation, '
  'which runs outside the GIL: on a many-core host several cases compile side by side.'
)  # fmt: skip

PACKAGES = (
  'jax',
  'jaxlib',
  'jax-cuda13-plugin',
  'jax-cuda13-pjrt',
  'jax-cuda12-plugin',
  'jax-cuda12-pjrt',
  'libtpu',
  'flax',
  'optax',
  'transformers',
)
HEAD_DIM = {'toy': 16, 'full': 64}  # BERT's head size on a device


def environment() -> dict:
  import jax  # pylint: disable=import-outside-toplevel

  from realformer_jax import platform_choice  # pylint: disable=import-outside-toplevel

  devices = jax.devices()
  stats = devices[0].memory_stats() or {}
  versions = {}
  for name in PACKAGES:
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return {
    'python': platform.python_version(),
    'versions': versions,
    'backend': jax.default_backend(),
    'platform_choice': platform_choice.decision,
    'device_kind': devices[0].device_kind,
    'device_count': len(devices),
    'process_count': jax.process_count(),
    'memory_bytes_per_device': stats.get('bytes_limit'),
  }


# The toy size's cases, one a backend in turn: (ln_placement, dtype, length or None).
_TOY_CASES = (('realformer', 'float32', 48), ('post', 'bfloat16', None))


def kernel_cases(platform_name: str, size: str) -> list[tuple]:
  """(backend, ln_placement, dtype, length or None for the probe's, residual_carry,
  remat_policy) to compare:
  the fused backends compiled for this platform, or (a CPU) every one that runs in interpret
  mode (kernels/backends/: the registered records). A backend with residual_carry='qk'
  kernels is checked with them too (RealFormer, both dtypes): 'auto' takes the carried sum at
  the probe's length, so without these cases the qk kernels would go unchecked here. Plain
  attention under full remat has its own path too (the forward stores no mask, the backward
  draws it: KernelSpec.for_remat), checked in float32."""
  from realformer_jax.kernels import backends  # pylint: disable=import-outside-toplevel

  fused = [b for b in backends.registered() if b.fused]
  native = [b for b in fused if b.platform == platform_name]
  if size == 'toy':
    interpretable = [b for b in fused if b.interpret]
    return [
      (b.name, *_TOY_CASES[i % len(_TOY_CASES)], 'auto', 'none')
      for i, b in enumerate(interpretable)
    ]
  cases = []
  for backend in native or [b for b in fused if b.interpret]:
    # What its record says its kernels take: the compute dtypes, a carried sum or not.
    dtypes = [d for d in ('float32', 'bfloat16') if d in (backend.dtypes or (d,))]
    placements = ('post', 'pre', 'realformer') if backend.residual else ('post', 'pre')
    for dtype in dtypes:
      for placement in placements:
        cases.append((backend.name, placement, dtype, None, 'auto', 'none'))
    cases.append((backend.name, 'post', dtypes[0], None, 'auto', 'full'))
    if backend.odd_length and backend.residual:  # smaller tiles than its largest
      cases.append((backend.name, 'realformer', dtypes[0], backend.odd_length, 'auto', 'none'))
    if backend.qk:
      for dtype in dtypes:
        cases.append((backend.name, 'realformer', dtype, None, 'qk', 'none'))
  return cases


def check_kernels(
  platform_name: str, size: str, show=lambda row: None, jobs: int = 1
) -> list[dict]:
  """Every case of kernel_cases, `jobs` at a time, each passed to `show` in the cases' order
  as soon as it and the cases before it have finished (a run stopped by a timeout has
  printed those). A case's seconds are its own wall time, side by side with the others'."""
  rows = []
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    for row in pool.map(
      functools.partial(_check_case, platform_name, size), kernel_cases(platform_name, size)
    ):
      rows.append(row)
      show(row)
  return rows


def _check_case(platform_name: str, size: str, case: tuple) -> dict:
  """One kernel case against the einsum path (kernel_check.compare): its report row."""
  from realformer_jax import ModelConfig  # pylint: disable=import-outside-toplevel
  from realformer_jax.analysis import kernel_check  # pylint: disable=import-outside-toplevel
  from realformer_jax.kernels import backends
  from realformer_jax.kernels.plumbing import select  # pylint: disable=import-outside-toplevel

  backend, placement, dtype, length, carry, remat = case
  native = backends.get(backend).platform == platform_name
  config = ModelConfig(
    hidden_size=2 * HEAD_DIM[size],
    num_heads=2,
    ln_placement=placement,
    dtype=dtype,
    attention_dropout_rate=0.2,
    attention_impl=backends.get(backend).attention_impl,
    attention_platform=platform_name if native else 'cpu',
    residual_carry=carry,
    remat_policy=remat,
  )
  plan = select.plan(config, 256)
  length = length or kernel_check.check_length(plan)
  probe = kernel_check.probe_config(config, plan, length)
  tiles = select.plan(probe, length)
  start = time.perf_counter()
  verdict = kernel_check.compare(probe, length)
  return {
    'kernel': f'{backend} ({"interpret" if tiles.interpret else "compiled"})',
    'ln_placement': placement
    + (' qk' if carry == 'qk' else '')
    + (f' remat {remat}' if remat != 'none' else ''),
    'dtype': dtype + (" ('highest')" if dtype == 'float32' else ''),
    'length': length,
    'tiles': [tiles.block_q, tiles.block_k, tiles.block_bwd],
    'head_dim': HEAD_DIM[size],
    'passed': verdict.ok,
    'worst_relative_error': verdict.worst,
    'why': verdict.why,
    'seconds': round(time.perf_counter() - start, 2),
  }


def record_passes(device_kind: str, rows: list[dict], show) -> list[str]:
  """For each backend that 'auto' takes only after a passed check (its record's
  after_device_check: the Hopper kernels), the pass written where the train setup reads it
  (analysis/device_checks.py), or why not; the backends recorded."""
  from realformer_jax.analysis import device_checks  # pylint: disable=import-outside-toplevel
  from realformer_jax.kernels import backends  # pylint: disable=import-outside-toplevel

  trusted = []
  for backend in backends.registered():
    if not backend.after_device_check or not any(
      r['kernel'].startswith(backend.name + ' ') for r in rows
    ):
      continue
    if device_checks.record(backend.name, device_kind, rows):
      trusted.append(backend.name)
      show(f'recorded: every {backend.name} case passed on {device_kind}; attention_impl='
           f"'auto' takes it here once the device suite also times it faster than the default "
           'kernels (device_checks.record_speed; this jax, this kernel source)')  # fmt: skip
    else:
      show(f'not recorded: a {backend.name} case failed or did not run compiled; '
           "'auto' keeps the platform's default kernels")  # fmt: skip
  return trusted


def _shape(size: str, batch: int):
  from realformer_jax.bench import steps  # pylint: disable=import-outside-toplevel

  if size == 'toy':
    return steps.Shape('toy', hidden=32, layers=2, heads=2, vocab=500, seq_len=32, batch=batch,
                       predictions=5)  # fmt: skip
  return steps.Shape('bert_base', hidden=768, layers=12, heads=12, vocab=30522, seq_len=512,
                     batch=batch, predictions=76)  # fmt: skip


def _train_losses(shape, impl: str, num_steps: int) -> tuple[list[float], dict]:
  """The losses of `num_steps` steps, and the step's measured time (median after the first)
  and compiled memory."""
  import jax  # pylint: disable=import-outside-toplevel

  from realformer_jax.bench import compiled_steps, steps  # pylint: disable=import-outside-toplevel

  # attention_check=False: the kernels themselves, never the self-check's fallback.
  config = steps.train_config(
    shape, ln_placement='realformer', attention_impl=impl, attention_check=False
  )
  config.train.warmup_steps = 2
  config.train.learning_rate = 1e-3
  step = steps.make_project_step(config, steps.make_batch(shape, 0))
  start = time.perf_counter()
  with step.context():
    compiled = step.fn.lower(step.state, step.batch, step.rng).compile()
  compile_s = time.perf_counter() - start
  state, losses, times = step.state, [], []
  for i in range(num_steps):
    batch = steps.make_batch(shape, i)
    batch = jax.tree.map(lambda x, ref: jax.device_put(x, ref.sharding), batch, step.batch)
    start = time.perf_counter()
    state, metrics = compiled(state, batch, jax.random.fold_in(step.rng, i))
    losses.append(float(metrics['mlm_loss_sum']) / max(float(metrics['mlm_weight']), 1.0))
    times.append(time.perf_counter() - start)
  timing = {'compile_s': compile_s, 'times': sorted(times[1:] or times)}
  timing['memory'] = compiled_steps.memory_stats(compiled).get('peak')
  return losses, timing


def check_training(platform_name: str, size: str, num_steps: int) -> dict:
  from realformer_jax.bench import steps  # pylint: disable=import-outside-toplevel

  head_dim, length = (16, 32) if size == 'toy' else (64, 256)
  shape = steps.Shape('small', hidden=2 * head_dim, layers=2, heads=2, vocab=500,
                      seq_len=length, batch=8, predictions=5)  # fmt: skip
  kernel = 'pallas'  # the platform's kernels (interpret mode on the CPU)
  kernels_losses, _ = _train_losses(shape, kernel, num_steps)
  einsum_losses, einsum_timing = _train_losses(shape, 'xla', num_steps)
  worst = max(abs(a - b) / abs(b) for a, b in zip(kernels_losses, einsum_losses))
  limit = 1e-3
  return {
    'model': f'RealFormer {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, '
    f'batch {shape.batch} x {shape.seq_len}, dropout 0.1, float32',
    'attention_impl': kernel,
    'steps': num_steps,
    'losses_kernels': kernels_losses,
    'losses_einsum': einsum_losses,
    'worst_relative_difference': worst,
    'limit': limit,
    'passed': bool(worst <= limit),
    'shape': shape,
    'einsum_timing': einsum_timing,
  }


def _target_for(device_kind: str):
  """The one-device deviceless target of this device kind (aot/targets.py), or None."""
  from realformer_jax.aot import targets  # pylint: disable=import-outside-toplevel

  chip = targets.chip_of_device_kind(device_kind)
  if chip is None:
    return None
  if chip.platform == 'cuda':
    return f'{chip.name}:1'
  return f'{chip.name}:1x1' if chip.name in ('v5e', 'v6e') else f'{chip.name}:1x1x1'


def _estimate(target: str, which: str, batch: int, dtype: str) -> dict:
  command = [
    sys.executable, '-m', 'experiments.device_estimate', f'--target={target}',
    f'--which={which}', f'--batch={batch}', '--seq_len=512', f'--dtype={dtype}',
  ]  # fmt: skip
  result = subprocess.run(command, capture_output=True, text=True, timeout=600)
  lines = result.stdout.strip().splitlines()
  try:
    return json.loads(lines[-1])
  except (IndexError, ValueError):
    return {'error': (result.stderr.strip().splitlines() or ['no output'])[-1][:300]}


def _is_out_of_memory(e: Exception) -> bool:
  text = str(e)
  return 'RESOURCE_EXHAUSTED' in text or 'out of memory' in text.lower()


def _row(which: str, shape, dtype: str, compile_s: float, times: list, memory) -> dict:
  times = sorted(times)
  return {
    'model': which,
    'shape': f'{shape.batch} x {shape.seq_len}, hidden {shape.hidden}, {shape.layers} layers, '
    f'{dtype}',
    'batch': shape.batch,
    'compile_s (measured)': round(compile_s, 2),
    'step_s (measured, median)': times[len(times) // 2],
    'memory_bytes (compiled buffer assignment)': memory,
  }


def measure_steps(size: str, device_kind: str, estimate: bool, training: dict) -> dict:
  """Median step time (measured) and memory of each candidate, at the largest batch <= 32 that
  compiles and runs; the deviceless ESTIMATE beside it when a target exists. At toy size the
  realformer row is the training check's einsum step (same shape: one compile fewer)."""
  from realformer_jax.bench import compiled_steps  # pylint: disable=import-outside-toplevel

  dtype = 'float32' if size == 'toy' else 'bfloat16'
  timed = 3 if size == 'toy' else 10
  candidates = ['post', 'realformer', 'pre']
  try:
    import transformers  # pylint: disable=import-outside-toplevel

    if size == 'full' and hasattr(transformers, 'FlaxBertForMaskedLM'):
      candidates.append('hf')
  except ImportError:
    pass
  target = _target_for(device_kind) if size == 'full' else None
  rows = []
  for which in candidates:
    if size == 'toy' and which == 'realformer':
      t = training['einsum_timing']
      rows.append(_row(which, training['shape'], dtype, t['compile_s'], t['times'], t['memory']))
      continue
    row = {'model': which}
    for batch in (8,) if size == 'toy' else (32, 16, 8, 4):
      shape = _shape(size, batch)
      try:
        step = compiled_steps.CompiledStep(
          which, compiled_steps.build_step(shape, which, 0.1, dtype=dtype)
        )
        step()  # warm-up
        times = []
        for _ in range(timed):
          start = time.perf_counter()
          step()
          times.append(time.perf_counter() - start)
      except Exception as e:  # pylint: disable=broad-except
        if _is_out_of_memory(e) and batch > 4:
          continue
        row['error'] = f'{type(e).__name__}: {str(e).strip()[:200]}'
        break
      row = _row(which, shape, dtype, step.compile_s, times, step.memory.get('peak'))
      row['device_peak_bytes_so_far (measured)'] = compiled_steps.device_peak_bytes()
      if target and estimate and which != 'hf':
        row['ESTIMATE'] = _estimate(target, which, batch, dtype)
      del step
      break
    rows.append(row)
  return {'size': size, 'target_for_estimates': target, 'rows': rows}


def _fmt(value, unit='') -> str:
  if value is None:
    return '-'
  if unit == 'ms':
    return f'{value * 1e3:.1f} ms'
  if unit == 'GiB':
    return f'{value / GiB:.2f} GiB' if value >= GiB else f'{value * 1024 / GiB:.1f} MiB'
  return str(value)


def render_head(report: dict) -> list[str]:
  env = report['environment']
  lines = [
    f'device_check: {env["device_count"]} x {env["device_kind"]} ({env["backend"]}), '
    f'python {env["python"]}, ' + ', '.join(f'{k} {v}' for k, v in env['versions'].items()),
    f'  memory per device {_fmt(env["memory_bytes_per_device"], "GiB")}; platform: '
    f'{env["platform_choice"]}',
  ]
  if report['size'] == 'toy':
    lines.append(
      '  TOY SIZE on the CPU: kernels in interpret mode, a toy model timed; says nothing '
      'about a GPU or TPU'
    )
  lines.append('attention kernels vs the einsum path (outputs and gradients, dropout, padding):')
  return lines


def kernel_line(row: dict) -> str:
  return (
    f'  {"PASS" if row["passed"] else "FAIL"} {row["kernel"]:<19} {row["ln_placement"]:<13} '
    f'{row["dtype"]:<20} L={row["length"]:<4} tiles {row["tiles"]}: {row["why"]} '
    f'({row["seconds"]} s)'
  )


def training_line(t: dict) -> str:
  return (
    f'{"PASS" if t["passed"] else "FAIL"} {t["steps"]} training steps, {t["attention_impl"]} '
    f'vs xla: worst loss difference {t["worst_relative_difference"]:.1e} (limit '
    f'{t["limit"]:.0e}); last loss {t["losses_kernels"][-1]:.4f} vs {t["losses_einsum"][-1]:.4f}'
  )


def render_steps(report: dict) -> list[str]:
  env, size = report['environment'], report['size']
  lines = [f'train step ({size} size; measured on this machine unless ESTIMATE):']
  for row in report['steps']['rows']:
    if 'error' in row:
      lines.append(f'  {row["model"]:<11} error: {row["error"]}')
      continue
    line = (
      f'  {row["model"]:<11} {row["shape"]}: {_fmt(row["step_s (measured, median)"], "ms")} '
      f'measured, compile {row["compile_s (measured)"]} s, buffers '
      f'{_fmt(row["memory_bytes (compiled buffer assignment)"], "GiB")}'
    )
    estimate = row.get('ESTIMATE')
    if estimate:
      line += f' | ESTIMATE {report["steps"]["target_for_estimates"]}: ' + (
        f'{_fmt(estimate["step_s"], "ms")}, {_fmt(estimate["memory_bytes"], "GiB")}'
        if 'error' not in estimate
        else estimate['error']
      )
    lines.append(line)
  if report['steps'].get('skipped'):
    lines.append(f'  (skipped: {report["steps"]["skipped"]})')
  elif report['steps']['target_for_estimates'] is None:
    lines.append(f'  (no deviceless ESTIMATE: no compile target for {env["device_kind"]!r})')
  return lines


def _write(report: dict) -> None:
  """The report so far (after every part: a run stopped by a timeout keeps what it did)."""
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      json.dump(report, f, indent=1, default=str)


def main(argv):
  if len(argv) > 1:
    fail(f'unexpected arguments: {argv[1:]}')
  if _STEPS.value < 1:
    fail(f'--steps={_STEPS.value}: must be at least 1')
  if _JOBS.value < 1:
    fail(f'--jobs={_JOBS.value}: must be at least 1')
  import jax  # pylint: disable=import-outside-toplevel

  from realformer_jax import kernels  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  env = environment()
  platform_name = kernels.platform_of(jax.devices())
  size = _SIZE.value if _SIZE.value != 'auto' else ('toy' if platform_name == 'cpu' else 'full')
  report = {'environment': env, 'size': size}
  show = functools.partial(print, flush=True)
  for line in render_head(report):
    show(line)
  report['kernels'] = check_kernels(
    platform_name, size, lambda row: show(kernel_line(row)), _JOBS.value
  )
  report['trusted'] = record_passes(env['device_kind'], report['kernels'], show)
  _write(report)
  training = check_training(platform_name, size, _STEPS.value)
  show(training_line(training))
  report['steps'] = (
    measure_steps(size, env['device_kind'], _ESTIMATE.value, training)
    if _TABLE.value
    else {'size': size, 'target_for_estimates': None, 'rows': [], 'skipped': '--notable'}
  )
  for line in render_steps(report):
    show(line)
  training.pop('einsum_timing')
  training['shape'] = dataclasses.asdict(training['shape'])
  report['training'] = training
  report['passed'] = all(r['passed'] for r in report['kernels']) and training['passed']
  report['seconds'] = round(time.perf_counter() - start, 1)
  show(f'overall: {"PASS" if report["passed"] else "FAIL"}')
  _write(report)
  if _OUT.value:
    show(f'report: {_OUT.value} ({report["seconds"]} s)')
  if not report['passed']:
    sys.exit(1)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

"""The accelerator benchmark without the accelerator: every candidate's train step compiled for
an H100 (or a TPU v5p chip) on this host and judged by the roofline estimator. ESTIMATES, not
measurements.

    python -m benchmarks.run --profile aot-h100    # ~15-25 min on 2 CPU cores; resumes
    python -m benchmarks.run --profile aot-v5p

Candidates and shapes are the accelerator profile's (benchmarks/profiles.py): ours (post,
realformer, pre; rolled layer scan) and Hugging Face's FlaxBertForMaskedLM, bfloat16 compute with
float32 parameters, dropout 0.1, at BERT-Base and BERT-Large 32 x 512 and BERT-Base 128 x 128,
on one device. Each step is compiled by XLA for the target (deviceless) and read with
realformer_jax/aot/roofline.py: estimated step time, MFU against the datasheet bf16 peak,
non-GEMM HBM bytes, kernel launches, XLA's step memory, time by category and the ten dearest
kernels. Each candidate's result is written to docs/results/aot/<profile>/runs/ as it finishes
(a rerun skips finished ones); results.md and results.json are rewritten at the end.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import os
import time
from typing import Callable, Optional

import jax

from benchmarks import flops as flops_lib
from benchmarks.profiles import BASE_128, BASE_512, LARGE_512, TINY
from realformer_jax.aot import roofline, targets
from realformer_jax.bench import steps
from realformer_jax.studies import runs as runs_lib
from realformer_jax.train import build, pretraining
from realformer_jax.units import GiB

CANDIDATES = ('post', 'realformer', 'pre', 'hf')
LABELS = {
  'post': 'ours post',
  'realformer': 'ours realformer',
  'pre': 'ours pre',
  'hf': 'HF FlaxBertForMaskedLM',
}
RESULTS_DIR = os.path.join('docs', 'results', 'aot')


@dataclasses.dataclass(frozen=True)
class AotProfile:
  target: str  # targets.parse spec, one device
  shapes: tuple
  candidates: tuple = CANDIDATES
  dtype: str = 'bfloat16'
  dropout: float = 0.1
  scan_unroll: int = 1  # ours: the rolled layer scan (the accelerator profile takes 'auto')


AOT_PROFILES = {
  'aot-h100': AotProfile('h100:1', (BASE_512, LARGE_512, BASE_128)),
  # One v5p chip (96 GiB): every candidate fits, so every candidate compiles (XLA:TPU does not
  # compile a program larger than the chip's HBM).
  'aot-v5p': AotProfile('v5p:1x1x1', (BASE_512, LARGE_512, BASE_128)),
  # The profiles' code path at toy shape (the smoke test): ours and Hugging Face's step.
  'aot_tiny': AotProfile('h100:1', (TINY,), candidates=('realformer', 'hf')),
}


def compile_candidate(
  shape: steps.Shape, which: str, profile: AotProfile, devices: list
) -> jax.stages.Compiled:
  """The benchmark's train step for `which` ('post' | 'realformer' | 'pre' | 'hf'), compiled
  for `devices` (one compile-only device of the target)."""
  if which == 'hf':
    return steps.compile_hf_step(shape, devices, dropout=profile.dropout, dtype=profile.dtype)
  config = steps.train_config(
    shape,
    ln_placement=which,
    dropout=profile.dropout,
    dtype=profile.dtype,
    scan_unroll=profile.scan_unroll,
  )
  spec = pretraining.validate_config(config, device_count=len(devices), process_count=1)
  return build.compile_train_step(build.make_setup(spec, devices))


def measure_candidate(
  shape: steps.Shape, which: str, profile: AotProfile, target: targets.Target, devices: list
) -> dict:
  """One candidate's estimate (JSON-serialisable)."""
  start = time.perf_counter()
  try:
    compiled = compile_candidate(shape, which, profile, devices)
  except jax.errors.JaxRuntimeError as e:  # XLA:TPU: larger than the chip's HBM
    required = build.out_of_memory_bytes(e)
    if required is None:
      raise
    return {'fits': False, 'required_bytes': required, 'compile_s': time.perf_counter() - start}
  compile_s = time.perf_counter() - start
  est = roofline.estimate(compiled, target, score_dims=(shape.seq_len, shape.seq_len))
  peak = targets.mfu_peak_flops(target.chip)
  model_flops = flops_lib.model_flops(shape)
  return {
    'fits': True,
    'compile_s': compile_s,
    'memory_bytes': build.step_memory_bytes(compiled),
    'step_seconds': est.seconds,
    'compute_seconds': est.compute_seconds,
    'mfu': model_flops / est.seconds / peak,
    'model_flops': model_flops,
    'matmul_flops': est.matmul_flops,
    'hbm_bytes': est.hbm_bytes,
    'non_gemm_bytes': est.non_gemm_bytes,
    'launches': est.launches,
    'by_category': est.by_category(),
    'warnings': list(est.warnings),
    'xla_optimal_seconds': est.xla_optimal_seconds,
    'top': [
      {
        'kernel': g.name,
        'category': g.first.category,
        'bound': g.first.bound,
        'count': g.count,
        'total_ms': g.total_seconds * 1e3,
        'bytes': g.first.bytes,
        'shape': g.first.shape,
        'op_name': g.first.op_name[-80:],
      }
      for g in est.top_ops(10)
    ],
  }


def run(
  profile_name: str, out_dir: Optional[str] = None, out: Callable[[str], None] = print
) -> dict:
  profile = AOT_PROFILES[profile_name]
  out_dir = out_dir or os.path.join(RESULTS_DIR, profile_name)
  target = targets.parse(profile.target)
  devices = target.devices()[:1]
  grid = runs_lib.Grid(
    out_dir,
    [
      runs_lib.Run(
        f'{shape.name}-{which}',
        {'shape': shape.name, 'candidate': which},
        cost=shape.layers * (2 if which == 'hf' else 1),
      )
      for shape in profile.shapes
      for which in profile.candidates
    ],
    identity=runs_lib.code_identity(),  # a row of other code is compiled again
  )
  shapes = {s.name: s for s in profile.shapes}

  def one(run: runs_lib.Run, report) -> dict:
    report(0.0, 'compiling for ' + target.describe())
    return measure_candidate(
      shapes[run.params['shape']], run.params['candidate'], profile, target, devices
    )

  results = grid.run(one)
  summary = {'meta': _meta(profile_name, profile, target), 'runs': results}
  runs_lib.write_json(os.path.join(out_dir, 'results.json'), summary)
  markdown = render(summary, profile)
  with open(os.path.join(out_dir, 'results.md'), 'w') as f:
    f.write(markdown)
  out(markdown)
  out(f'wrote {out_dir}/results.md, results.json')
  return summary


def _meta(profile_name: str, profile: AotProfile, target: targets.Target) -> dict:
  versions = {}
  for package in ('jax', 'jaxlib', 'jax-cuda13-plugin', 'libtpu', 'flax', 'transformers'):
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  chip = target.chip
  return {
    'profile': profile_name,
    'target': target.describe(),
    'date': datetime.datetime.now().isoformat(timespec='seconds'),
    'versions': versions,
    'dtype': profile.dtype,
    'dropout': profile.dropout,
    'datasheet_bf16_flops': chip.matmul_flops['bf16'],
    'roofline_bf16_flops': chip.roofline_matmul_flops['bf16'],
    'roofline_hbm_bytes_per_s': chip.roofline_hbm_bytes_per_s,
    'launch_overhead_s': chip.launch_overhead_s,
  }


def render(summary: dict, profile: AotProfile) -> str:
  """results.md: the summary table, time by category, and each candidate's top-10 kernels."""
  meta, results = summary['meta'], summary['runs']
  lines = [
    f"# Estimated from XLA's compile for {meta['target']} on a CPU host",
    '',
    f'ESTIMATES (realformer_jax/aot/roofline.py), not measurements. {meta["date"]}; '
    + ', '.join(f'{k} {v}' for k, v in meta['versions'].items())
    + '. '
    f'{profile.dtype} compute, float32 parameters, dropout {profile.dropout}; ours with the '
    f'rolled layer scan; one device. MFU = model FLOPs (benchmarks/flops.py) / estimated step / '
    f'datasheet bf16 peak {meta["datasheet_bf16_flops"] / 1e12:.1f} TFLOP/s. Roofline rates: '
    f'{meta["roofline_bf16_flops"] / 1e12:.0f} TFLOP/s bf16, '
    f'{meta["roofline_hbm_bytes_per_s"] / 1e12:.2f} TB/s HBM, '
    f'{meta["launch_overhead_s"] * 1e6:.0f} us per kernel launch.',
    '',
    '| shape | model | est. step (ms) | est. MFU | non-GEMM HBM (GB) | kernel launches | '
    'XLA step memory (GiB) | largest categories (ms) |',
    '|---|---|---:|---:|---:|---:|---:|---|',
  ]
  for shape in profile.shapes:
    for which in profile.candidates:
      r = results.get(f'{shape.name}-{which}')
      if r is None:
        continue
      name = f'{shape.name} ({shape.batch} x {shape.seq_len})'
      if not r['fits']:
        lines.append(
          f'| {name} | {LABELS[which]} | does not fit: XLA needs '
          f'{r["required_bytes"] / GiB:.1f} GiB | | | | | |'
        )
        continue
      dearest = sorted(r['by_category'].items(), key=lambda kv: -kv[1])[:3]
      top = ', '.join(f'{c} {s * 1e3:.1f}' for c, s in dearest)
      lines.append(
        f'| {name} | {LABELS[which]} | {r["step_seconds"] * 1e3:.1f} | '
        f'{r["mfu"]:.3f} | {r["non_gemm_bytes"] / 1e9:.1f} | {r["launches"]:,} | '
        f'{r["memory_bytes"] / GiB:.2f} | {top} |'
      )
  optimal = [
    (k, r['xla_optimal_seconds'])
    for k, r in results.items()
    if r.get('xla_optimal_seconds') is not None
  ]
  if optimal:
    lines += [
      '',
      "XLA's own cost analysis (optimal_seconds, counts each loop body once): "
      + ', '.join(f'{k} {s * 1e3:.2f} ms' for k, s in optimal),
    ]
  warnings = [f'{name}: {w}' for name, r in sorted(results.items()) for w in r.get('warnings', [])]
  if warnings:
    lines += ['', 'Warnings (kernels the roofline cannot judge):', '']
    lines += [f'- {w}' for w in warnings]
  for shape in profile.shapes:
    for which in profile.candidates:
      r = results.get(f'{shape.name}-{which}')
      if not r or not r['fits']:
        continue
      lines += [
        '',
        f'## {shape.name}, {LABELS[which]}: the ten dearest kernels',
        '',
        'Kernels doing the same jax op on the same shape are summed (HF runs one per '
        'layer, ours one in a loop of as many trips); runs = executions per step.',
        '',
        '| kernel | category | bound | runs | est. ms/step | result | jax op |',
        '|---|---|---|---:|---:|---|---|',
      ]
      for k in r['top']:
        op = k['op_name'].split('/')[-1] if k['op_name'] else ''
        lines.append(
          f'| {k["kernel"]} | {k["category"]} | {k["bound"]} | {k["count"]} | '
          f'{k["total_ms"]:.2f} | `{k["shape"]}` | {op} |'
        )
  return '\n'.join(lines) + '\n'

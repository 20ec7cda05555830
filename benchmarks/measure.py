"""The measured sections of a benchmark run: interleaved train-step timing (with profiler
breakdowns on accelerators), compile times and XLA memory."""

from __future__ import annotations

import dataclasses
import gc
import glob
import os
import tempfile
from typing import Optional, Sequence

import jax

from benchmarks import flops as flops_lib
from benchmarks import trace_breakdown
from benchmarks.profiles import LAYOUTS, Profile
from benchmarks.report import Report
from benchmarks.timing import Candidate, MatmulPeak, interleave, per_round_ratio
from realformer_jax.aot import targets
from realformer_jax.bench import steps
from realformer_jax.bench.compiled_steps import CompiledStep, build_step, device_peak_bytes


def trace_file(candidate: CompiledStep, steps_to_trace: int, directory: str) -> str:
  """Profile `steps_to_trace` steps of `candidate` into `directory`; the trace's path."""
  jax.block_until_ready(candidate.state)
  with jax.profiler.trace(directory):
    for _ in range(steps_to_trace):
      candidate()
  paths = sorted(
    glob.glob(os.path.join(directory, '**', '*.xplane.pb'), recursive=True), key=os.path.getmtime
  )
  return paths[-1]


def trace_categories(
  candidate: CompiledStep, steps_to_trace: int, score_dims, trace_dir: Optional[str]
) -> dict[str, float]:
  """Device seconds per step by category (trace_breakdown.py) over `steps_to_trace` steps."""
  directory = trace_dir and os.path.join(trace_dir, candidate.name)
  with tempfile.TemporaryDirectory() as scratch:
    path = trace_file(candidate, steps_to_trace, directory or scratch)
    categories = trace_breakdown.categorize_hlo(candidate.compiled.as_text(), score_dims)
    return trace_breakdown.device_time_by_category(path, categories, steps_to_trace)


# ---------------------------------------------------------------------------------------------
# Sections.


def compile_candidate(shape: steps.Shape, name: str, profile: Profile, dropout: float):
  """One candidate of the step table ('post' | 'realformer' | 'pre' | 'hf'), compiled with its
  state: ours on the profile's scan unroll (fully unrolled where it names none)."""
  unroll = profile.scan_unroll or shape.layers
  overrides = {} if name == 'hf' else {'scan_unroll': unroll}
  return CompiledStep(name, build_step(shape, name, dropout, dtype=profile.dtype, **overrides))


def measure_train_steps(
  report: Report,
  shape: steps.Shape,
  profile: Profile,
  dropout: float,
  peak: MatmulPeak,
  log,
  trace_dir: Optional[str] = None,
  precompiled: Optional[dict] = None,
) -> dict:
  """Step time, tokens/s, MFU and ratios for post / realformer / pre / HF at one shape.
  `precompiled`: candidates already compiled (compile_candidate), e.g. side by side."""
  section = f'train_{shape.name}'
  model_flops = flops_lib.model_flops(shape)
  compiled: dict[str, CompiledStep] = dict(precompiled or {})
  times: dict[str, list] = {k: [] for k in ('hf',) + LAYOUTS}
  peaks: dict[str, list] = {k: [] for k in times}
  ratios: dict[str, list] = {
    'post_vs_hf': [],
    'realformer_vs_post': [],
    'pre_vs_post': [],
    'realformer_vs_hf': [],
    'pre_vs_hf': [],
  }
  hf_memory: dict = {}
  device_peaks: dict[str, int] = {}
  breakdowns: dict[str, dict] = {}
  groups = (
    [['post', 'hf'], ['post', 'realformer', 'pre']]
    if shape.name in profile.split_groups
    else [['post', 'realformer', 'pre', 'hf']]
  )
  for group in groups:
    for name in group:
      if name not in compiled:
        log(f'[{shape.name}] compiling {name} train step')
        compiled[name] = compile_candidate(shape, name, profile, dropout)
        report.add(
          section,
          f'{_label(name)} compile (trace+lower+compile)',
          's',
          compiled[name].lower_s + compiled[name].compile_s,
        )
    candidates = [Candidate(name, compiled[name]) for name in group]
    round_peaks: list[float] = []

    def on_round(r, candidates=candidates, round_peaks=round_peaks):
      round_peaks.append(peak.measure())
      done = ', '.join(f'{c.name} {c.times[-1]:.3f}s' for c in candidates)
      log(f'[{shape.name}] round {r + 1}/{profile.rounds}: {done}; load {os.getloadavg()[0]:.2f}')

    interleave(candidates, profile.rounds, profile.warmup, on_round)
    for c in candidates:
      times[c.name].extend(c.times)
      peaks[c.name].extend(round_peaks)
    device_peak = device_peak_bytes()
    if device_peak is not None:
      device_peaks['+'.join(group)] = device_peak
    if profile.trace_steps:
      for name in group:
        if name not in breakdowns:
          log(f'[{shape.name}] tracing {profile.trace_steps} {name} step(s)')
          breakdowns[name] = trace_categories(
            compiled[name], profile.trace_steps, (shape.seq_len, shape.seq_len), trace_dir
          )
    t = {c.name: c.times for c in candidates}
    if 'hf' in t:
      for name in LAYOUTS:
        if name in t:
          key = 'post_vs_hf' if name == 'post' else f'{name}_vs_hf'
          ratios[key].extend(per_round_ratio(t['hf'], t[name]))  # tokens/s ours / HF
    for name in ('realformer', 'pre'):
      if name in t and 'post' in t:
        ratios[f'{name}_vs_post'].extend(per_round_ratio(t[name], t['post']))
    if 'hf' in group:
      losses = {name: compiled[name].loss() for name in group}
      log(
        f'[{shape.name}] losses after warm-up and timing: '
        + ', '.join(f'{k} {v:.3f}' for k, v in losses.items())
      )
      hf_memory = compiled.pop('hf').memory  # drop HF's state before the next group
      gc.collect()

  for name in ('post', 'realformer', 'pre', 'hf'):
    label = 'HF FlaxBertForMaskedLM' if name == 'hf' else name
    report.add(section, f'{label} step time', 's', times[name])
  for name in ('post', 'realformer', 'pre', 'hf'):
    label = 'HF FlaxBertForMaskedLM' if name == 'hf' else name
    report.add(section, f'{label} tokens/s', 'tok/s', [shape.tokens / t for t in times[name]])
  report.add(
    section, 'tokens/s ratio post / HF', 'x', ratios['post_vs_hf'], 'per round: HF time / post time'
  )
  report.add(section, 'tokens/s ratio realformer / HF', 'x', ratios['realformer_vs_hf'])
  report.add(section, 'tokens/s ratio pre / HF', 'x', ratios['pre_vs_hf'])
  report.add(
    section, 'step time realformer / post', 'x', ratios['realformer_vs_post'], 'RealFormer overhead'
  )
  report.add(section, 'step time pre / post', 'x', ratios['pre_vs_post'])
  report.add(
    section,
    f'matmul peak ({_dtype_name(profile.dtype)} {profile.peak_n}^3, best of 3/round)',
    'GFLOP/s',
    [p / 1e9 for p in peaks['post']],
  )
  report.add(
    section, 'model FLOPs per step', 'GFLOP', model_flops / 1e9, 'formula in benchmarks/flops.py'
  )
  report.add(
    section,
    'HF executed FLOPs per step',
    'GFLOP',
    flops_lib.hf_executed_flops(shape) / 1e9,
    'MLM head at every position',
  )
  # MFU on an accelerator the project knows: against its datasheet peak, the one every MFU
  # figure uses (aot/targets.mfu_peak_flops); elsewhere (a CPU) against the matmul timed here.
  chip = targets.chip_of_device_kind(jax.devices()[0].device_kind)
  for name in ('post', 'realformer', 'pre', 'hf'):
    label = 'HF' if name == 'hf' else name
    fixed = [targets.mfu_peak_flops(chip)] * len(times[name]) if chip else peaks[name]
    report.add(
      section,
      f'MFU {label} (model FLOPs / time / '
      + (f'{chip.name} datasheet bf16 peak)' if chip else 'measured matmul peak)'),
      'frac',
      [model_flops / t / p for t, p in zip(times[name], fixed)],
    )
  for name in ('post', 'realformer', 'pre'):
    if compiled.get(name) and compiled[name].memory:
      report.add(
        section,
        f'{name} XLA step memory (args + out + temp - aliased)',
        'MB',
        compiled[name].memory['peak'] / 1e6,
      )
  for group, peak_bytes in device_peaks.items():
    report.add(
      section,
      f'device peak bytes in use after {group}',
      'MB',
      peak_bytes / 1e6,
      'memory_stats high-water mark of the process so far',
    )
  for name, breakdown in breakdowns.items():
    for category, seconds in breakdown.items():
      report.add(f'trace_{shape.name}', f'{_label(name)}: {category}', 'ms', seconds * 1e3)
    report.add(
      f'trace_{shape.name}',
      f'{_label(name)}: total device time',
      'ms',
      sum(breakdown.values()) * 1e3,
    )
  return {
    'ratios': ratios,
    'times': times,
    'peaks': peaks,
    'mfu_peak': targets.mfu_peak_flops(chip) if chip else None,
    'model_flops': model_flops,
    'hf_memory': hf_memory,
    'post_memory': compiled['post'].memory,
    'breakdowns': breakdowns,
  }


def _label(name: str) -> str:
  return 'HF FlaxBertForMaskedLM' if name == 'hf' else name


def _dtype_name(dtype: str) -> str:
  return {'float32': 'f32', 'bfloat16': 'bf16', 'float16': 'f16'}[dtype]


def measure_compile_times(report: Report, profile: Profile, dropout: float, log) -> dict:
  """Trace + lower + compile of the post train step at several depths, scanned vs loop."""
  section = 'compile'
  results = {}
  for scan in (True, False):
    for layers in profile.compile_layers:
      shape = dataclasses.replace(profile.compile_shape, layers=layers)
      repeats = profile.compile_repeats if scan else 1
      totals, compiles = [], []
      for _ in range(repeats):
        step = build_step(
          shape, 'post', dropout, abstract=True, scan_layers=scan, dtype=profile.dtype
        )
        c = CompiledStep('post', step)
        totals.append(c.lower_s + c.compile_s)
        compiles.append(c.compile_s)
        del c, step
        gc.collect()
      kind = 'scanned' if scan else 'loop'
      log(f'[compile] {kind} {layers} layers: {min(totals):.1f}s')
      report.add(section, f'{kind:7s} {layers:2d} layers: trace+lower+compile', 's', totals)
      report.add(section, f'{kind:7s} {layers:2d} layers: XLA compile only', 's', compiles)
      results[(kind, layers)] = totals
  return results


def measure_memory(
  report: Report,
  shape: steps.Shape,
  remats: Sequence[str],
  dropout: float,
  timed_post_memory: dict,
  hf_memory: dict,
  log,
  dtype: str = 'float32',
) -> dict:
  """XLA buffer sizes of the train step: each remat policy of `remats`, post vs realformer, on
  the rolled layer scan (where remat applies per layer); plus the unrolled post step timed
  above."""
  section = 'memory'
  stats = {}
  for layout in ('post', 'realformer'):
    for remat in remats:
      log(f'[memory] compiling {layout} remat={remat}')
      c = CompiledStep(
        layout,
        build_step(
          shape, layout, dropout, abstract=True, remat_policy=remat, scan_unroll=1, dtype=dtype
        ),
      )
      m = c.memory
      del c
      gc.collect()
      stats[(layout, remat)] = m
      if not m:
        continue
      report.add(
        section,
        f'{layout:10s} remat={remat:5s} peak',
        'MB',
        m['peak'] / 1e6,
        f'temp {m["temp"] / 1e6:.0f} MB, args {m["argument"] / 1e6:.0f} MB',
      )
  if timed_post_memory:
    m = timed_post_memory
    report.add(
      section,
      'post unrolled scan, remat=none peak',
      'MB',
      m['peak'] / 1e6,
      f'temp {m["temp"] / 1e6:.0f} MB (the step timed above)',
    )
  if hf_memory:
    m = hf_memory
    report.add(
      section,
      'HF FlaxBertForMaskedLM peak',
      'MB',
      m['peak'] / 1e6,
      f'temp {m["temp"] / 1e6:.0f} MB',
    )
  scores = shape.layers * shape.batch * shape.heads * shape.seq_len**2 * 4
  for remat in remats:
    a, b = stats.get(('realformer', remat)), stats.get(('post', remat))
    if a and b:
      report.add(
        section,
        f'realformer - post temp, remat={remat}',
        'MB',
        (a['temp'] - b['temp']) / 1e6,
        f'one [N,B,H,L,L] f32 stack = {scores / 1e6:.0f} MB',
      )
  return stats

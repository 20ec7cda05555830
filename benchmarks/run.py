"""Speed, memory and compile time of our train step, side by side with Hugging Face Flax BERT.

  python -m benchmarks.run            # full run, both target shapes (< 10 min on 2 cores)
  python -m benchmarks.run --quick    # smoke run, small shape only (< 2 min)
  python -m benchmarks.run --json results.json
  python -m benchmarks.run --profile accelerator   # GPU / TPU: bf16, BERT-Base/Large at 32x512

The accelerator profile (any JAX backend; meant for one GPU or TPU chip) runs bfloat16 compute
with float32 parameters, dropout 0.1, BERT-Base and BERT-Large at 32 x 512 and BERT-Base at
128 x 128, post / realformer / pre against Hugging Face's FlaxBertForMaskedLM in bfloat16; MFU
against a bfloat16 8192^3 matmul timed in the same rounds; compile times; XLA's memory figures
and the device's own peak (`memory_stats`); and a per-category device-time breakdown of every
step from a profiler trace (benchmarks/trace_breakdown.py; `--trace_dir` keeps the traces).

Everything is measured in ONE process, in interleaved rounds (one step of every candidate per
round, order rotated), and ratios are taken per round, so load from other processes hits both
sides of a ratio alike. Figures are medians with their spread (IQR and min-max). Targets are
reported as PASS / MISS lines; nothing here fails because the machine is slow.
See benchmarks/README.md for what is measured and how to read it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import glob
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from benchmarks import flops as flops_lib
from benchmarks import steps
from benchmarks import trace_breakdown
from benchmarks.timing import Candidate, MatmulPeak, Summary, interleave, per_round_ratio
from realformer_jax import malloc

LAYOUTS = ('post', 'realformer', 'pre')

SMALL = steps.Shape('small', hidden=256, layers=4, heads=4, vocab=8192, seq_len=128, batch=16)
BASE = steps.Shape('bert_base', hidden=768, layers=12, heads=12, vocab=30522, seq_len=128,
                   batch=8)
TINY = steps.Shape('tiny', hidden=32, layers=2, heads=2, vocab=128, seq_len=16, batch=2,
                   predictions=3)
BASE_512 = steps.Shape('bert_base_512', hidden=768, layers=12, heads=12, vocab=30522,
                       seq_len=512, batch=32, predictions=80)
LARGE_512 = steps.Shape('bert_large_512', hidden=1024, layers=24, heads=16, vocab=30522,
                        seq_len=512, batch=32, predictions=80)
BASE_128 = steps.Shape('bert_base_128', hidden=768, layers=12, heads=12, vocab=30522,
                       seq_len=128, batch=128, predictions=20)


@dataclasses.dataclass(frozen=True)
class Profile:
  """How much to measure. `split_groups`: shapes whose HF comparison runs in its own group
  (post vs HF, then post vs realformer vs pre), so that at most three train states live at once
  (BERT-Base: HF's step alone peaks at ~8 GB)."""

  shapes: tuple
  split_groups: tuple  # names of shapes measured in two groups
  rounds: int
  warmup: int
  compile_shape: steps.Shape  # width of the compile-time models (layers vary)
  compile_layers: tuple
  compile_repeats: int  # scanned compiles are repeated; loop compiles run once
  memory_shape: steps.Shape
  memory_remats: tuple = ('none', 'full', 'dots')
  dtype: str = 'float32'  # compute dtype of both models (parameters stay float32)
  peak_n: int = 2048  # the matmul peak: an n^3 matmul in `dtype`
  scan_unroll: Optional[int] = None  # ours: layers per scan iteration (None: fully unrolled)
  trace_steps: int = 0  # > 0: profile this many steps per candidate, device time by category
  targets: str = 'cpu'  # which TARGETS apply: 'cpu' | 'accelerator'


PROFILES = {
    'full': Profile(shapes=(SMALL, BASE), split_groups=('bert_base',), rounds=10, warmup=2,
                    compile_shape=SMALL, compile_layers=(12, 24, 48), compile_repeats=2,
                    memory_shape=BASE, memory_remats=('none', 'full')),
    'quick': Profile(shapes=(SMALL,), split_groups=(), rounds=4, warmup=1,
                     compile_shape=SMALL, compile_layers=(4, 16), compile_repeats=1,
                     memory_shape=SMALL, memory_remats=('none', 'full')),
    'tiny': Profile(shapes=(TINY,), split_groups=(), rounds=2, warmup=1,
                    compile_shape=TINY, compile_layers=(1, 2), compile_repeats=1,
                    memory_shape=TINY, memory_remats=('none', 'full')),
    # One GPU / TPU chip. The rolled layer scan: XLA:GPU compiles an unrolled BERT-Large step
    # in ~165 s vs ~30 s rolled (measured on an H100); --scan_unroll overrides.
    'accelerator': Profile(shapes=(BASE_512, LARGE_512, BASE_128), split_groups=(),
                           rounds=10, warmup=2, compile_shape=BASE_512,
                           compile_layers=(12, 24), compile_repeats=1,
                           memory_shape=LARGE_512, memory_remats=('none', 'full'),
                           dtype='bfloat16', peak_n=8192, scan_unroll=1, trace_steps=2,
                           targets='accelerator'),
    # The accelerator profile's code path at toy shapes (its smoke test, on any backend).
    'accelerator_tiny': Profile(shapes=(TINY,), split_groups=(), rounds=2, warmup=1,
                                compile_shape=TINY, compile_layers=(1, 2), compile_repeats=1,
                                memory_shape=TINY, memory_remats=('none',), dtype='bfloat16',
                                peak_n=256, scan_unroll=1, trace_steps=1,
                                targets='accelerator'),
}

TARGETS = {
    'tokens_per_s_vs_hf': 1.3,  # ours (post) / HF, at every shape: at least
    'realformer_over_post': 1.05,  # step time, at every shape: at most
    'scan_compile_growth': 1.3,  # scanned compile time, deepest / shallowest: at most
    'mfu_bert_base': 0.75,  # model FLOPs utilisation at the BERT-Base shape: at least
}
# The accelerator profile's targets (one H100, BERT-Large 32 x 512, bf16, dropout 0.1).
ACCELERATOR_TARGETS = {
    'large_tokens_per_s_vs_hf': 1.5,  # post / HF: at least
    'large_mfu_post': 0.45,  # of the measured bf16 matmul peak: at least
    'large_realformer_over_post': 1.10,  # step time: at most
    'large_pre_over_post': 1.0,  # step time: at most
}


# ---------------------------------------------------------------------------------------------
# Results: a flat list of rows, printed as tables and optionally saved as JSON.

@dataclasses.dataclass
class Row:
  section: str
  metric: str
  unit: str
  summary: Summary
  note: str = ''

  def as_dict(self) -> dict:
    return {'section': self.section, 'metric': self.metric, 'unit': self.unit,
            'note': self.note, **self.summary.as_dict()}


class Report:
  def __init__(self, out: Callable[[str], None] = print):
    self.rows: list[Row] = []
    self.targets: list[dict] = []
    self.meta: dict = {}
    self.out = out

  def add(self, section: str, metric: str, unit: str, values, note: str = '') -> Row:
    summary = values if isinstance(values, Summary) else Summary.of(
        values if isinstance(values, (list, tuple)) else [values])
    row = Row(section, metric, unit, summary, note)
    self.rows.append(row)
    return row

  def print_section(self, section: str, title: str) -> None:
    rows = [r for r in self.rows if r.section == section]
    self.out(f'\n== {title}')
    self.out(f'{"metric":44s} {"median":>10s} {"IQR":>21s} {"min-max":>21s} {"n":>3s}  unit')
    for r in rows:
      s = r.summary
      spread = lambda a, b: f'{_fmt(a)}-{_fmt(b)}' if s.n > 1 else '-'
      self.out(f'{r.metric:44s} {_fmt(s.median):>10s} {spread(s.q25, s.q75):>21s} '
               f'{spread(s.lo, s.hi):>21s} {s.n:>3d}  {r.unit}'
               + (f'  ({r.note})' if r.note else ''))

  def target(self, name: str, text: str, value: float, limit: float, at_least: bool,
             spread: Optional[Summary] = None, applicable: bool = True) -> None:
    ok = (value >= limit) if at_least else (value <= limit)
    status = ('PASS' if ok else 'MISS') if math.isfinite(value) else 'MISS'
    if not applicable:
      status = 'INFO'
    cmp = '>=' if at_least else '<='
    extra = f' (IQR {_fmt(spread.q25)}-{_fmt(spread.q75)})' if spread and spread.n > 1 else ''
    line = f'{status}  {text}: {_fmt(value)}{extra} {cmp} {limit}'
    self.targets.append({'target': name, 'status': status, 'text': text, 'value': value,
                         'limit': limit, 'at_least': at_least})
    self.out(line)

  def as_dict(self) -> dict:
    return {'meta': self.meta, 'rows': [r.as_dict() for r in self.rows],
            'targets': self.targets}


def _fmt(x: float) -> str:
  if x is None or not math.isfinite(x):
    return 'nan'
  a = abs(x)
  if a >= 1e5:
    return f'{x:.3g}'
  if a >= 100:
    return f'{x:.0f}'
  if a >= 10:
    return f'{x:.1f}'
  if a >= 1:
    return f'{x:.2f}'
  return f'{x:.3f}'


# ---------------------------------------------------------------------------------------------
# Train steps under measurement.

class CompiledStep:
  """A compiled train step with its own state; calling it runs one step and blocks."""

  def __init__(self, name: str, step: steps.Step):
    self.name = name
    start = time.perf_counter()
    lowered = step.lower()
    self.lower_s = time.perf_counter() - start
    start = time.perf_counter()
    self.compiled = lowered.compile()
    self.compile_s = time.perf_counter() - start
    self.memory = memory_stats(self.compiled)
    self.state, self.batch, self.rng = step.state, step.batch, step.rng
    self.metrics = None

  def __call__(self) -> None:
    self.state, self.metrics = self.compiled(self.state, self.batch, self.rng)
    jax.block_until_ready((self.state, self.metrics))

  def loss(self) -> float:
    """Mean MLM loss of the last step (the project's step reports sums)."""
    if self.metrics is None:
      return float('nan')
    return float(self.metrics['mlm_loss_sum']) / max(float(self.metrics['mlm_weight']), 1.0)


def memory_stats(compiled) -> dict:
  """Bytes from XLA's buffer assignment. peak = arguments + outputs + temporaries - aliased
  (donated inputs that outputs reuse): what the step needs resident at once."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pragma: no cover - backends without memory analysis
    return {}
  if m is None:
    return {}
  stats = {k: int(getattr(m, f'{k}_size_in_bytes', 0)) for k in
           ('argument', 'output', 'temp', 'alias', 'generated_code')}
  stats['peak'] = stats['argument'] + stats['output'] + stats['temp'] - stats['alias']
  return stats


def build_step(shape: steps.Shape, which: str, dropout: float, *, abstract: bool = False,
               dtype: str = 'float32', **overrides) -> steps.Step:
  batch = steps.make_batch(shape)
  if which == 'hf':
    return steps.make_hf_step(steps.hf_bert_config(shape, dropout=dropout),
                              steps.train_config(shape, dropout=dropout), batch,
                              abstract=abstract, dtype=dtype)
  config = steps.train_config(shape, ln_placement=which, dropout=dropout, dtype=dtype,
                              **overrides)
  return steps.make_project_step(config, batch, abstract=abstract)


def device_peak_bytes() -> Optional[int]:
  """The device's own high-water mark so far (GPU / TPU `memory_stats`; None on CPU)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')


def trace_categories(candidate: CompiledStep, steps_to_trace: int, score_dims,
                     trace_dir: Optional[str]) -> dict[str, float]:
  """Device seconds per step by category (trace_breakdown.py) over `steps_to_trace` steps."""
  directory = trace_dir and os.path.join(trace_dir, candidate.name)
  with tempfile.TemporaryDirectory() as scratch:
    directory = directory or scratch
    jax.block_until_ready(candidate.state)
    with jax.profiler.trace(directory):
      for _ in range(steps_to_trace):
        candidate()
    paths = sorted(glob.glob(os.path.join(directory, '**', '*.xplane.pb'), recursive=True),
                   key=os.path.getmtime)
    categories = trace_breakdown.categorize_hlo(candidate.compiled.as_text(), score_dims)
    return trace_breakdown.device_time_by_category(paths[-1], categories, steps_to_trace)


# ---------------------------------------------------------------------------------------------
# Sections.

def measure_train_steps(report: Report, shape: steps.Shape, profile: Profile, dropout: float,
                        peak: MatmulPeak, log, trace_dir: Optional[str] = None) -> dict:
  """Step time, tokens/s, MFU and ratios for post / realformer / pre / HF at one shape."""
  section = f'train_{shape.name}'
  model_flops = flops_lib.model_flops(shape)
  compiled: dict[str, CompiledStep] = {}
  times: dict[str, list] = {k: [] for k in ('hf',) + LAYOUTS}
  peaks: dict[str, list] = {k: [] for k in times}
  ratios: dict[str, list] = {'post_vs_hf': [], 'realformer_vs_post': [], 'pre_vs_post': [],
                             'realformer_vs_hf': [], 'pre_vs_hf': []}
  hf_memory: dict = {}
  device_peaks: dict[str, int] = {}
  breakdowns: dict[str, dict] = {}
  unroll = profile.scan_unroll or shape.layers
  groups = ([['post', 'hf'], ['post', 'realformer', 'pre']] if shape.name in profile.split_groups
            else [['post', 'realformer', 'pre', 'hf']])
  for group in groups:
    for name in group:
      if name not in compiled:
        log(f'[{shape.name}] compiling {name} train step')
        step = build_step(shape, name, dropout, dtype=profile.dtype,
                          **({} if name == 'hf' else {'scan_unroll': unroll}))
        compiled[name] = CompiledStep(name, step)
        del step
        report.add(section, f'{_label(name)} compile (trace+lower+compile)', 's',
                   compiled[name].lower_s + compiled[name].compile_s)
    candidates = [Candidate(name, compiled[name]) for name in group]
    round_peaks: list[float] = []

    def on_round(r, candidates=candidates, round_peaks=round_peaks):
      round_peaks.append(peak.measure())
      done = ', '.join(f'{c.name} {c.times[-1]:.3f}s' for c in candidates)
      log(f'[{shape.name}] round {r + 1}/{profile.rounds}: {done}; '
          f'load {os.getloadavg()[0]:.2f}')

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
          breakdowns[name] = trace_categories(compiled[name], profile.trace_steps,
                                              (shape.seq_len, shape.seq_len), trace_dir)
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
      log(f'[{shape.name}] losses after warm-up and timing: '
          + ', '.join(f'{k} {v:.3f}' for k, v in losses.items()))
      hf_memory = compiled.pop('hf').memory  # drop HF's state before the next group
      gc.collect()

  for name in ('post', 'realformer', 'pre', 'hf'):
    label = 'HF FlaxBertForMaskedLM' if name == 'hf' else name
    report.add(section, f'{label} step time', 's', times[name])
  for name in ('post', 'realformer', 'pre', 'hf'):
    label = 'HF FlaxBertForMaskedLM' if name == 'hf' else name
    report.add(section, f'{label} tokens/s', 'tok/s', [shape.tokens / t for t in times[name]])
  report.add(section, 'tokens/s ratio post / HF', 'x', ratios['post_vs_hf'],
             'per round: HF time / post time')
  report.add(section, 'tokens/s ratio realformer / HF', 'x', ratios['realformer_vs_hf'])
  report.add(section, 'tokens/s ratio pre / HF', 'x', ratios['pre_vs_hf'])
  report.add(section, 'step time realformer / post', 'x', ratios['realformer_vs_post'],
             'RealFormer overhead')
  report.add(section, 'step time pre / post', 'x', ratios['pre_vs_post'])
  report.add(section, f'matmul peak ({_dtype_name(profile.dtype)} {profile.peak_n}^3, best '
             f'of 3/round)', 'GFLOP/s', [p / 1e9 for p in peaks['post']])
  report.add(section, 'model FLOPs per step', 'GFLOP', model_flops / 1e9,
             'formula in benchmarks/flops.py')
  report.add(section, 'HF executed FLOPs per step', 'GFLOP',
             flops_lib.hf_executed_flops(shape) / 1e9, 'MLM head at every position')
  for name in ('post', 'realformer', 'pre', 'hf'):
    label = 'HF' if name == 'hf' else name
    report.add(section, f'MFU {label} (model FLOPs / time / peak)', 'frac',
               [model_flops / t / p for t, p in zip(times[name], peaks[name])])
  for name in ('post', 'realformer', 'pre'):
    if compiled.get(name) and compiled[name].memory:
      report.add(section, f'{name} XLA step memory (args + out + temp - aliased)', 'MB',
                 compiled[name].memory['peak'] / 1e6)
  for group, peak_bytes in device_peaks.items():
    report.add(section, f'device peak bytes in use after {group}', 'MB', peak_bytes / 1e6,
               'memory_stats high-water mark of the process so far')
  for name, breakdown in breakdowns.items():
    for category, seconds in breakdown.items():
      report.add(f'trace_{shape.name}', f'{_label(name)}: {category}', 'ms', seconds * 1e3)
    report.add(f'trace_{shape.name}', f'{_label(name)}: total device time', 'ms',
               sum(breakdown.values()) * 1e3)
  return {'ratios': ratios, 'times': times, 'peaks': peaks, 'model_flops': model_flops,
          'hf_memory': hf_memory, 'post_memory': compiled['post'].memory,
          'breakdowns': breakdowns}


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
        step = build_step(shape, 'post', dropout, abstract=True, scan_layers=scan,
                          dtype=profile.dtype)
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


def measure_memory(report: Report, shape: steps.Shape, remats: Sequence[str], dropout: float,
                   timed_post_memory: dict, hf_memory: dict, log,
                   dtype: str = 'float32') -> dict:
  """XLA buffer sizes of the train step: remat none / full / dots, post vs realformer, on the
  rolled layer scan (where remat applies per layer); plus the unrolled post step timed above."""
  section = 'memory'
  stats = {}
  for layout in ('post', 'realformer'):
    for remat in remats:
      log(f'[memory] compiling {layout} remat={remat}')
      c = CompiledStep(layout, build_step(shape, layout, dropout, abstract=True,
                                          remat_policy=remat, scan_unroll=1, dtype=dtype))
      m = c.memory
      del c
      gc.collect()
      stats[(layout, remat)] = m
      if not m:
        continue
      report.add(section, f'{layout:10s} remat={remat:5s} peak', 'MB', m['peak'] / 1e6,
                 f'temp {m["temp"] / 1e6:.0f} MB, args {m["argument"] / 1e6:.0f} MB')
  if timed_post_memory:
    m = timed_post_memory
    report.add(section, 'post unrolled scan, remat=none peak', 'MB', m['peak'] / 1e6,
               f'temp {m["temp"] / 1e6:.0f} MB (the step timed above)')
  if hf_memory:
    m = hf_memory
    report.add(section, 'HF FlaxBertForMaskedLM peak', 'MB', m['peak'] / 1e6,
               f'temp {m["temp"] / 1e6:.0f} MB')
  scores = shape.layers * shape.batch * shape.heads * shape.seq_len ** 2 * 4
  for remat in remats:
    a, b = stats.get(('realformer', remat)), stats.get(('post', remat))
    if a and b:
      report.add(section, f'realformer - post temp, remat={remat}', 'MB',
                 (a['temp'] - b['temp']) / 1e6,
                 f'one [N,B,H,L,L] f32 stack = {scores / 1e6:.0f} MB')
  return stats


# ---------------------------------------------------------------------------------------------

def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return ''


def machine_info() -> dict:
  cpu, simd = platform.processor(), ''
  cpuinfo = _read('/proc/cpuinfo').splitlines()
  for line in cpuinfo:
    if line.startswith('model name'):
      cpu = line.split(':', 1)[1].strip()
      break
  for line in cpuinfo:
    if line.startswith('flags'):
      flags = set(line.split(':', 1)[1].split())
      simd = '+'.join(f for f in ('avx2', 'fma', 'avx512f') if f in flags)
      break
  import flax
  import optax
  info = {'date': datetime.datetime.now().isoformat(timespec='seconds'), 'cpu': cpu, 'simd': simd,
          'cores': os.cpu_count(), 'jax': jax.__version__, 'flax': flax.__version__,
          'optax': optax.__version__, 'backend': jax.default_backend(),
          'python': platform.python_version(), 'load_avg_start': os.getloadavg(),
          'glibc_tunables': os.environ.get('GLIBC_TUNABLES', ''),
          'transparent_hugepage': _read('/sys/kernel/mm/transparent_hugepage/enabled')}
  try:
    import transformers
    info['transformers'] = transformers.__version__
  except ImportError:
    pass
  return info


def run(profile: Profile, profile_name: str, dropout: float = 0.1,
        json_path: Optional[str] = None, out: Callable[[str], None] = print,
        sections: Sequence[str] = ('train', 'compile', 'memory'),
        trace_dir: Optional[str] = None) -> Report:
  report = Report(out)
  report.meta = dict(machine_info(), profile=profile_name, dropout=dropout)
  started = time.perf_counter()
  loads = []

  def log(msg: str) -> None:
    loads.append(os.getloadavg()[0])
    out(f'  {time.perf_counter() - started:6.1f}s  {msg}')

  meta = report.meta
  out(f'realformer_jax benchmarks ({profile_name}) {meta["date"]} on {meta["cpu"]} '
      f'x{meta["cores"]} ({meta["simd"]}), jax {jax.__version__}, load avg '
      f'{meta["load_avg_start"][0]:.2f}, GLIBC_TUNABLES={meta["glibc_tunables"] or "(unset)"}, '
      f'THP {meta["transparent_hugepage"]}')
  peak = MatmulPeak(profile.peak_n, profile.dtype)
  train = {}
  if 'train' in sections:
    for shape in profile.shapes:
      train[shape.name] = measure_train_steps(report, shape, profile, dropout, peak, log,
                                              trace_dir)
      gc.collect()  # the compiled steps and their train states
  compile_results = {}
  if 'compile' in sections:
    compile_results = measure_compile_times(report, profile, dropout, log)
  if 'memory' in sections:
    at_shape = train.get(profile.memory_shape.name, {})
    measure_memory(report, profile.memory_shape, profile.memory_remats, dropout,
                   at_shape.get('post_memory', {}), at_shape.get('hf_memory', {}), log,
                   profile.dtype)
  report.meta['load_avg_end'] = os.getloadavg()
  report.meta['load_1min_during'] = Summary.of(loads).as_dict()
  report.meta['wall_s'] = time.perf_counter() - started
  report.meta['max_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

  out('')
  unrolled = ('fully unrolled (model.scan_unroll = layers, as configs/bert.py sets for '
              'Small/Base)' if profile.scan_unroll is None else
              f'scan_unroll={profile.scan_unroll} (1 = the rolled scan)')
  out(f'Setup: the project\'s train step (realformer_jax.train: forward + backward + clip + '
      f'AdamW, state donated) for both models, {profile.dtype} compute with float32 '
      f'parameters, dropout {dropout} in both, on {jax.devices()[0].device_kind}; ours with the '
      f'layer scan {unrolled}; {profile.rounds} timed rounds after {profile.warmup} warm-up, '
      f'interleaved. Spread: IQR and min-max over rounds.')
  for shape in profile.shapes:
    report.print_section(
        f'train_{shape.name}',
        f'Train step, {shape.name}: hidden {shape.hidden}, {shape.layers} layers, '
        f'{shape.heads} heads, vocab {shape.vocab}, batch {shape.batch} x seq '
        f'{shape.seq_len} ({shape.tokens} tokens, {shape.predictions} masked/seq)')
    if train.get(shape.name, {}).get('breakdowns'):
      report.print_section(f'trace_{shape.name}', f'Device time per step by category, '
                           f'{shape.name} (profiler trace, benchmarks/trace_breakdown.py)')
  if compile_results:
    report.print_section('compile', f'Compile time of the post train step (hidden '
                         f'{profile.compile_shape.hidden}), scanned vs Python loop')
  if 'memory' in sections:
    m = profile.memory_shape
    report.print_section('memory', f'Train-step memory from XLA buffer assignment, '
                         f'{m.name} (peak = args + outputs + temp - donated aliases)')
  loads_s = Summary.of(loads)
  out(f'\nLoad average (1 min) during the run: median {loads_s.median:.2f}, '
      f'max {loads_s.hi:.2f}; wall {report.meta["wall_s"]:.0f}s; peak RSS '
      f'{report.meta["max_rss_mb"]:.0f} MB')
  if profile.targets == 'accelerator':
    _accelerator_targets(report, profile, profile_name, train)
  else:
    _cpu_targets(report, profile, profile_name, train, compile_results)
  if json_path:
    with open(json_path, 'w') as f:
      json.dump(report.as_dict(), f, indent=1, default=str)
    out(f'\nSaved {json_path}')
  return report


def _cpu_targets(report: Report, profile: Profile, profile_name: str, train: dict,
                 compile_results: dict) -> None:
  applicable = profile == PROFILES['full']
  report.out('\nTargets' + ('' if applicable else
                            f' ({profile_name} profile, changed or reduced: INFO only)'))
  for name, res in train.items():
    s = Summary.of(res['ratios']['post_vs_hf'])
    report.target('tokens_per_s_vs_hf', f'tokens/s post / HF at {name}', s.median,
                  TARGETS['tokens_per_s_vs_hf'], True, s, applicable)
  for name, res in train.items():
    s = Summary.of(res['ratios']['realformer_vs_post'])
    report.target('realformer_over_post', f'step time realformer / post at {name}', s.median,
                  TARGETS['realformer_over_post'], False, s, applicable)
  if compile_results:
    lo, hi = min(profile.compile_layers), max(profile.compile_layers)
    growth = (np.median(compile_results[('scanned', hi)])
              / np.median(compile_results[('scanned', lo)]))
    report.target('scan_compile_growth', f'scanned compile time {hi} / {lo} layers',
                  float(growth), TARGETS['scan_compile_growth'], False, None, applicable)
  if train:
    name = 'bert_base' if 'bert_base' in train else list(train)[-1]
    res = train[name]
    s = Summary.of([res['model_flops'] / t / p
                    for t, p in zip(res['times']['post'], res['peaks']['post'])])
    report.target('mfu_bert_base', f'MFU post at {name}', s.median, TARGETS['mfu_bert_base'],
                  True, s, applicable and name == 'bert_base')


def _accelerator_targets(report: Report, profile: Profile, profile_name: str,
                         train: dict) -> None:
  """Issue targets at BERT-Large 32 x 512 on one accelerator (INFO on CPU or other shapes)."""
  name = LARGE_512.name if LARGE_512.name in train else (list(train)[-1] if train else None)
  applicable = (profile == PROFILES['accelerator'] and jax.default_backend() != 'cpu'
                and name == LARGE_512.name)
  report.out('\nTargets (one accelerator, BERT-Large 32 x 512, bf16)' + (
      '' if applicable else f' ({profile_name} profile on {jax.default_backend()}: INFO only)'))
  if name is None:
    return
  res = train[name]
  checks = (
      ('large_tokens_per_s_vs_hf', f'tokens/s post / HF at {name}', res['ratios']['post_vs_hf'],
       True),
      ('large_mfu_post', f'MFU post (of the measured bf16 peak) at {name}',
       [res['model_flops'] / t / p for t, p in zip(res['times']['post'], res['peaks']['post'])],
       True),
      ('large_realformer_over_post', f'step time realformer / post at {name}',
       res['ratios']['realformer_vs_post'], False),
      ('large_pre_over_post', f'step time pre / post at {name}', res['ratios']['pre_vs_post'],
       False),
  )
  for target, text, values, at_least in checks:
    s = Summary.of(values)
    report.target(target, text, s.median, ACCELERATOR_TARGETS[target], at_least, s, applicable)


def main(argv: Optional[Sequence[str]] = None) -> Report:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--profile', choices=('full', 'quick', 'tiny', 'accelerator'),
                      help='what to measure: full (CPU, default), quick, tiny, or accelerator '
                      '(GPU / TPU: bf16, BERT-Base/Large 32x512, traces); --tiny with '
                      'accelerator runs its code path at toy shapes')
  parser.add_argument('--trace_dir', help='accelerator profile: keep the profiler traces here')
  parser.add_argument('--scan_unroll', type=int,
                      help="ours: layers per scan iteration (default: the profile's)")
  parser.add_argument('--quick', action='store_true', help='small shape only (< 2 min)')
  parser.add_argument('--tiny', action='store_true',
                      help='with --quick (or alone): the quick run at toy shapes (the smoke test)')
  parser.add_argument('--dropout', type=float, default=0.1,
                      help='dropout rate in both models (default 0.1, as pretraining)')
  parser.add_argument('--json', metavar='PATH', help='also save the results as JSON')
  parser.add_argument('--sections', default='train,compile,memory',
                      help='comma-separated subset of train,compile,memory')
  parser.add_argument('--shapes', help='comma-separated subset of the profile\'s train '
                      'shapes (small, bert_base), e.g. to look at one shape')
  parser.add_argument('--rounds', type=int, help='timed rounds (default: the profile\'s)')
  parser.add_argument('--malloc', choices=tuple(malloc.TUNABLES), default='retain',
                      help='glibc malloc settings for the process (realformer_jax/malloc.py); '
                      'the command re-runs itself with them')
  args = parser.parse_args(argv)
  if argv is None:  # a command line, not a call from Python (tests)
    malloc.reexec_with(args.malloc)
  name = args.profile or ('tiny' if args.tiny else 'quick' if args.quick else 'full')
  if args.profile and args.tiny:
    name = f'{args.profile}_tiny' if f'{args.profile}_tiny' in PROFILES else 'tiny'
  profile = PROFILES[name]
  if args.scan_unroll:
    profile = dataclasses.replace(profile, scan_unroll=args.scan_unroll)
  if args.shapes:
    shapes = {s.name: s for s in (SMALL, BASE, TINY, BASE_512, LARGE_512, BASE_128)}
    profile = dataclasses.replace(profile, shapes=tuple(shapes[s] for s in args.shapes.split(',')))
  if args.rounds:
    profile = dataclasses.replace(profile, rounds=args.rounds)
  return run(profile, name, args.dropout, args.json, sections=tuple(args.sections.split(',')),
             trace_dir=args.trace_dir)


if __name__ == '__main__':
  main()
  sys.stdout.flush()

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
import gc
import json
import os
import resource
import sys
import time
from typing import Callable, Optional, Sequence

import jax

from benchmarks import aot, measure, target_checks
from benchmarks.profiles import PROFILES, SHAPES, Profile
from benchmarks.report import Report
from benchmarks.timing import MatmulPeak, Summary
from realformer_jax import malloc
from realformer_jax.studies.machine import machine_info


def run(
  profile: Profile,
  profile_name: str,
  dropout: float = 0.1,
  json_path: Optional[str] = None,
  out: Callable[[str], None] = print,
  sections: Sequence[str] = ('train', 'compile', 'memory'),
  trace_dir: Optional[str] = None,
) -> Report:
  report = Report(out)
  report.meta = dict(machine_info(), profile=profile_name, dropout=dropout)
  started = time.perf_counter()
  loads = []

  def log(msg: str) -> None:
    loads.append(os.getloadavg()[0])
    out(f'  {time.perf_counter() - started:6.1f}s  {msg}')

  meta = report.meta
  out(
    f'realformer_jax benchmarks ({profile_name}) {meta["date"]} on {meta["cpu"]} '
    f'x{meta["cores"]} ({meta["simd"]}), jax {jax.__version__}, load avg '
    f'{meta["load_avg_start"][0]:.2f}, GLIBC_TUNABLES={meta["glibc_tunables"] or "(unset)"}, '
    f'THP {meta["transparent_hugepage"]}'
  )
  peak = MatmulPeak(profile.peak_n, profile.dtype)
  train = {}
  if 'train' in sections:
    for shape in profile.shapes:
      train[shape.name] = measure.measure_train_steps(
        report, shape, profile, dropout, peak, log, trace_dir
      )
      gc.collect()  # the compiled steps and their train states
  compile_results = {}
  if 'compile' in sections:
    compile_results = measure.measure_compile_times(report, profile, dropout, log)
  if 'memory' in sections:
    at_shape = train.get(profile.memory_shape.name, {})
    measure.measure_memory(
      report,
      profile.memory_shape,
      profile.memory_remats,
      dropout,
      at_shape.get('post_memory', {}),
      at_shape.get('hf_memory', {}),
      log,
      profile.dtype,
    )
  report.meta['load_avg_end'] = os.getloadavg()
  report.meta['load_1min_during'] = Summary.of(loads).as_dict()
  report.meta['wall_s'] = time.perf_counter() - started
  report.meta['max_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

  out('')
  unrolled = (
    'fully unrolled (model.scan_unroll = layers, as configs/bert.py sets for Small/Base)'
    if profile.scan_unroll is None
    else f"scan_unroll={profile.scan_unroll!r} (1: the rolled scan; 'auto': model/layer_unroll.py)"
  )
  out(
    f"Setup: the project's train step (realformer_jax.train: forward + backward + clip + "
    f'AdamW, state donated) for both models, {profile.dtype} compute with float32 '
    f'parameters, dropout {dropout} in both, on {jax.devices()[0].device_kind}; ours with the '
    f'layer scan {unrolled}; {profile.rounds} timed rounds after {profile.warmup} warm-up, '
    f'interleaved. Spread: IQR and min-max over rounds.'
  )
  for shape in profile.shapes:
    report.print_section(
      f'train_{shape.name}',
      f'Train step, {shape.name}: hidden {shape.hidden}, {shape.layers} layers, '
      f'{shape.heads} heads, vocab {shape.vocab}, batch {shape.batch} x seq '
      f'{shape.seq_len} ({shape.tokens} tokens, {shape.predictions} masked/seq)',
    )
    if train.get(shape.name, {}).get('breakdowns'):
      report.print_section(
        f'trace_{shape.name}',
        f'Device time per step by category, '
        f'{shape.name} (profiler trace, benchmarks/trace_breakdown.py)',
      )
  if compile_results:
    report.print_section(
      'compile',
      f'Compile time of the post train step (hidden '
      f'{profile.compile_shape.hidden}), scanned vs Python loop',
    )
  if 'memory' in sections:
    m = profile.memory_shape
    report.print_section(
      'memory',
      f'Train-step memory from XLA buffer assignment, '
      f'{m.name} (peak = args + outputs + temp - donated aliases)',
    )
  loads_s = Summary.of(loads)
  out(
    f'\nLoad average (1 min) during the run: median {loads_s.median:.2f}, '
    f'max {loads_s.hi:.2f}; wall {report.meta["wall_s"]:.0f}s; peak RSS '
    f'{report.meta["max_rss_mb"]:.0f} MB'
  )
  if profile.targets == 'accelerator':
    target_checks.accelerator_targets(report, profile, profile_name, train)
  else:
    target_checks.cpu_targets(report, profile, profile_name, train, compile_results)
  if json_path:
    with open(json_path, 'w') as f:
      json.dump(report.as_dict(), f, indent=1, default=str)
    out(f'\nSaved {json_path}')
  return report


def main(argv: Optional[Sequence[str]] = None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--profile',
    choices=('full', 'quick', 'tiny', 'accelerator', 'aot-h100', 'aot-v5p'),
    help='what to measure: full (CPU, default), quick, tiny, or accelerator '
    '(GPU / TPU: bf16, BERT-Base/Large 32x512, traces); aot-h100 / aot-v5p: '
    "the accelerator profile's steps compiled for that target on this host "
    'and ESTIMATED (benchmarks/aot.py); --tiny with accelerator or aot-* runs '
    'its code path at toy shapes',
  )
  parser.add_argument(
    '--out_dir', help='aot profiles: where the results go (default docs/results/aot/<profile>)'
  )
  parser.add_argument('--trace_dir', help='accelerator profile: keep the profiler traces here')
  parser.add_argument(
    '--scan_unroll', type=int, help="ours: layers per scan iteration (default: the profile's)"
  )
  parser.add_argument('--quick', action='store_true', help='small shape only (< 2 min)')
  parser.add_argument(
    '--tiny',
    action='store_true',
    help='with --quick (or alone): the quick run at toy shapes (the smoke test)',
  )
  parser.add_argument(
    '--dropout',
    type=float,
    default=0.1,
    help='dropout rate in both models (default 0.1, as pretraining)',
  )
  parser.add_argument('--json', metavar='PATH', help='also save the results as JSON')
  parser.add_argument(
    '--sections',
    default='train,compile,memory',
    help='comma-separated subset of train,compile,memory',
  )
  parser.add_argument(
    '--shapes',
    help="comma-separated subset of the profile's train "
    'shapes (small, bert_base), e.g. to look at one shape',
  )
  parser.add_argument('--rounds', type=int, help="timed rounds (default: the profile's)")
  parser.add_argument(
    '--malloc',
    choices=tuple(malloc.TUNABLES),
    default='retain',
    help='glibc malloc settings for the process (realformer_jax/malloc.py); '
    'the command re-runs itself with them',
  )
  args = parser.parse_args(argv)
  if args.profile and args.profile.startswith('aot'):
    # Compiling for a target opens no device: JAX stays on the CPU whatever plugins are here.
    jax.config.update('jax_platforms', 'cpu')
    return aot.run('aot_tiny' if args.tiny else args.profile, args.out_dir)
  if argv is None:  # a command line, not a call from Python (tests)
    malloc.reexec_with(args.malloc)
  name = args.profile or ('tiny' if args.tiny else 'quick' if args.quick else 'full')
  if args.profile and args.tiny:
    name = f'{args.profile}_tiny' if f'{args.profile}_tiny' in PROFILES else 'tiny'
  profile = PROFILES[name]
  if args.scan_unroll:
    profile = dataclasses.replace(profile, scan_unroll=args.scan_unroll)
  if args.shapes:
    profile = dataclasses.replace(profile, shapes=tuple(SHAPES[s] for s in args.shapes.split(',')))
  if args.rounds:
    profile = dataclasses.replace(profile, rounds=args.rounds)
  return run(
    profile,
    name,
    args.dropout,
    args.json,
    sections=tuple(args.sections.split(',')),
    trace_dir=args.trace_dir,
  )


if __name__ == '__main__':
  main()
  sys.stdout.flush()

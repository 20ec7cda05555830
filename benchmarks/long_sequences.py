"""Memory (and, with --run, step time) of long-sequence training: Post-LN vs RealFormer.

  python -m benchmarks.long_sequences                         # XLA memory, L = 2k / 4k / 8k
  python -m benchmarks.long_sequences --run                   # also train steps (accelerator)
  python -m benchmarks.long_sequences --lengths 512,1024 --hidden 64 --layers 2   # small
  python -m benchmarks.long_sequences --target=h100:1      # deviceless: the long table
  python -m benchmarks.long_sequences --target=v5p:1x1x1

BERT-Base shape, batch 1, bfloat16 compute, every layer rematerialised, dropout 0.1. Variants:
post; realformer with autodiff saving each layer's carried float32 [B, H, L, L] sum ('saved');
realformer rebuilding them going down the stack ('recomputed', realformer_jax/
recomputed_scores.py); realformer carrying the stacked queries and keys instead of the sum
('qk', residual_carry='qk': kernels/score_paths/qk_carry.py). Memory is XLA's buffer assignment of
the
compiled train step (arguments + outputs + temporaries - donated aliases), so it is known
without running; --run adds the median step time and the device's peak (`memory_stats`, GPU /
TPU).

--target compiles instead for an accelerator this host does not have (experiments.compile's
targets) the project's own train step (the pretraining config, rotary positions, every layer
rematerialised) and reads it with the kernel roofline: XLA's memory for that target and an
ESTIMATED step time, never a measurement. Each (length, variant) is written to
docs/results/long_sequences/<target>/runs/ as it finishes (a rerun skips it) and the table to
results.md there. Default lengths 4k ... 128k; post, the sum ('recomputed', the scores carry's
smallest) and 'qk'. XLA:TPU refuses to compile a program larger than the chip's HBM: such a row
says "does not fit" with the bytes XLA asked for.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import jax

from realformer_jax.aot import roofline, targets
from realformer_jax.bench import compiled_steps as bench
from realformer_jax.bench import steps
from realformer_jax.studies import runs as runs_lib
from realformer_jax.train import build, pretraining
from realformer_jax.units import GiB

SCORES = dict(ln_placement='realformer', residual_carry='scores')
VARIANTS = {
  'post': dict(ln_placement='post'),
  'realformer saved': SCORES,
  'realformer recomputed': dict(SCORES, residual_scores_backward='recomputed'),
  'realformer qk': dict(ln_placement='realformer', residual_carry='qk'),
}
TARGET_VARIANTS = ('post', 'realformer recomputed', 'realformer qk')
TARGET_LENGTHS = '4096,8192,16384,32768,65536,131072'
# Issue 40's targets (BERT-Base, batch 1, bf16, full remat, dropout 0.1, one H100 / H200):
# at this length the qk step <= this many Post-LN steps, and Post-LN's step <= these seconds.
QK_TARGET_LENGTH = 65536
QK_OVER_POST_TARGET = 2.0
POST_SECONDS_TARGET = 3.5
RESULTS_DIR = os.path.join('docs', 'results', 'long_sequences')


def compiled_step(shape: steps.Shape, overrides: dict, dtype: str, abstract: bool):
  """The long-sequence train step of one variant, compiled (realformer_jax/bench)."""
  step = bench.build_step(
    shape,
    overrides['ln_placement'],
    0.1,
    abstract=abstract,
    dtype=dtype,
    remat_policy='full',
    scan_unroll=1,
    **{k: v for k, v in overrides.items() if k != 'ln_placement'},
  )
  return bench.CompiledStep('x', step)


def time_steps(compiled, run_steps: int) -> dict:
  """A warm-up step (timed: the first step), then the median of `run_steps` timed ones, the
  device's peak, and the loss and gradient norm of the last step."""
  start = time.perf_counter()
  compiled()  # warm-up: its time is the run's first step (kernel autotuning included)
  first = time.perf_counter() - start
  times = []
  for _ in range(run_steps):
    start = time.perf_counter()
    compiled()
    times.append(time.perf_counter() - start)
  peak = bench.device_peak_bytes()
  return {
    'step_s': statistics.median(times),
    'first_step_s': first,
    'device_peak_gb': peak / GiB if peak is not None else float('nan'),
    'loss': compiled.loss(),
    'grad_norm': compiled.grad_norm(),
  }


def memory_figures(compiled) -> dict:
  return {
    'xla_peak_gb': compiled.memory.get('peak', float('nan')) / GiB,
    'temp_gb': compiled.memory.get('temp', float('nan')) / GiB,
    'compile_s': compiled.lower_s + compiled.compile_s,
  }


def measure(shape: steps.Shape, overrides: dict, dtype: str, run_steps: int) -> dict:
  compiled = compiled_step(shape, overrides, dtype, abstract=not run_steps)
  result = memory_figures(compiled)
  if run_steps:
    result.update(time_steps(compiled, run_steps))
  return result


def _shape(length: int, args) -> steps.Shape:
  return steps.Shape(
    f'L{length}',
    hidden=args.hidden,
    layers=args.layers,
    heads=args.heads,
    vocab=30522,
    seq_len=length,
    batch=1,
    predictions=max(1, round(0.15 * length)),
  )


def estimate_for_target(shape: steps.Shape, overrides: dict, dtype: str, target, devices) -> dict:
  """XLA's memory and the roofline's ESTIMATED step for the project's train step on `target`."""
  config = steps.train_config(
    shape,
    dropout=0.1,
    dtype=dtype,
    remat_policy='full',
    position_embedding='rope',
    scan_unroll=1,
    **overrides,
  )
  spec = pretraining.validate_config(config, device_count=len(devices), process_count=1)
  start = time.perf_counter()
  try:
    compiled = build.compile_train_step(build.make_setup(spec, devices))
  except jax.errors.JaxRuntimeError as e:  # XLA:TPU: larger than the chip's HBM
    required = build.out_of_memory_bytes(e)
    if required is None:
      raise
    return {'compiled': False, 'required_bytes': required}
  est = roofline.estimate(compiled, target, score_dims=(shape.seq_len, shape.seq_len))
  return {
    'compiled': True,
    'compile_s': time.perf_counter() - start,
    'memory_bytes': build.step_memory_bytes(compiled),
    'step_seconds': est.seconds,
    'matmul_flops': est.matmul_flops,
    # The floor no estimate may go under: every matmul at the datasheet bf16 peak.
    'flops_at_peak_seconds': est.matmul_flops / target.chip.matmul_flops['bf16'],
    'by_category': est.by_category(),
    'warnings': list(est.warnings),
    'estimate_leaves_out': est.unstated,  # kernels that state no L2 traffic / atomics
  }


def run_target(args) -> dict:
  """The deviceless table for args.target (module docstring); resumable per row."""
  target = targets.parse(args.target)
  devices = target.devices()[:1]
  out_dir = args.out or os.path.join(RESULTS_DIR, args.target.replace(':', '-'))
  lengths = [int(n) for n in (args.lengths or TARGET_LENGTHS).split(',')]
  variants = (args.variants or ','.join(TARGET_VARIANTS)).split(',')
  runs = [
    runs_lib.Run(f'L{n}-{v.replace(" ", "-")}', {'length': n, 'variant': v}, cost=n)
    for n in lengths
    for v in variants
  ]

  def one(run: runs_lib.Run, report) -> dict:
    report(0.0, 'compiling for ' + target.describe())
    shape = _shape(run.params['length'], args)
    return {
      **run.params,
      **estimate_for_target(shape, VARIANTS[run.params['variant']], args.dtype, target, devices),
    }

  # The rows depend on the code and on the shape flags, not only on (length, variant).
  shape_flags = {
    'hidden': args.hidden, 'layers': args.layers, 'heads': args.heads, 'dtype': args.dtype
  }  # fmt: skip
  results = runs_lib.Grid(out_dir, runs, identity=runs_lib.code_identity(shape_flags)).run(one)
  budget = target.chip.usable_memory_bytes
  markdown = render_target(results, lengths, variants, target, budget, args)
  verdicts = target_verdicts(results, args)
  if verdicts:
    markdown += '\n' + '\n'.join(f'- {line}' for line in verdicts) + '\n'
  with open(os.path.join(out_dir, 'results.md'), 'w') as f:
    f.write(markdown)
  print(markdown)
  print(f'wrote {out_dir}/results.md')
  return results


def target_verdicts(results, args) -> list[str]:
  """PASS / MISS of the qk targets (QK_TARGET_LENGTH) on the ESTIMATED steps, at the BERT-Base
  shape only, where post and qk both compiled; [] otherwise."""
  post = results.get(f'L{QK_TARGET_LENGTH}-post', {})
  qk = results.get(f'L{QK_TARGET_LENGTH}-realformer-qk', {})
  base = (args.hidden, args.layers, args.heads, args.dtype) == (768, 12, 12, 'bfloat16')
  if not (base and post.get('compiled') and qk.get('compiled')):
    return []
  ratio = qk['step_seconds'] / post['step_seconds']
  verdict = lambda ok: 'PASS' if ok else 'MISS'
  return [
    f'{verdict(ratio <= QK_OVER_POST_TARGET)} (ESTIMATED) qk step <= {QK_OVER_POST_TARGET:g}x '
    f'Post-LN at L = {QK_TARGET_LENGTH:,}: {ratio:.2f}x ({qk["step_seconds"]:.2f} s / '
    f'{post["step_seconds"]:.2f} s)',
    f'{verdict(post["step_seconds"] <= POST_SECONDS_TARGET)} (ESTIMATED) Post-LN step <= '
    f'{POST_SECONDS_TARGET:g} s at L = {QK_TARGET_LENGTH:,}: {post["step_seconds"]:.2f} s',
  ]


def render_target(results, lengths, variants, target, budget, args) -> str:
  """results.md: per length and variant, XLA's memory, fit and the estimated step."""
  lines = [
    f'# Long sequences on {target.describe()}: ESTIMATED from a deviceless compile',
    '',
    f'`python -m benchmarks.long_sequences --target={args.target}` on a CPU host '
    f'({datetime.date.today().isoformat()}, jax {jax.__version__}). hidden {args.hidden}, '
    f'{args.layers} layers, {args.heads} heads, vocab 30522, batch 1, {args.dtype} compute, '
    'float32 parameters and AdamW state, rotary positions, dropout 0.1, every layer '
    "rematerialised, 15% of the tokens predicted. Memory: XLA's buffer assignment of the "
    f'compiled train step, against {budget / GiB:.1f} GiB usable per device '
    '(what XLA may take by default). Step: the kernel roofline '
    '(realformer_jax/aot/roofline.py), an estimate, never a measurement; "FLOPs at peak" is '
    'the floor it cannot go under (every matmul at the datasheet bf16 rate); x post: the '
    "estimated step over Post-LN's at the same length.",
    '',
    '| L | variant | XLA memory (GiB) | fits | est. step (s) | FLOPs at peak (s) | x post |',
    '|---:|---|---:|---|---:|---:|---:|',
  ]
  for n in lengths:
    post = results.get(f'L{n}-post', {})
    for v in variants:
      r = results.get(f'L{n}-{v.replace(" ", "-")}')
      if r is None:
        continue
      if not r['compiled']:
        lines.append(f'| {n:,} | {v} | > {r["required_bytes"] / GiB:.1f} (refused) | no | | | |')
        continue
      ratio = f'{r["step_seconds"] / post["step_seconds"]:.2f}' if post.get('compiled') else ''
      lines.append(
        f'| {n:,} | {v} | {r["memory_bytes"] / GiB:.2f} | '
        f'{"yes" if r["memory_bytes"] <= budget else "no"} | {r["step_seconds"]:.4g} | '
        f'{r["flops_at_peak_seconds"]:.4g} | {ratio} |'
      )
  return '\n'.join(lines) + '\n'


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--lengths', default=None, help='default 2048,4096,8192 (--target: 4k-128k)')
  parser.add_argument('--hidden', type=int, default=768)
  parser.add_argument('--layers', type=int, default=12)
  parser.add_argument('--heads', type=int, default=12)
  parser.add_argument('--dtype', default='bfloat16')
  parser.add_argument('--variants', default=None, help=f'of {list(VARIANTS)}')
  parser.add_argument('--target', default=None, help='deviceless: e.g. h100:1, v5p:1x1x1')
  parser.add_argument('--out', default=None, help='--target: results folder')
  parser.add_argument(
    '--run',
    type=int,
    default=0,
    metavar='STEPS',
    help='also time this many train steps per variant (needs the memory)',
  )
  args = parser.parse_args(argv)
  if args.target:
    return run_target(args)
  args.lengths = args.lengths or '2048,4096,8192'
  args.variants = args.variants or ','.join(VARIANTS)
  print(
    f'device: {jax.devices()[0].device_kind}; hidden {args.hidden}, {args.layers} layers, '
    f'{args.heads} heads, batch 1, {args.dtype}, remat full, dropout 0.1',
    flush=True,
  )
  results = {}
  for length in (int(n) for n in args.lengths.split(',')):
    shape = _shape(length, args)
    for name in args.variants.split(','):
      r = measure(shape, VARIANTS[name], args.dtype, args.run)
      results[(length, name)] = r
      extra = (
        f' | step {r["step_s"]:.3f} s | device peak {r["device_peak_gb"]:.2f} GiB'
        if 'step_s' in r
        else ''
      )
      print(
        f'L={length:>6} {name:22s} XLA step memory {r["xla_peak_gb"]:7.2f} GiB (temp '
        f'{r["temp_gb"]:6.2f}) | compile {r["compile_s"]:5.1f} s{extra}',
        flush=True,
      )
  return results


if __name__ == '__main__':
  main(sys.argv[1:])

"""Memory (and, with --run, step time) of long-sequence training: Post-LN vs RealFormer.

  python -m benchmarks.long_sequences                         # XLA memory, L = 2k / 4k / 8k
  python -m benchmarks.long_sequences --run                   # also train steps (accelerator)
  python -m benchmarks.long_sequences --lengths 512,1024 --hidden 64 --layers 2   # small

BERT-Base shape, batch 1, bfloat16 compute, every layer rematerialised, dropout 0.1. Variants:
post; realformer with autodiff saving each layer's carried float32 [B, H, L, L] sum ('saved');
realformer rebuilding them going down the stack ('recomputed', realformer_jax/
recomputed_scores.py). Memory is XLA's buffer assignment of the compiled train step
(arguments + outputs + temporaries - donated aliases), so it is known without running; --run
adds the median step time and the device's peak (`memory_stats`, GPU / TPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax

from benchmarks import compiled_steps as bench
from benchmarks import steps
from realformer_jax.units import GiB

VARIANTS = {
  'post': dict(ln_placement='post'),
  'realformer saved': dict(ln_placement='realformer'),
  'realformer recomputed': dict(ln_placement='realformer', residual_scores_backward='recomputed'),
}


def measure(shape: steps.Shape, overrides: dict, dtype: str, run_steps: int) -> dict:
  step = bench.build_step(
    shape,
    overrides['ln_placement'],
    0.1,
    abstract=not run_steps,
    dtype=dtype,
    remat_policy='full',
    scan_unroll=1,
    **{k: v for k, v in overrides.items() if k != 'ln_placement'},
  )
  compiled = bench.CompiledStep('x', step)
  result = {
    'xla_peak_gb': compiled.memory.get('peak', float('nan')) / GiB,
    'temp_gb': compiled.memory.get('temp', float('nan')) / GiB,
    'compile_s': compiled.lower_s + compiled.compile_s,
  }
  if run_steps:
    compiled()  # warm-up
    times = []
    for _ in range(run_steps):
      start = time.perf_counter()
      compiled()
      times.append(time.perf_counter() - start)
    result['step_s'] = statistics.median(times)
    peak = bench.device_peak_bytes()
    result['device_peak_gb'] = peak / GiB if peak is not None else float('nan')
  return result


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--lengths', default='2048,4096,8192')
  parser.add_argument('--hidden', type=int, default=768)
  parser.add_argument('--layers', type=int, default=12)
  parser.add_argument('--heads', type=int, default=12)
  parser.add_argument('--dtype', default='bfloat16')
  parser.add_argument('--variants', default=','.join(VARIANTS))
  parser.add_argument(
    '--run',
    type=int,
    default=0,
    metavar='STEPS',
    help='also time this many train steps per variant (needs the memory)',
  )
  args = parser.parse_args(argv)
  print(
    f'device: {jax.devices()[0].device_kind}; hidden {args.hidden}, {args.layers} layers, '
    f'{args.heads} heads, batch 1, {args.dtype}, remat full, dropout 0.1',
    flush=True,
  )
  results = {}
  for length in (int(n) for n in args.lengths.split(',')):
    shape = steps.Shape(
      f'L{length}',
      hidden=args.hidden,
      layers=args.layers,
      heads=args.heads,
      vocab=30522,
      seq_len=length,
      batch=1,
      predictions=max(1, round(0.15 * length)),
    )
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

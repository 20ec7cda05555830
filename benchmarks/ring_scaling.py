"""ESTIMATED weak scaling of the ring: configs/long_context.py at a fixed length per device on
1, 2, 4, 8 GPUs, once per per-block op, against D x the one-device step (docs/performance.md,
"Sequence parallelism").

  python -m benchmarks.ring_scaling --out=DIR                       # h200, 131,072 per device
  python -m benchmarks.ring_scaling --out=DIR --devices=8 --target=h100

Each row is the real `python -m experiments.compile --config=configs/long_context.py:tokens=T
--target=NAME:D --dump=DIR/<row>` (deviceless: XLA's memory for the target and the kernel
roofline's ESTIMATE, never a measurement); a row whose DIR/<row>/report.json exists is read,
not compiled again (~3-5 min each on 2 loaded cores). The 1-device row runs the one-device kernels
(no ring); every other row names the ring's per-block op as the compile reports it. The last
lines are issue 65's target: the largest ring step <= 1.3 x D x the one-device step (PASS /
MISS), per op. A kernel that states no cost to the estimator is flagged (*): its work is then
costed by its bytes only, and the row's step is an underestimate. The ring's fused qk block
kernels (forward, and the backward's dS kernel) state theirs as the one-device ones do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Optional, Sequence

from realformer_jax.units import GiB

CONFIG = 'configs/long_context.py'
# Per-block ops: the model.attention_impl that selects each (kernels/ring_attention.py).
# 'fused_qk': the Triton qk block kernels, forward and backward.
BLOCK_OPS = {'einsum': (), 'fused_qk': ('--config.model.attention_impl=pallas_triton',)}
TARGET_RATIO = 1.3  # issue 65: the ring's step <= 1.3 x D x the one-device step
NO_COST = 'states no FLOPs'


def row_name(target: str, devices: int, op: str) -> str:
  return f'{target}x{devices}' if devices == 1 else f'{target}x{devices}_{op}'


def compile_row(out: str, target: str, devices: int, tokens: int, op: str) -> dict:
  """The report.json of one row, compiled unless already in `out` (with 'dump': its folder)."""
  dump = os.path.join(out, row_name(target, devices, op))
  report = os.path.join(dump, 'report.json')
  if not os.path.exists(report):
    command = [
      sys.executable,
      '-m',
      'experiments.compile',
      f'--config={CONFIG}:tokens={tokens}',
      f'--target={target}:{devices}',
      f'--dump={dump}',
      *(BLOCK_OPS[op] if devices > 1 else ()),
    ]
    print(' '.join(command[1:]), flush=True)
    subprocess.run(command, check=True)
  with open(report) as f:
    return dict(json.load(f), dump=dump)


def table(reports: Sequence[tuple[int, int, dict]], reference: dict) -> list[str]:
  """Markdown rows of (devices, tokens, report) against the one-device `reference` report."""
  one = reference['estimate']['seconds']
  lines = [
    '| GPUs | tokens | per-block op | memory per device | step (ESTIMATED) | '
    'ring link / exposed | hops, sent per device | vs one device x D |',
    '|---:|---:|---|---:|---:|---:|---:|---:|',
  ]
  for devices, tokens, report in reports:
    memory, estimate = report['memory'], report['estimate']
    ring = estimate.get('ring')
    op = estimate.get('ring_block_op') or 'no ring: the one-device qk kernels'
    spare = (memory['budget'] - memory['needed']) / GiB
    link = f'{ring["link_seconds"]:.2f} s / {ring["exposed_seconds"]:.2f} s' if ring else ''
    hops = f'{ring["hops"]:,}, {ring["link_bytes"] / 1e9:,.0f} GB' if ring else ''
    flag = ' (*)' if any(NO_COST in w for w in estimate['warnings']) else ''
    step = f'{estimate["seconds"]:.1f} s{flag}'
    ratio = estimate['seconds'] / (devices * one)
    lines.append(
      f'| {devices} | {tokens:,} | {op} | {memory["needed"] / GiB:.1f} GiB ({spare:.1f} to '
      f'spare) | {step} | {link} | {hops} | {ratio:.2f}x |'
    )
  return lines


def verdict(devices: int, report: dict, reference: dict) -> str:
  """PASS / MISS of the step against the target."""
  step, one = report['estimate']['seconds'], reference['estimate']['seconds']
  ratio = step / (devices * one)
  return (
    f'{"PASS" if ratio <= TARGET_RATIO else "MISS"} (ESTIMATED): {devices} devices, '
    f'{report["estimate"].get("ring_block_op")}: {step:.1f} s '
    f'= {ratio:.2f}x {devices} x the one-device step ({one:.1f} s), target <= {TARGET_RATIO}x'
  )


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out', required=True, help='dumps and report.json per row')
  parser.add_argument('--target', default='h200', help='a GPU target name (experiments.compile)')
  parser.add_argument('--devices', default='2,4,8', help='ring sizes (the 1-device row always)')
  parser.add_argument('--tokens_per_device', type=int, default=131072)
  parser.add_argument('--ops', default=','.join(BLOCK_OPS), help=f'of {", ".join(BLOCK_OPS)}')
  args = parser.parse_args(argv)
  per_device, ops = args.tokens_per_device, args.ops.split(',')
  reference = compile_row(args.out, args.target, 1, per_device, ops[0])
  rows = [(1, per_device, reference)]
  for op in ops:
    for devices in map(int, args.devices.split(',')):
      tokens = devices * per_device
      rows.append((devices, tokens, compile_row(args.out, args.target, devices, tokens, op)))
  print('\n'.join(table(rows, reference)))
  if any(NO_COST in w for _, _, r in rows for w in r['estimate']['warnings']):
    print('(*) a kernel of this step states no cost: costed by its bytes only (underestimate)')
  largest = max(map(int, args.devices.split(',')))
  for op in ops:
    report = compile_row(args.out, args.target, largest, largest * per_device, op)
    print(verdict(largest, report, reference))


if __name__ == '__main__':
  main()

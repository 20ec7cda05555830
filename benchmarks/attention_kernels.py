"""The fused attention kernels judged by the compiled program, on an H100 and a TPU v5e, from a
CPU host: every figure here is an ESTIMATE (the roofline of realformer_jax/aot/roofline.py over
the program XLA compiled for the target; no device is involved).

    python -m benchmarks.attention_kernels           # full: ~35 compiles, ~40 min on 2 cores
    python -m benchmarks.attention_kernels --quick   # toy shapes: the code path (~1 min)

Rows (bfloat16 compute, float32 parameters, dropout 0.1, the project's train step):
* BERT-Large 32 x 512 (80 predictions per sequence), rolled layer scan, one H100: post / pre /
  realformer through the kernels ('pallas'), post and realformer through the einsum path
  ('xla'), Hugging Face's FlaxBertForMaskedLM in the same train step, and post with the scan
  unrolled (as configs/bert.py does for Small and Base).
* The same on a TPU v5e 2 x 2 slice (global batch 32 over 4 chips), where XLA's own
  `optimal_seconds` is printed beside the roofline when XLA gives one (it returns a negative
  number, dropped, for programs with loops: the whole train step).
* Long sequences, BERT-Base, batch 1, every layer rematerialised: post and realformer with
  residual_scores_backward='recomputed', L = 2048 / 4096 / 8192 / 16384, step and XLA memory
  (on the TPU, L = 16384 on one v5e chip: a batch of 1 cannot be split over a slice).

For each row: estimated step, MFU (model FLOPs, benchmarks/flops.py, over the datasheet bf16 matmul
rate: 805 TFLOP/s on an H100), HBM bytes, XLA's step memory, and the attention kernels' own rows
(their FLOPs and bytes as the kernels state them,
realformer_jax/kernels/backends/triton/attention.py).
RealFormer's carried sum has a floor, whatever the kernel: per layer and score element
(E = B H L^2) it reads acc_{l-1} and writes acc_l going up (8 bytes), and going down reads the
carried gradient and writes the next one (8), plus either reads a saved acc_l (4: the 20-byte
floor, N sums held) or reads acc_l and writes acc_{l-1} (8: the 24-byte floor, sums rebuilt,
two held). The kernels rebuild; the target compares the bytes realformer adds to post with 1.3x
the 24-byte floor, and the ratio to the 20-byte one is printed too.

Targets, printed PASS / MISS per target chip: post MFU >= 0.45; post below Hugging Face; pre <=
post; realformer's extra bytes <= 1.3 x floor; BERT-Base realformer at L = 16384 fits the
device with the float32 carry. Results, per row as it finishes (a rerun resumes), in
docs/results/attention_kernels/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Callable, Optional, Sequence

import jax

from benchmarks import flops as flops_lib
from benchmarks import profiles
from realformer_jax.aot import roofline, targets
from realformer_jax.bench import steps
from realformer_jax.train import build, pretraining
from realformer_jax.units import GiB

RESULTS_DIR = os.path.join('docs', 'results', 'attention_kernels')
# The accelerator profile's BERT-Large 32 x 512, under this benchmark's result-file name.
LARGE = dataclasses.replace(profiles.LARGE_512, name='bert_large_32x512')
TINY = steps.Shape(
  'tiny_8x128', hidden=64, layers=2, heads=4, vocab=1000, seq_len=128, batch=8, predictions=20
)


def long_shape(length: int) -> steps.Shape:
  """BERT-Base, one sequence of `length` tokens, 15% of them predicted."""
  return dataclasses.replace(
    profiles.BASE,
    name=f'bert_base_1x{length}',
    seq_len=length,
    batch=1,
    predictions=max(1, round(0.15 * length)),
  )


@dataclasses.dataclass(frozen=True)
class Row:
  name: str  # unique: the results file
  target: str  # realformer_jax.aot.targets spec
  shape: steps.Shape
  layout: str  # 'post' | 'pre' | 'realformer' | 'hf'
  overrides: tuple = ()  # model config (name, value) pairs

  @property
  def label(self) -> str:
    extra = ', '.join(f'{k}={v}' for k, v in self.overrides if k != 'attention_impl')
    impl = dict(self.overrides).get('attention_impl', '')
    text = 'HF FlaxBertForMaskedLM' if self.layout == 'hf' else f'{self.layout} {impl}'
    return f'{text} ({extra})' if extra else text


def _rows(target: str, shape: steps.Shape, unrolled: bool) -> list[Row]:
  tag = f'{target.split(":")[0]}_{shape.name}'
  rows = [
    Row(f'{tag}_{layout}_{impl}', target, shape, layout, (('attention_impl', impl),))
    for layout, impl in (
      ('post', 'pallas'),
      ('pre', 'pallas'),
      ('realformer', 'pallas'),
      ('post', 'xla'),
      ('realformer', 'xla'),
    )
  ]
  rows.append(Row(f'{tag}_hf', target, shape, 'hf'))
  if unrolled:
    rows.append(
      Row(
        f'{tag}_post_pallas_unrolled',
        target,
        shape,
        'post',
        (('attention_impl', 'pallas'), ('scan_unroll', shape.layers)),
      )
    )
  return rows


def _long_rows(target: str, lengths: Sequence[int]) -> list[Row]:
  rows = []
  for length in lengths:
    shape = long_shape(length)
    tag = f'{target.split(":")[0]}_{shape.name}'
    remat = (('attention_impl', 'pallas'), ('remat_policy', 'full'))
    rows.append(Row(f'{tag}_post', target, shape, 'post', remat))
    rows.append(
      Row(
        f'{tag}_realformer',
        target,
        shape,
        'realformer',
        remat + (('residual_scores_backward', 'recomputed'),),
      )
    )
  return rows


def plan(quick: bool) -> list[Row]:
  if quick:
    return [
      Row(
        f'{target.split(":")[0]}_tiny_{layout}',
        target,
        TINY,
        layout,
        (('attention_impl', 'pallas'),),
      )
      for target in ('h100:1', 'v5e:2x2')
      for layout in ('post', 'realformer')
    ]
  return (
    _rows('h100:1', LARGE, unrolled=True)
    + _long_rows('h100:1', (2048, 4096, 8192, 16384))
    + _rows('v5e:2x2', LARGE, unrolled=False)
    # batch 1 cannot be split over a slice: one chip (16 GB) for the long row.
    + _long_rows('v5e:1x1', (16384,))
  )


def compile_row(row: Row, devices: list) -> jax.stages.Compiled:
  """The row's train step compiled for `devices` (the target's compile-only devices)."""
  if row.layout == 'hf':
    return steps.compile_hf_step(row.shape, devices, dropout=0.1, dtype='bfloat16')
  config = steps.train_config(
    row.shape, ln_placement=row.layout, dropout=0.1, dtype='bfloat16', **dict(row.overrides)
  )
  spec = pretraining.validate_config(config, device_count=len(devices), process_count=1)
  return build.compile_train_step(build.make_setup(spec, devices))


def _memory_bytes(compiled) -> int:
  m = compiled.memory_analysis()
  return int(
    m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  )


def measure(row: Row) -> dict:
  """One row's estimate (JSON-serialisable); a program larger than the TPU's HBM is a row that
  does not fit (XLA:TPU refuses to compile it)."""
  target = targets.parse(row.target)
  start = time.perf_counter()
  try:
    compiled = compile_row(row, target.devices())
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    return {
      'fits': False,
      'error': str(e).splitlines()[0][:300],
      'compile_s': time.perf_counter() - start,
    }
  compile_s = time.perf_counter() - start
  shape = row.shape
  est = roofline.estimate(compiled, target, score_dims=(shape.seq_len, shape.seq_len))
  peak = targets.mfu_peak_flops(target.chip)  # the datasheet's, as every MFU figure
  model_flops = flops_lib.model_flops(shape)
  memory = _memory_bytes(compiled)
  attention = [
    dict(
      kernel=k.name,
      op=k.op_name.rsplit('/', 2)[-2],
      count=k.count,
      bytes=k.bytes,
      matmul_flops=k.matmul_flops,
      ms=k.total_seconds * 1e3,
      bound=k.bound,
    )
    for k in est.kernels
    if k.opcode == 'custom-call' and 'attention' in k.op_name
  ]
  return {
    'fits': memory <= target.chip.usable_memory_bytes,
    'compile_s': compile_s,
    'step_s': est.seconds,
    'mfu': model_flops / est.seconds / peak / target.num_devices,
    'model_flops': model_flops,
    'hbm_bytes': est.hbm_bytes,
    'memory_bytes': memory,
    'usable_bytes': target.chip.usable_memory_bytes,
    'launches': est.launches,
    'by_category_ms': {k: v * 1e3 for k, v in est.by_category().items()},
    'xla_optimal_s': est.xla_optimal_seconds,
    'warnings': list(est.warnings),
    'attention_kernels': attention,
  }


def run_rows(rows: Sequence[Row], out_dir: str, log: Callable[[str], None] = print) -> dict:
  """Measures every row not measured yet (a result per row in out_dir/runs), with a progress
  line; returns {row name: result}."""
  runs_dir = os.path.join(out_dir, 'runs')
  os.makedirs(runs_dir, exist_ok=True)
  results, spent, done_now = {}, 0.0, 0
  for index, row in enumerate(rows):
    path = os.path.join(runs_dir, f'{row.name}.json')
    if os.path.exists(path):
      with open(path) as f:
        results[row.name] = json.load(f)
      continue
    left = len(rows) - index
    eta = f', ETA {spent / done_now * left / 60:.0f} min' if done_now else ''
    log(f'[{index + 1}/{len(rows)}] {row.target} {row.shape.name} {row.label}{eta}')
    start = time.perf_counter()
    result = measure(row)
    spent += time.perf_counter() - start
    done_now += 1
    with open(path, 'w') as f:
      json.dump(result, f, indent=1)
    results[row.name] = result
  return results


# ---------------------------------------------------------------------------------------------
# Report.


def floors(shape: steps.Shape) -> dict:
  elements = shape.batch * shape.heads * shape.seq_len**2 * shape.layers
  return {'score_elements': elements, 'floor20': 20 * elements, 'floor24': 24 * elements}


def _fmt_row(row: Row, r: dict) -> str:
  if 'step_s' not in r:
    return f'| {row.label} | does not fit: {r["error"][:90]} | | | | |'
  optimal = r.get('xla_optimal_s')
  optimal = '' if optimal is None else f'{optimal * 1e3:.1f}'
  fits = '' if r['fits'] else ' (does not fit)'
  return (
    f'| {row.label} | {r["step_s"] * 1e3:.1f} | {r["mfu"]:.3f} | '
    f'{r["hbm_bytes"] / 1e9:.1f} | {r["memory_bytes"] / GiB:.2f}{fits} | {optimal} |'
  )


def _kernel_table(row: Row, r: dict) -> list[str]:
  lines = [
    f'Attention kernels of "{row.label}" ({row.target}, {row.shape.name}), per step:',
    '',
    '| kernel | count | bytes each | matmul FLOPs each | ms total | bound |',
    '|---|---:|---:|---:|---:|---|',
  ]
  merged: dict = {}  # an unrolled stack has one kernel per layer: one line per op and size
  for k in r.get('attention_kernels', []):
    key = (k['op'], k['bytes'], k['matmul_flops'], k['bound'])
    if key in merged:
      merged[key] = dict(
        merged[key], count=merged[key]['count'] + k['count'], ms=merged[key]['ms'] + k['ms']
      )
    else:
      merged[key] = dict(k)
  for k in merged.values():
    lines.append(
      f'| {k["op"]} | {k["count"]} | {k["bytes"] / 1e6:.0f} MB | '
      f'{k["matmul_flops"] / 1e9:.1f} G | {k["ms"]:.2f} | {k["bound"]} |'
    )
  return lines + ['']


def verdicts(rows: Sequence[Row], results: dict) -> list[tuple[str, bool, str]]:
  """(target, passed, detail) for every target chip present."""
  by_name = {row.name: (row, results.get(row.name)) for row in rows}
  out = []
  for tag in sorted({row.target.split(':')[0] for row in rows}):
    large = [row for row in rows if row.name.startswith(f'{tag}_{LARGE.name}_')]
    chip = large[0].target if large else tag
    # Bytes are per device; the floor is the whole batch's, shared by the data-parallel chips.
    devices = targets.parse(chip).num_devices if large else 1

    def get(suffix):
      row, r = by_name.get(f'{tag}_{LARGE.name}_{suffix}', (None, None))
      return r if r and 'step_s' in r else None

    post, pre, real, hf = get('post_pallas'), get('pre_pallas'), get('realformer_pallas'), get('hf')
    if post:
      out.append(
        (
          f'{chip} post MFU >= 0.45',
          post['mfu'] >= 0.45,
          f'{post["mfu"]:.3f} ({post["step_s"] * 1e3:.1f} ms)',
        )
      )
    if post and hf:
      out.append(
        (
          f'{chip} post below Hugging Face',
          post['step_s'] < hf['step_s'],
          f'{post["step_s"] * 1e3:.1f} vs {hf["step_s"] * 1e3:.1f} ms',
        )
      )
    if post and pre:
      out.append(
        (
          f'{chip} pre <= post',
          pre['step_s'] <= post['step_s'] * 1.0005,
          f'{pre["step_s"] * 1e3:.1f} vs {post["step_s"] * 1e3:.1f} ms',
        )
      )
    if post and real:
      f = {k: v / devices for k, v in floors(LARGE).items()}
      extra = real['hbm_bytes'] - post['hbm_bytes']
      out.append(
        (
          f'{chip} realformer bytes beyond post <= 1.3 x floor',
          extra <= 1.3 * f['floor24'],
          f'{extra / 1e9:.1f} GB = {extra / f["floor24"]:.2f} x the 24-byte floor '
          f'({f["floor24"] / 1e9:.1f} GB), {extra / f["floor20"]:.2f} x the 20-byte '
          f'one; {extra / f["score_elements"]:.1f} B per score element and layer',
        )
      )
    long_row, long_r = by_name.get(f'{tag}_{long_shape(16384).name}_realformer', (None, None))
    if long_r:
      fits = bool(long_r['fits'])
      detail = (
        f'{long_r["memory_bytes"] / GiB:.1f} GiB of {long_r["usable_bytes"] / GiB:.1f} GiB usable'
        if 'memory_bytes' in long_r
        else long_r.get('error', '')[:120]
      )
      out.append(
        (f'{long_row.target} BERT-Base realformer L=16384 fits (float32 carry)', fits, detail)
      )
  return out


def render(rows: Sequence[Row], results: dict, quick: bool) -> str:
  lines = [
    "# Attention kernels: estimated from XLA's compile for the target on a CPU host",
    '',
    'ESTIMATES (realformer_jax/aot/roofline.py), not measurements: no GPU or TPU was '
    'used. `python -m benchmarks.attention_kernels' + (' --quick' if quick else '') + '`.',
    '',
  ]
  groups: dict = {}
  for row in rows:
    groups.setdefault((row.target, row.shape.name), []).append(row)
  for (target, shape_name), group in groups.items():
    lines += [
      f'## {target}, {shape_name}',
      '',
      '| candidate | est. step (ms) | MFU | HBM bytes (GB) | XLA memory (GiB) | '
      'XLA optimal_seconds (ms) |',
      '|---|---:|---:|---:|---:|---:|',
    ]
    lines += [_fmt_row(row, results[row.name]) for row in group if row.name in results]
    lines.append('')
  for row in rows:
    r = results.get(row.name)
    if r and r.get('attention_kernels') and row.layout != 'hf' and row.shape in (LARGE, TINY):
      lines += _kernel_table(row, r)
  lines += ['## Targets', '']
  for name, passed, detail in verdicts(rows, results):
    lines.append(f'{"PASS" if passed else "MISS"}  {name}: {detail}')
  return '\n'.join(lines) + '\n'


def main(argv: Optional[Sequence[str]] = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true', help='toy shapes: the code path only')
  parser.add_argument('--out_dir', default=None)
  args = parser.parse_args(argv)
  out_dir = args.out_dir or os.path.join(RESULTS_DIR, 'quick' if args.quick else 'full')
  rows = plan(args.quick)
  results = run_rows(rows, out_dir, log=lambda s: print(s, file=sys.stderr, flush=True))
  report = render(rows, results, args.quick)
  print(report)
  with open(os.path.join(out_dir, 'results.md'), 'w') as f:
    f.write(report)
  with open(os.path.join(out_dir, 'results.json'), 'w') as f:
    json.dump(
      {
        'rows': {
          row.name: dict(
            label=row.label, target=row.target, shape=row.shape.name, result=results[row.name]
          )
          for row in rows
        },
        'verdicts': [dict(target=n, passed=p, detail=d) for n, p, d in verdicts(rows, results)],
      },
      f,
      indent=1,
    )
  return results


if __name__ == '__main__':
  main()

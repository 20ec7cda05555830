"""Calibration of the estimator at long sequences: every step and kernel time an H200 measured
(issue 40, three sets of code), the same code compiled for an H200 here and estimated, side by side.

    python -m benchmarks.qk_calibration          # ~45 min on 2 CPU cores (eighteen compiles)
    python -m benchmarks.qk_calibration --table  # only re-time the committed inputs
    python -m benchmarks.qk_calibration --new    # compile only a newly added measured set
    python -m benchmarks.qk_calibration --table --fit  # refit the two fitted constants
    python -m benchmarks.qk_calibration --seq_len=256 --out=DIR   # the path at a toy length
    python -m benchmarks.qk_calibration --seq_len=256 --out=DIR --commits=eaf81ca  # one set

MEASURED is the only device truth at these lengths. One NVIDIA H200 ran BERT-Base, batch 1,
bfloat16 compute, every layer rematerialised, dropout and attention dropout 0.1, learned
positions, rolled layer scan, a warm-up then the median of 2 timed steps, on four commits
(SETS): `eaf81ca` (2026-11-26: the qk Triton kernels before issue 40, per-layer atomics;
Post-LN and `qk` at L = 65,536, `benchmarks.long_sequences`'s `measure`), `1a0cee4`
(2026-11-26: issue 40's first redesign; `benchmarks.device_suite`: Post-LN, `qk` and the
scores carry at 16k-65k, and a profiler trace's per-kernel split at 16,384:
docs/results/device_suite/h200-2026-11-26), `e64cd4c` (2026-11-27: no attention forward in
the backward; the suite again, the split at 65,536: docs/results/device_suite/h200-2026-11-27)
and `43e232e` (2026-11-27: candidate backward tiles at 65,536, `qk` on the 64 x 128 dS tile
among them: docs/results/device_suite/h200-2026-11-27-tiles).

This script extracts each commit with `git archive`, compiles its train steps for an H200 in a
subprocess inside the extracted tree (JAX_PLATFORMS=cpu: no device), and runs TODAY's estimator
over them (the old qk kernels' L2 traffic and atomics stated on their behalf:
realformer_jax/aot/legacy_kernels.py). It writes to docs/results/aot/qk_calibration/:
inputs-<commit>-<variant>-<L>.json (every kernel's work and count: the estimator's inputs, so
the table is re-timed without compiling, by tests and by `--table` after a rate changes),
results.json and results.md (measured, the estimate before this calibration, the estimate
now and its error, per row and per kernel).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import tempfile
import textwrap
from typing import Optional

from benchmarks.aot_calibration import compile_in_tree, extract
from realformer_jax.aot import categories, legacy_kernels, roofline, targets
from realformer_jax.studies import runs as runs_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT_DIR = REPO / 'docs' / 'results' / 'aot' / 'qk_calibration'
TARGET = 'h200:1'  # the device that measured
ALSO = 'h100:1'  # the same program on an H100: HBM 3.35 vs 4.8 TB/s, the same SMs
SEQ_LEN = 65_536
SETTINGS = (
  'BERT-Base (hidden 768, 12 layers, 12 heads, vocab 30522), batch 1, bfloat16 compute, float32 '
  'parameters and AdamW state, remat_policy=full, dropout 0.1, attention dropout 0.1, learned '
  'positions, rolled layer scan, 15% of tokens predicted; a warm-up step, then the median of 2 '
  'timed steps'
)
OVERRIDES = {
  'post': {'ln_placement': 'post'},
  'qk': {'ln_placement': 'realformer', 'residual_carry': 'qk'},
  # the scores carry rebuilt going down the stack, as commit 1a0cee4 spelled it
  'recomputed': {
    'ln_placement': 'realformer',
    'residual_carry': 'scores',
    'residual_scores_backward': 'recomputed',
  },
  # qk on the dS tile a device suite timed as a candidate (--qk_ds_tiles=64x128): '_tiles'
  # replaces fields of the Triton tile table's row while the step is traced
  'qk-ds64x128': {
    'ln_placement': 'realformer',
    'residual_carry': 'qk',
    '_tiles': {'block_bwd': 64, 'ds_rows': 128},
  },
}
# The qk backward's dS GEMMs (XLA's matmuls inside its slot-bucket switch, costed per executed
# branch: realformer_jax/aot/switches.py): measured, never fitted (no fitted constant touches a
# GEMM), the validation of the executed-branch costing.
DS_GEMMS = 'dS GEMMs (cuBLAS)'
# The measured sets: per commit, its rows (L, variant, measured step s, device peak GiB or None,
# the estimate before this calibration) and, per (L, variant), the profiler's device seconds
# per step of the fused attention kernels (all calls of that name summed).
# Set 'eaf81ca': issue 40's figures; "before" = this table's estimate before the fused-kernel
# term (4.50 / 62.0 s). Set '1a0cee4': docs/results/device_suite/h200-2026-11-26; "before" =
# the suite's ESTIMATE of the very program that ran.
SETS = {
  'eaf81ca1f68adb9acc3ca79c9fbeb241d29b3948': {  # legacy_kernels.QK_KERNELS_COMMIT
    'date': '2026-11-26',
    'device': 'NVIDIA H200',
    'what': 'the qk Triton kernels before issue 40 (per-layer atomics, a float32 stack)',
    'rows': [(65_536, 'post', 5.90, 12.3, 4.50), (65_536, 'qk', 56.5, 15.1, 62.0)],
    'kernels': {},
  },
  '1a0cee47cc451d0707db808b097edce961b1860b': {
    'date': '2026-11-26',
    'device': 'NVIDIA H200',
    'what': "issue 40's first redesign (no atomics, a 16-bit stack, dS panels and XLA matmuls, "
    '8-bit dropout draws; the forward re-run in the backward)',
    'rows': [
      (65_536, 'post', 6.06, 12.1, 3.49),
      (65_536, 'qk', 15.5, 13.6, 9.01),
      (32_768, 'post', 1.54, None, 0.908),
      (32_768, 'qk', 3.95, None, 2.30),
      (16_384, 'post', 0.412, None, 0.246),
      (16_384, 'recomputed', 1.17, 30.2, 0.715),
      (16_384, 'qk', 1.01, None, 0.602),
    ],
    'kernels': {
      (16_384, 'post'): {'flash_attention_fwd': 0.247, 'flash_attention_bwd': 0.131},
      (16_384, 'qk'): {'realformer_qk_attention_fwd': 0.432, 'realformer_qk_attention_ds': 0.424},
    },
  },
  # docs/results/device_suite/h200-2026-11-27; a device peak only where the row raised the
  # process's peak (the allocator keeps one peak per process, not one per program).
  'e64cd4c04f7c53cdcb1f7ed1e7ac0d287b098344': {
    'date': '2026-11-27',
    'device': 'NVIDIA H200',
    'what': 'no attention forward in the backward (the layers save their output and row '
    'statistics, Post-LN too), 128 x 128 forward tiles, a hash-only dropout mask kernel',
    'rows': [
      (65_536, 'post', 4.02, 12.9, 5.27),
      (65_536, 'qk', 11.37, 14.8, 11.54),
      (32_768, 'post', 1.066, 5.75, 1.356),
      (32_768, 'qk', 2.889, 8.91, 2.923),
      (16_384, 'post', 0.290, None, 0.360),
      (16_384, 'recomputed', 1.185, 30.2, 0.797),
    ],
    'kernels': {
      (65_536, 'post'): {
        'flash_attention_fwd': 1.215,
        'flash_attention_bwd': 2.022,
        'attention_dropout_mask': 0.666,
      },
      (65_536, 'qk'): {
        'realformer_qk_attention_fwd': 2.656,
        'realformer_qk_attention_ds': 6.858,
        DS_GEMMS: 1.48,  # the six cuBLAS kernels in the trace's top eight (performance.md)
      },
    },
  },
  # docs/results/device_suite/h200-2026-11-27-tiles: the long part at 65,536 with candidate
  # tiles; "before" = the suite's ESTIMATE of the very program that ran. No per-kernel split.
  '43e232e6ee21ba33d801d6b1f3516e78f12fbea2': {
    'date': '2026-11-27',
    'device': 'NVIDIA H200',
    'what': "plain attention's backward on tiles that need not be square (the table's square "
    'tile); qk on the dS tile 64 x 64 and, as a candidate, 64 x 128',
    'rows': [
      (65_536, 'post', 4.003, 12.9, 4.380),
      (65_536, 'qk', 11.305, 14.9, 11.699),
      (65_536, 'qk-ds64x128', 9.121, 16.6, 10.388),
    ],
    'kernels': {},
  },
}
TOLERANCE = 0.30  # issue 40: the calibrated estimate within 30 % of each measured step
# Measured rows the calibrated model misses by more than TOLERANCE, with the likely reason:
# stated here, drawn in the table, and checked to stay missed (tests/aot/test_aot_kernel_costs.py)
# until the model explains them.
_CONTENDED_ATOMICS = (
  'the scores carry: its backward is bound by its dQ atomic adds (1 per score element) at '
  'the coalesced, uncontended atomic rate; every key-block program adds into the same dQ rows '
  "in the same order, and the model has no term for that contention (the old qk backward's "
  'atomics, spread over l + 1 layers of dQ, fit at the same rate)'
)
OUTSIDE_TOLERANCE = {
  (commit, length, variant): _CONTENDED_ATOMICS
  for commit, measured in SETS.items()
  for length, variant, *_ in measured['rows']
  if variant == 'recomputed'  # the scores carry, wherever a set measured it
}

# Measured kernels the calibrated model misses by more than TOLERANCE, with the reason (checked
# to stay within 40 % by tests/aot/test_aot_kernel_costs.py).
KERNELS_OUTSIDE_TOLERANCE = {
  ('1a0cee47cc451d0707db808b097edce961b1860b', 16_384, 'post', 'flash_attention_fwd'): (
    'the forward on its 128 x 64 tiles (4 warps), two calls a layer: one efficiency for every '
    'fused kernel cannot see tiles or warps (the same kernel on 128 x 128 tiles, 8 warps, at '
    'e64cd4c: +13 %)'
  )
}

# Runs inside the extracted tree: its own benchmarks.steps and train package, on H200 devices
# described by today's targets.py (argv: variant overrides JSON, output path, target config).
_COMPILE_OLD_CODE = textwrap.dedent("""
    import json, sys
    from jax.experimental import topologies
    from benchmarks import steps
    from realformer_jax.train import build, pretraining

    import contextlib
    overrides, out_path, target_config, length = sys.argv[1:5]
    length, overrides = int(length), json.loads(overrides)
    tiles = contextlib.nullcontext()
    if '_tiles' in overrides:  # a candidate tile (commits since 43e232e have the override)
      from realformer_jax.kernels.backends.triton import tiles as table
      tiles = table.override(table.device_tiles()._replace(**overrides.pop('_tiles')))
    devices = topologies.get_topology_desc('h200', 'cuda', target_config=target_config,
                                           topology='1x1x1').devices
    shape = steps.Shape(f'L{length}', hidden=768, layers=12, heads=12, vocab=30522,
                        seq_len=length, batch=1, predictions=max(1, round(0.15 * length)))
    config = steps.train_config(shape, dropout=0.1, dtype='bfloat16', remat_policy='full',
                                scan_unroll=1, **overrides)
    spec = pretraining.validate_config(config, device_count=1, process_count=1)
    with tiles:
      compiled = build.compile_train_step(build.make_setup(spec, list(devices)))
    with open(out_path, 'w') as f:
      f.write(compiled.as_text())
""")


def compile_old(commit: str, variant: str, tree: str, out_path: str, seq_len: int) -> None:
  chip = targets.parse(TARGET).chip
  args = [json.dumps(OVERRIDES[variant]), out_path, chip.gpu_target_config, str(seq_len)]
  compile_in_tree(_COMPILE_OLD_CODE, args, tree, f'{variant} at {commit[:7]}, L = {seq_len}')


def estimate_inputs(hlo: str, seq_len: int) -> dict:
  """Every kernel of the program with its count and work (roofline.work_record), the old qk
  kernels' L2 bytes and atomics stated on their behalf."""
  est = roofline.estimate(
    hlo,
    targets.parse(TARGET),
    score_dims=(seq_len, seq_len),
    costs_on_behalf=legacy_kernels.costs_on_behalf,
  )
  return {
    'warnings': list(est.warnings),
    'kernels': [
      {
        'name': k.name,
        'category': k.category,
        'op_name': k.op_name,
        'count': k.count,
        'work': k.work,
      }
      for k in est.kernels
    ],
  }


def programs(seq_len: int = 0, sets: Optional[dict] = None) -> list[tuple[str, int, str]]:
  """(commit, L, variant) of every measured program; at a toy `seq_len`, each set's variants
  at that length."""
  out = []
  for commit, measured in (sets or SETS).items():
    for length, variant, *_ in measured['rows']:
      key = (commit, seq_len or length, variant)
      if key not in out:
        out.append(key)
  return out


def input_name(commit: str, length: int, variant: str) -> str:
  return f'inputs-{commit[:7]}-{variant}-{length}.json'


def _kernel_name(op_name: str, category: str = '') -> str:
  """The pallas_call's kernel, from its op name (`.../flash_attention_fwd/pallas_call`), or
  DS_GEMMS for a matmul inside the qk backward's switch (`.../attention/cond/branch_n_fun/...`)."""
  parts = op_name.split('/')
  if category == categories.GEMM and '/attention/cond/branch_' in op_name:
    return DS_GEMMS
  return parts[-2] if len(parts) > 1 and parts[-1] == 'pallas_call' else ''


def timed(inputs: dict, chip: targets.Chip) -> dict:
  """The estimate of a program from its committed inputs: seconds per step, by what bounds
  each kernel, per fused kernel name, and the dearest kernels."""
  by_bound: dict[str, float] = {}
  by_kernel: dict[str, float] = {}
  rows = []
  for k in inputs['kernels']:
    seconds, bound = roofline.kernel_seconds(k['work'], chip)
    total = seconds * k['count']
    by_bound[bound] = by_bound.get(bound, 0.0) + total
    name = _kernel_name(k['op_name'], k.get('category', ''))
    if name:
      by_kernel[name] = by_kernel.get(name, 0.0) + total
    rows.append((total, bound, k))
  rows.sort(key=lambda r: -r[0])
  return {
    'step_s': sum(by_bound.values()),
    'by_bound': dict(sorted(by_bound.items(), key=lambda kv: -kv[1])),
    'by_kernel': by_kernel,
    'top': [
      {'seconds': t, 'bound': b, 'count': k['count'], 'op_name': k['op_name'][-80:]}
      for t, b, k in rows[:4]
    ],
  }


def fit(inputs: dict[tuple, dict], chip: targets.Chip) -> dict:
  """The two fitted constants (targets.FUSED_KERNEL_EFFICIENCY and HOPPER_L2_FRACTION) by
  least squares in log space, over a grid of 0.02 steps, to every measured fused kernel of
  every set: {'efficiency', 'l2_fraction', 'errors': {(commit, L, variant, kernel): error}}."""
  measured = []  # (key, seconds measured, [(work, count)] of the kernels of that name)
  for commit, sets in SETS.items():
    for (length, variant), kernels in sets['kernels'].items():
      program = inputs[(commit, length, variant)]['kernels']
      for name, seconds in kernels.items():
        if name == DS_GEMMS:  # no fitted constant costs a GEMM: a validation, not a fit
          continue
        works = [
          (k['work'], k['count'])
          for k in program
          if _kernel_name(k['op_name'], k['category']) == name
        ]
        measured.append(((commit, length, variant, name), seconds, works))

  def errors(efficiency: float, fraction: float) -> dict:
    rates = dataclasses.replace(
      chip,
      fused_kernel_efficiency=efficiency,
      l2_bytes_per_s=targets.HOPPER_L2_PEAK_BYTES_PER_S * fraction,
    )
    return {
      key: sum(roofline.kernel_seconds(w, rates)[0] * n for w, n in works) / seconds - 1
      for key, seconds, works in measured
    }

  grid = [round(0.02 * i, 2) for i in range(10, 76)]  # 0.20 ... 1.50
  loss = lambda e, f: sum(math.log1p(x) ** 2 for x in errors(e, f).values())
  best = min(((e, f) for e in grid for f in grid if f <= 1.0), key=lambda ef: loss(*ef))
  return {'efficiency': best[0], 'l2_fraction': best[1], 'errors': errors(*best)}


def _error(estimate: float, measured: float) -> float:
  return estimate / measured - 1


def table(inputs: dict[tuple, dict], sets: Optional[dict] = None) -> dict:
  """{'rows': [...], 'kernels': [...]}: every measured step and fused kernel time beside the
  estimate before this calibration and now (H200, and the step on an H100), with the error."""
  h200, h100 = targets.parse(TARGET).chip, targets.parse(ALSO).chip
  rows, kernels = [], []
  for commit, measured in (sets or SETS).items():
    for length, variant, step, peak, before in measured['rows']:
      program = inputs[(commit, length, variant)]
      now = timed(program, h200)
      rows.append(
        {
          'commit': commit,
          'date': measured['date'],
          'device': measured['device'],
          'seq_len': length,
          'variant': variant,
          'step_s': step,
          'device_peak_gib': peak,
          'estimate_before_s': before,
          'error_before': _error(before, step),
          'estimate_s': now['step_s'],
          'error': _error(now['step_s'], step),
          'within_tolerance': abs(_error(now['step_s'], step)) <= TOLERANCE,
          'known_miss': OUTSIDE_TOLERANCE.get((commit, length, variant)),
          'estimate_h100_s': timed(program, h100)['step_s'],
          'by_bound_s': now['by_bound'],
          'top': now['top'],
        }
      )
      for name, seconds in measured['kernels'].get((length, variant), {}).items():
        estimate = now['by_kernel'].get(name, 0.0)
        kernels.append(
          {
            'commit': commit,
            'seq_len': length,
            'variant': variant,
            'kernel': name,
            'device_s': seconds,
            'estimate_s': estimate,
            'error': _error(estimate, seconds),
          }
        )
  return {'rows': rows, 'kernels': kernels}


def render(result: dict, seq_len: int = 0, sets: Optional[dict] = None) -> str:
  sets = sets or SETS
  lines = ['# Calibration at long sequences: the estimate vs an H200 (issue 40)', '']
  if seq_len:
    lines += [
      f'**A check of the path at L = {seq_len:,}: the estimates below are for that length and '
      'are not comparable with the measurements.**',
      '',
    ]
  lines += [f'MEASURED on one NVIDIA H200. {SETTINGS}. {len(sets)} sets of code:', '']
  for commit, measured in sets.items():
    lines.append(f'- `{commit[:7]}` ({measured["date"]}, {measured["device"]}): {measured["what"]}')
  chip = targets.parse(TARGET).chip
  lines += [
    '',
    'ESTIMATED: each commit compiled for an H200 on a CPU host (`python -m '
    "benchmarks.qk_calibration`), read by realformer_jax/aot/roofline.py (the old qk kernels' "
    'L2 traffic and atomics stated on their behalf: realformer_jax/aot/legacy_kernels.py). A '
    'fused Pallas kernel runs its matmuls and CUDA-core work in sequence at '
    f'{chip.fused_kernel_efficiency} of the peak rates (targets.FUSED_KERNEL_EFFICIENCY, fitted '
    'to every per-kernel time below). "before": the estimate of its day '
    '(for `eaf81ca` and `1a0cee4` the model before that term, the max of the parts at peak '
    "rates; for `e64cd4c` the suite's own). The H100 column is the same program at the H100's "
    'rates.',
    '',
    '| commit | L | variant | MEASURED step (s) | device peak (GiB) | ESTIMATED before (s) | '
    'error | ESTIMATED now, H200 (s) | error | same program, H100 (s) | what bounds it (s) |',
    '|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|',
  ]
  for r in result['rows']:
    bounds = ', '.join(f'{b} {s:.2f}' for b, s in r['by_bound_s'].items() if s >= 0.01)
    peak = f'{r["device_peak_gib"]:.1f}' if r['device_peak_gib'] else ''
    lines.append(
      f'| `{r["commit"][:7]}` | {r["seq_len"]:,} | {r["variant"]} | {r["step_s"]:.3g} | {peak} | '
      f'{r["estimate_before_s"]:.3g} | {r["error_before"]:+.0%} | {r["estimate_s"]:.3g} | '
      f'{r["error"]:+.0%}{"" if r["within_tolerance"] else " (OUTSIDE 30 %)"} | '
      f'{r["estimate_h100_s"]:.3g} | {bounds} |'
    )
  for r in result['rows']:
    if r['known_miss']:
      lines += ['', f'Outside the band, `{r["commit"][:7]}` {r["variant"]} at {r["seq_len"]:,}: '
                f'{r["known_miss"]}.']  # fmt: skip
  lines += [
    '',
    'Per fused kernel (device seconds per step, all calls of that kernel; MEASURED by the '
    "device suite's profiler trace):",
    '',
    '| commit | L | variant | kernel | MEASURED (s) | ESTIMATED now (s) | error |',
    '|---|---:|---|---|---:|---:|---:|',
  ]
  for k in result['kernels']:
    lines.append(
      f'| `{k["commit"][:7]}` | {k["seq_len"]:,} | {k["variant"]} | `{k["kernel"]}` | '
      f'{k["device_s"]:.3g} | {k["estimate_s"]:.3g} | {k["error"]:+.0%} |'
    )
  for (commit, length, variant, kernel), why in KERNELS_OUTSIDE_TOLERANCE.items():
    lines += ['', f'Outside the band, `{kernel}` of `{commit[:7]}` {variant} at {length:,}: {why}.']
  lines += [
    '',
    f"`{DS_GEMMS}`: XLA's matmuls inside the qk backward's slot-bucket switch, each layer "
    'costed at the branch it runs (realformer_jax/aot/switches.py); no fitted constant costs '
    'them, so that row is a validation, not a fit.',
  ]
  return '\n'.join(lines) + '\n'


def load_inputs(directory: pathlib.Path = OUT_DIR) -> dict[tuple, dict]:
  return {key: json.loads((directory / input_name(*key)).read_text()) for key in programs()}


def committed(directory: pathlib.Path = OUT_DIR) -> dict:
  return json.loads((directory / 'results.json').read_text())


def write(
  result: dict, directory: pathlib.Path = OUT_DIR, seq_len: int = 0, sets: Optional[dict] = None
) -> str:
  runs_lib.write_json(
    str(directory / 'results.json'),
    {'target': TARGET, 'settings': SETTINGS, 'toy_seq_len': seq_len, **result},
  )
  text = render(result, seq_len, sets)
  (directory / 'results.md').write_text(text)
  return text


def compile_all(
  out: pathlib.Path, seq_len: int = 0, again: bool = True, sets: Optional[dict] = None
) -> dict[tuple, dict]:
  """Compiles every measured program (at `seq_len` if given) and writes its inputs; with
  `again` False, only those whose inputs `out` does not hold yet (a new measured set)."""
  inputs = {}
  with tempfile.TemporaryDirectory() as scratch:
    trees: dict[str, str] = {}
    for commit, length, variant in programs(seq_len, sets):
      held = out / input_name(commit, length, variant)
      if not again and held.exists():
        inputs[(commit, length, variant)] = json.loads(held.read_text())
        continue
      if commit not in trees:
        trees[commit] = os.path.join(scratch, commit[:7])
        extract(commit, trees[commit])
      print(f'compiling {variant} at {commit[:7]}, L = {length:,}, for an H200 ...', flush=True)
      path = os.path.join(scratch, 'program.hlo')
      compile_old(commit, variant, trees[commit], path, length)
      program = estimate_inputs(pathlib.Path(path).read_text(), length)
      runs_lib.write_json(str(out / input_name(commit, length, variant)), program)
      inputs[(commit, length, variant)] = program
  return inputs


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--table', action='store_true', help='re-time the committed inputs only')
  parser.add_argument(
    '--new', action='store_true', help='compile only the programs without inputs in --out'
  )
  parser.add_argument(
    '--fit', action='store_true', help="refit targets.py's two fused-kernel constants"
  )
  parser.add_argument(
    '--seq_len', type=int, default=0, help='one toy length for every program: a check of the path'
  )
  parser.add_argument('--out', default=None, help=f'results folder (default {OUT_DIR})')
  parser.add_argument(
    '--commits', default='', help='only the sets of these commits (prefixes, comma-separated)'
  )
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out) if args.out else OUT_DIR
  if args.seq_len and not args.out:
    print(f'error: --seq_len={args.seq_len} is not a measured length: give --out')
    sys.exit(2)
  sets = SETS
  if args.commits:
    prefixes = [p for p in args.commits.split(',') if p]
    sets = {c: m for c, m in SETS.items() if any(c.startswith(p) for p in prefixes)}
    if not sets or not args.out:
      why = 'matches no measured commit' if not sets else 'is part of the table: give --out'
      print(f'error: --commits={args.commits}: {why} (measured: {", ".join(c[:7] for c in SETS)})')
      sys.exit(2)
  out.mkdir(parents=True, exist_ok=True)
  if args.table:
    inputs = load_inputs(OUT_DIR)
  else:
    inputs = compile_all(out, args.seq_len, again=not args.new, sets=sets)
  if args.seq_len:  # the measured rows at the toy length's programs
    inputs = {(c, n, v): inputs[(c, args.seq_len, v)] for c, n, v in programs(0, sets)}
  result = table(inputs, sets)
  print(write(result, out, args.seq_len, sets))
  if args.fit:
    fitted = fit(inputs, targets.parse(TARGET).chip)
    print(
      f'fitted to {len(fitted["errors"])} measured kernels: FUSED_KERNEL_EFFICIENCY = '
      f'{fitted["efficiency"]}, HOPPER_L2_FRACTION = {fitted["l2_fraction"]} (targets.py has '
      f'{targets.FUSED_KERNEL_EFFICIENCY} and {targets.HOPPER_L2_FRACTION}); kernel errors '
      + ', '.join(f'{k[3]} at {k[0][:7]} {x:+.0%}' for k, x in fitted['errors'].items())
    )
  return result


if __name__ == '__main__':
  main(sys.argv[1:])

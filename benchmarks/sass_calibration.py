"""Calibration of the instruction term: every fused kernel an H200 timed, its SASS read, the
issue efficiency fitted, and each row's leave-one-out error.

    python -m benchmarks.sass_calibration            # table + fit from the committed data
    python -m benchmarks.sass_calibration --compile  # re-read the SASS (~6 min on 2 CPU cores)

The measured kernel times are qk_calibration.SETS' per-kernel splits (H200, BERT-Base batch 1,
docs/results/device_suite/), the estimator's inputs its committed inputs-*.json. `--compile`
compiles each measured program again for an H200 (qk_calibration.compile_old, the old commit
extracted) with `xla_dump_to` under /tmp, assembles every Triton kernel's PTX for sm_90a and
writes what its loops issue per score element (aot/sass.py) to sass.json beside those inputs.
The table re-times every kernel with work['issued'] from those records and fits ONE constant,
targets.ISSUE_EFFICIENCY (FUSED_KERNEL_EFFICIENCY and HOPPER_L2_FRACTION held frozen), to the
kernels with an element loop; its leave-one-out error is the fit redone without that row.
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

from benchmarks import qk_calibration as qk
from realformer_jax.aot import roofline, sass, targets
from realformer_jax.studies import runs as runs_lib

SASS_RECORDS = qk.OUT_DIR / 'sass.json'
RESULTS = qk.OUT_DIR / 'sass_results.md'
CACHE = pathlib.Path(tempfile.gettempdir()) / 'realformer_jax_sass_calibration'
GRID = [round(0.02 * i, 2) for i in range(10, 76)]  # 0.20 ... 1.50


def program_key(commit: str, length: int, variant: str) -> str:
  return f'{commit[:7]}-{variant}-{length}'


def measured_programs() -> list[tuple[str, int, str]]:
  """(commit, L, variant) of every program with a per-kernel split."""
  return [(c, n, v) for c, s in qk.SETS.items() for (n, v) in s['kernels']]


def read_sass(commit: str, length: int, variant: str, tree: str) -> dict:
  """{kernel: sass.KernelCost.record()} of one measured program, compiled with its dump."""
  dump = CACHE / program_key(commit, length, variant)
  if not any(dump.glob('*.ptx')) if dump.exists() else True:
    dump.mkdir(parents=True, exist_ok=True)
    os.environ['XLA_FLAGS'] = f'--xla_dump_to={dump}'  # compile_in_tree's subprocess inherits it
    try:
      qk.compile_old(commit, variant, tree, str(dump / 'program.hlo'), length)
    finally:
      os.environ.pop('XLA_FLAGS')
  names = tuple(n for n in qk.SETS[commit]['kernels'][(length, variant)] if n != qk.DS_GEMMS)
  costs = sass.from_dump(str(dump), names)
  return {name: costs[name].record() for name in names if name in costs}


def compile_all() -> dict:
  records = {}
  with tempfile.TemporaryDirectory() as scratch:
    for commit, length, variant in measured_programs():
      tree = os.path.join(scratch, commit[:7])
      if not os.path.exists(tree):
        qk.extract(commit, tree)
      print(f'reading the SASS of {variant} at {commit[:7]}, L = {length:,} ...', flush=True)
      records[program_key(commit, length, variant)] = read_sass(commit, length, variant, tree)
  runs_lib.write_json(str(SASS_RECORDS), records)
  return records


def with_issued(work: dict, record: dict | None, name: str) -> dict:
  """A kernel's committed work with what its SASS issues per call (aot/sass.py)."""
  if not record or not work.get('fused'):
    return work
  issued = sass.KernelCost.from_record(name, record).issued(work)
  return {**work, 'issued': issued} if issued else work


def rows(inputs: dict, records: dict) -> list[dict]:
  """Every measured fused kernel: its works (with 'issued' where its SASS was read)."""
  out = []
  for commit, length, variant in measured_programs():
    program = inputs[(commit, length, variant)]['kernels']
    read = records.get(program_key(commit, length, variant), {})
    for name, seconds in qk.SETS[commit]['kernels'][(length, variant)].items():
      if name == qk.DS_GEMMS:
        continue
      works = [
        (k['work'], k['count'])
        for k in program
        if qk._kernel_name(k['op_name'], k['category']) == name
      ]
      record = read.get(name)
      out.append(
        {
          'key': (commit[:7], length, variant, name),
          'measured': seconds,
          'before': works,
          'after': [(with_issued(w, record, name), n) for w, n in works],
          'per_element': record['total_per_element'] if record else None,
          'issued': any(
            w.get('issued') for w, _ in [(with_issued(w, record, name), n) for w, n in works]
          ),
        }
      )
  return out


def seconds(works: list, chip: targets.Chip) -> float:
  return sum(roofline.kernel_seconds(w, chip)[0] * n for w, n in works)


def fit(table: list[dict], chip: targets.Chip, leave_out=None) -> float:
  """ISSUE_EFFICIENCY by least squares in log space over the rows whose SASS has an element
  loop (all but `leave_out`)."""

  def loss(efficiency: float) -> float:
    rates = dataclasses.replace(chip, issue_efficiency=efficiency)
    return sum(
      math.log(seconds(r['after'], rates) / r['measured']) ** 2
      for r in table
      if r['issued'] and r['key'] != leave_out
    )

  return min(GRID, key=loss)


def calibrate(inputs: dict, records: dict, chip: targets.Chip) -> dict:
  """The fitted efficiency and, per row: measured, the FLOP / L2 estimate, the estimate with
  the instruction term (fitted to all rows) and its leave-one-out error."""
  table = rows(inputs, records)
  fitted = fit(table, chip)
  rates = dataclasses.replace(chip, issue_efficiency=fitted)
  out = []
  for r in table:
    loo = fit(table, chip, r['key']) if r['issued'] else fitted
    out.append(
      {
        'key': list(r['key']),
        'measured': r['measured'],
        'per_element': r['per_element'],
        'before': seconds(r['before'], chip),
        'after': seconds(r['after'], rates),
        'loo_efficiency': loo,
        'loo': seconds(r['after'], dataclasses.replace(chip, issue_efficiency=loo)),
        'fitted_on': r['issued'],
      }
    )
  return {'issue_efficiency': fitted, 'rows': out}


def render(result: dict) -> str:
  lines = [
    '| kernel | commit, L, variant | SASS instr / element | measured s | FLOP / L2 model | '
    'with instructions | leave-one-out |',
    '|---|---|---:|---:|---:|---:|---:|',
  ]
  for r in result['rows']:
    commit, length, variant, name = r['key']
    err = lambda x: f'{x:.3f} ({x / r["measured"] - 1:+.0%})'
    per = f'{r["per_element"]:.1f}' if r['per_element'] is not None else '-'
    loo = err(r['loo']) + (f' at {r["loo_efficiency"]}' if r['fitted_on'] else ' (not fitted)')
    lines.append(
      f'| `{name}` | {commit} {length:,} {variant} | {per} | {r["measured"]:.3f} | '
      f'{err(r["before"])} | {err(r["after"])} | {loo} |'
    )
  return '\n'.join(lines) + '\n'


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--compile', action='store_true', help='re-read the SASS (compiles)')
  args = parser.parse_args(argv)
  records = compile_all() if args.compile else json.loads(SASS_RECORDS.read_text())
  chip = targets.parse(qk.TARGET).chip
  result = calibrate(qk.load_inputs(), records, chip)
  text = f'ISSUE_EFFICIENCY fitted: {result["issue_efficiency"]}\n\n' + render(result)
  RESULTS.write_text(text)
  print(text)
  return result


if __name__ == '__main__':
  main(sys.argv[1:])

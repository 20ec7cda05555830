"""The next device run, predicted before it runs, and its error reported after.

    python -m benchmarks.device_predictions                       # -> predictions-<date>.json/.md
    python -m benchmarks.device_predictions --report=DIR/results.json   # after the run: errors
    python -m benchmarks.device_predictions --parts=steps --update --target=h100:1
        # re-predict some rows (or another GPU's) into the latest file, the change noted there

Before a device run: compiles, on this CPU host for the target's GPU (JAX_PLATFORMS=cpu, no
device; ~15 min on 2 cores), every program `python -m benchmarks.device_suite` will time (its
FULL size: the 32 x 512 step table's Post-LN / RealFormer / Pre-LN / Hugging Face at BERT-Large,
bf16; the long rows, BERT-Base batch 1 bf16 remat full dropout 0.1: Post-LN at 65,536 with its
masks stored and drawn, RealFormer qk on the Triton kernels at 65,536 and 131,072), and writes each
row's ESTIMATED step (realformer_jax/aot/roofline.py with its constants FROZEN: the file records
them; each fused kernel charged what its SASS for sm_90a issues, read from the same compile's
PTX by aot/sass.py, where ptxas and cuobjdump are at hand: the `aot` extra), its MFU against
the one stated peak (aot/targets.mfu_peak_flops), the targets it predicts PASS / MISS
(benchmarks/device_targets.py) and the suite's parts in order with their planned seconds
(device_suite.BUDGET), to docs/results/device_suite/predictions-<date>.json and .md. Commit
the file BEFORE the run: no measured row was used to make it.

After the run: `--report=DIR/results.json` (the suite's) sets each measured row beside its
prediction (error = estimate / measured - 1), writes DIR/errors.md and prints it. A row the
suite measured that the file did not predict, or the reverse, is listed, not dropped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO, 'docs', 'results', 'device_suite')
TOP_KERNELS = 10  # per row: the costliest kernels, each with its estimated milliseconds
EXTRA_LONG = ((131072, 'realformer qk'),)  # issue 57's target row, where the size lists none


def _step_rows(size) -> list[tuple]:
  return [('steps', shape, model) for shape in size.step_shapes for model in STEP_MODELS]


STEP_MODELS = ('post', 'realformer', 'pre', 'hf')


def _long_rows(size) -> list[tuple]:
  if size.long_rows:  # the suite's own rows, in its order
    return [('long', length, variant) for length, variant in size.long_rows]
  rows = [('long', length, variant) for length in size.lengths for variant in size.long_variants]
  return rows + [('long', length, variant) for length, variant in EXTRA_LONG]


def _new_ptx(dump: str, seen: set, row_dir: str) -> str:
  """The PTX files XLA dumped into `dump` since `seen` (one row's compile), copied to
  `row_dir`: a kernel's name is the same in every row, its code is not."""
  import shutil  # pylint: disable=import-outside-toplevel

  os.makedirs(row_dir, exist_ok=True)
  for name in sorted(set(os.listdir(dump)) - seen):
    if name.endswith('.ptx'):
      shutil.copy(os.path.join(dump, name), row_dir)
  seen.update(os.listdir(dump))
  return row_dir


def predict_row(row: tuple, target, devices, dump: str = '') -> dict:
  """One row's ESTIMATE: the program the suite runs, compiled for `target`'s devices; with
  `dump` (XLA's xla_dump_to) its fused kernels charged what their SASS issues."""
  from benchmarks import flops as flops_lib  # pylint: disable=import-outside-toplevel
  from benchmarks import profiles  # pylint: disable=import-outside-toplevel
  from realformer_jax.aot import roofline, targets  # pylint: disable=import-outside-toplevel
  from realformer_jax.bench import steps  # pylint: disable=import-outside-toplevel
  from realformer_jax.train import build, pretraining  # pylint: disable=import-outside-toplevel

  part, key, which = row
  seen = set(os.listdir(dump)) if dump else set()
  start = time.perf_counter()
  if part == 'steps':
    shape = profiles.SHAPES[key]
    profile = profiles.PROFILES['accelerator']
    if which == 'hf':
      compiled = steps.compile_hf_step(shape, devices, dropout=0.1, dtype=profile.dtype)
    else:
      config = steps.train_config(
        shape, ln_placement=which, dropout=0.1, dtype=profile.dtype, scan_unroll=profile.scan_unroll
      )
      spec = pretraining.validate_config(config, device_count=1, process_count=1)
      setup = build.make_setup(spec, devices)
      compiled = build.compile_train_step(setup)
  else:
    from benchmarks import device_suite  # pylint: disable=import-outside-toplevel

    shape = device_suite._long_shape(device_suite.FULL, key)  # pylint: disable=protected-access
    overrides = device_suite.long_variant(which, triton=True)
    config = steps.train_config(
      shape, dropout=0.1, dtype='bfloat16', remat_policy='full', scan_unroll=1, **overrides
    )
    spec = pretraining.validate_config(config, device_count=1, process_count=1)
    setup = build.make_setup(spec, devices)
    compiled = build.compile_train_step(setup)
  compile_s = time.perf_counter() - start
  kernel_sass = None
  # Only the Pallas kernels that state their cost are read (XLA's own fusions' PTX is not
  # always one this ptxas takes: Hugging Face's step's was not).
  stated = tuple(
    sorted(set(re.findall(r'name = "(\w+)"[^\n]*?serialized_metadata', compiled.as_text())))
  )
  if dump and stated:
    from realformer_jax.aot import sass  # pylint: disable=import-outside-toplevel

    row_dir = _new_ptx(dump, seen, os.path.join(dump, f'{part}-{key}-{which}'))
    kernel_sass = sass.from_dump(row_dir, stated)
  est = roofline.estimate(
    compiled, target, score_dims=(shape.seq_len, shape.seq_len), kernel_sass=kernel_sass
  )
  result = {
    'part': part,
    'key': key,
    'model': which,
    'estimate_s': est.seconds,
    'memory_gib': build.step_memory_bytes(compiled) / 2**30,
    'compile_here_s': round(compile_s, 1),
    'by_category_s': est.by_category(),
    'warnings': list(est.warnings)[:5],
    'sass_kernels': sorted(kernel_sass or {}),  # charged what their SASS issues
    # the per-kernel split a miss is read from: the costliest ops (one kernel per unrolled
    # layer or one run a loop trip, grouped alike), each [name, category, what bounds it,
    # launches, ms a step]
    'top_kernels_ms': [
      [g.name, g.first.category, g.first.bound, g.count, round(g.total_seconds * 1e3, 3)]
      for g in est.top_ops(TOP_KERNELS)
    ],
  }
  if which != 'hf':  # layers per scan iteration as compiled (model/layer_unroll.py)
    from realformer_jax.model import layer_unroll  # pylint: disable=import-outside-toplevel

    result['scan_unroll'] = layer_unroll.layers_per_iteration(setup.model_config)
  if part == 'steps':
    result['mfu'] = flops_lib.model_flops(shape) / est.seconds / targets.mfu_peak_flops(target.chip)
  return result


def frozen_constants(chip) -> dict:
  from realformer_jax.aot import hash_work, targets  # pylint: disable=import-outside-toplevel

  counts = hash_work.per_decision()
  return {
    'FUSED_KERNEL_EFFICIENCY': targets.FUSED_KERNEL_EFFICIENCY,
    'ISSUE_EFFICIENCY': targets.ISSUE_EFFICIENCY,
    'HOPPER_L2_FRACTION': targets.HOPPER_L2_FRACTION,
    'hash_int_ops_per_decision': {'written': counts.written, 'compiled': counts.compiled},
    'mfu_peak_flops': targets.mfu_peak_flops(chip),
    'bf16_roofline_flops': chip.roofline_matmul_flops['bf16'],
  }


def suite_plan(rows: list[dict]) -> list[dict]:
  """The default device run, part by part in order, with the seconds planned for each: the
  suite's budget (device_suite.BUDGET), the long part per row as its compile plus its warm-up
  and timed steps at the predicted step time."""
  from benchmarks import device_suite  # pylint: disable=import-outside-toplevel

  size = device_suite.FULL
  default_long = set(size.long_rows)
  long_s = sum(
    size.long_compile_s + r['estimate_s'] * (1 + size.long_steps)
    for r in rows
    if r['part'] == 'long' and (r['key'], r['model']) in default_long
  )
  planned = {part: device_suite.expected_s(part, size) for part in device_suite.DEFAULT_PARTS}
  planned['long'] = long_s
  return [{'part': part, 'planned_s': planned[part]} for part in device_suite.DEFAULT_PARTS]


def _target_figures(rows: list[dict]) -> dict:
  from benchmarks import device_targets  # pylint: disable=import-outside-toplevel

  figures = {}
  for shape in {r['key'] for r in rows if r['part'] == 'steps'}:
    own = {r['model']: r for r in rows if r['part'] == 'steps' and r['key'] == shape}
    figures.update(
      device_targets.step_figures(
        shape, {m: r['estimate_s'] for m, r in own.items()}, {m: r['mfu'] for m, r in own.items()}
      )
    )
  long = [
    {'length': r['key'], 'variant': r['model'], 'step_s': r['estimate_s']}
    for r in rows
    if r['part'] == 'long'
  ]
  return {**figures, **device_targets.long_figures(long)}


def _commit() -> str:
  try:
    return subprocess.run(
      ['git', 'rev-parse', 'HEAD'], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'


def _row_key(row: dict) -> tuple:
  return row['part'], row['key'], row['model']


def _shown(step: float) -> str:
  return f'{step * 1e3:.1f} ms' if step < 1 else f'{step:.2f} s'


def _model_cell(row: dict) -> str:
  unroll = row.get('scan_unroll', 1)
  return row['model'] + (f' (scan unrolled x{unroll})' if unroll > 1 else '')


def update(base: dict, target_spec: str, rows: list[dict], date: str, commit: str) -> dict:
  """`base` (a predictions file, not yet run) with `rows` re-predicted for `target_spec` at
  `commit`: rows of the file's own target replace theirs (its targets and plan re-derived),
  another target's stand beside them under 'other_targets'; each change is listed under
  'changes', old and new estimate, so that the file says what it predicted before."""
  if target_spec == base['target']:
    own = base
  else:
    own = base.setdefault('other_targets', {}).setdefault(target_spec, {'rows': []})
  old = {_row_key(r): r for r in own['rows']}
  new = {_row_key(r): r for r in rows}
  own['rows'] = [new.get(_row_key(r), r) for r in own['rows']]
  own['rows'] += [r for r in rows if _row_key(r) not in old]
  own['targets'] = _target_figures(own['rows'])
  if own is base:
    base['plan'] = suite_plan(base['rows'])
  what = ', '.join(
    f'{r["key"]} {_model_cell(r)} '
    + (f'{_shown(old[_row_key(r)]["estimate_s"])} -> ' if _row_key(r) in old else '(new) ')
    + _shown(r['estimate_s'])
    for r in rows
  )
  base.setdefault('changes', []).append(f'{date}, commit `{commit[:7]}`, {target_spec}: {what}')
  return base


def render(p: dict) -> str:
  from benchmarks import device_targets  # pylint: disable=import-outside-toplevel

  c = p['constants']
  lines = [
    f'# Predictions for the next device run ({p["date"]}, commit `{p["commit"][:7]}`)',
    '',
    f'ESTIMATED, not measured: each program `python -m benchmarks.device_suite` will time, '
    f'compiled on a CPU host for one {p["target"]} (no device) and read by the kernel roofline '
    f'with its constants frozen (FUSED_KERNEL_EFFICIENCY {c["FUSED_KERNEL_EFFICIENCY"]}, '
    f'HOPPER_L2_FRACTION {c["HOPPER_L2_FRACTION"]}, ISSUE_EFFICIENCY '
    f'{c.get("ISSUE_EFFICIENCY")}; the dropout hash charged at '
    f'{c["hash_int_ops_per_decision"]["compiled"]:.1f} integer ops per decision as compiled; '
    f'the fused kernels of {sum(bool(r.get("sass_kernels")) for r in p["rows"])} of '
    f'{len(p["rows"])} rows charged what their SASS for sm_90a issues, aot/sass.py). '
    f'MFU: model FLOPs / estimated step / {c["mfu_peak_flops"] / 1e12:.1f} TFLOP/s (the '
    'datasheet dense bf16 peak, the one every MFU figure uses). Committed before the run; '
    '`python -m benchmarks.device_predictions --report=DIR/results.json` sets the '
    'measurements beside it.',
    '',
  ]
  if p.get('changes'):
    lines += ['Re-predicted since (no device run in between), old -> new ESTIMATE:', '']
    lines += [f'- {change}' for change in p['changes']]
    lines.append('')
  lines += _rows_table(p['rows'])
  for r in p['rows']:
    for warning in r['warnings']:
      lines += ['', f'{r["key"]} {r["model"]}, what the roofline cannot judge: {warning}']
  lines += ['', "Issues 57's and 64's targets, by these estimates:", '']
  lines += [f'- {line}' for line in device_targets.lines(p['targets'], 'ESTIMATED')]
  for target, other in p.get('other_targets', {}).items():
    lines += ['', f'Also ESTIMATED for one {target} (the same programs compiled for it):', '']
    lines += _rows_table(other['rows'])
    lines += [''] + [f'- {line}' for line in device_targets.lines(other['targets'], 'ESTIMATED')]
  lines += [
    '',
    'The run: `python -m benchmarks.device_suite --out=DIR` (default budget '
    f'{p["budget_s"]:.0f} s), its parts in this order, each with the seconds the suite plans '
    'for it (benchmarks/device_suite.py BUDGET: compile times measured on an H100 / H200, '
    'each with its source there):',
    '',
  ]
  lines += [f'{i + 1}. `{s["part"]}`: ~{s["planned_s"]:.0f} s' for i, s in enumerate(p['plan'])]
  total = sum(s['planned_s'] for s in p['plan'])
  lines += [
    '',
    f'Planned in all: ~{total:.0f} s against the {p["budget_s"]:.0f} s budget; a part that '
    'would not fit what is left is skipped with the reason. The device check is its own call, '
    f'`--parts=device` (~{p.get("device_s", 200.0):.0f} s planned; what it finishes is kept: '
    'INCOMPLETE, not FAIL).',
  ]
  return '\n'.join(lines) + '\n'


def _rows_table(rows: list[dict]) -> list[str]:
  lines = [
    '| part | shape / L | model | ESTIMATED step | ESTIMATED MFU | XLA memory (GiB) |',
    '|---|---|---|---:|---:|---:|',
  ]
  for r in rows:
    mfu = f'{r["mfu"]:.3f}' if 'mfu' in r else ''
    key = f'{r["key"]:,}' if isinstance(r['key'], int) else r['key']
    lines.append(
      f'| {r["part"]} | {key} | {_model_cell(r)} | {_shown(r["estimate_s"])} | {mfu} | '
      f'{r["memory_gib"]:.1f} |'
    )
  return lines


def _sass_tools() -> bool:
  from realformer_jax.aot import sass  # pylint: disable=import-outside-toplevel

  try:
    sass.tool('ptxas'), sass.tool('cuobjdump')
  except FileNotFoundError:
    return False
  return True


PARTS = ('steps', 'long')


def predict_rows(target_spec: str, parts: tuple = PARTS) -> list[dict]:
  """Every row of `parts` the suite times, ESTIMATED for `target_spec` (compiled here)."""
  import tempfile  # pylint: disable=import-outside-toplevel

  os.environ['JAX_PLATFORMS'] = 'cpu'  # before jax starts: compile for the target, open nothing
  scratch = tempfile.TemporaryDirectory()
  dump = scratch.name if _sass_tools() else ''
  if dump:  # read once, when jax starts: every row's kernels' PTX lands there
    os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} --xla_dump_to={dump}'.strip()
  from benchmarks import device_suite  # pylint: disable=import-outside-toplevel
  from realformer_jax.aot import targets  # pylint: disable=import-outside-toplevel

  target = targets.parse(target_spec)
  devices = target.devices()[:1]
  plan_rows = {'steps': _step_rows, 'long': _long_rows}
  rows = []
  with scratch:
    for row in [row for part in parts for row in plan_rows[part](device_suite.FULL)]:
      print(f'compiling {row} for {target_spec} ...', flush=True)
      rows.append(predict_row(row, target, devices, dump))
      print(f'  ESTIMATED {rows[-1]["estimate_s"]:.4f} s', flush=True)
  return rows


def write(prediction: dict, out_dir: str) -> None:
  os.makedirs(out_dir, exist_ok=True)
  stem = os.path.join(out_dir, f'predictions-{prediction["date"]}')
  with open(stem + '.json', 'w') as f:
    json.dump(prediction, f, indent=1)
  with open(stem + '.md', 'w') as f:
    f.write(render(prediction))


def predict(target_spec: str, out_dir: str, date: str) -> dict:
  from benchmarks import device_suite  # pylint: disable=import-outside-toplevel
  from realformer_jax.aot import targets  # pylint: disable=import-outside-toplevel

  rows = predict_rows(target_spec)
  target = targets.parse(target_spec)
  prediction = {
    'date': date,
    'commit': _commit(),
    'target': target_spec,
    'constants': frozen_constants(target.chip),
    'rows': rows,
    'targets': _target_figures(rows),
    'plan': suite_plan(rows),
    'budget_s': device_suite.DEFAULT_BUDGET_S,
    'device_s': device_suite.FULL.device_s,
  }
  write(prediction, out_dir)
  return prediction


def measured_rows(results: dict) -> dict:
  """{(part, key, model): measured seconds} of a device suite's results.json."""
  out = {}
  for shape, s in results['parts'].get('steps', {}).get('shapes', {}).items():
    for model, seconds in s.get('step_s', {}).items():
      out[('steps', shape, model)] = seconds
  for row in results['parts'].get('long', {}).get('rows', []):
    if row.get('step_s') is not None and not (row.get('qk_ds_tile') or row.get('post_bwd_tile')):
      out[('long', row['length'], row['variant'])] = row['step_s']
  return out


def report(results_path: str, prediction_path: str) -> str:
  with open(results_path) as f:
    results = json.load(f)
  with open(prediction_path) as f:
    prediction = json.load(f)
  predicted = {(r['part'], r['key'], r['model']): r['estimate_s'] for r in prediction['rows']}
  measured = measured_rows(results)
  lines = [
    f'# The device run of {results["date"]} beside the predictions of {prediction["date"]}',
    '',
    f'Predictions: `{os.path.relpath(prediction_path, REPO)}` (commit '
    f'`{prediction["commit"][:7]}`, made before the run, constants frozen). error = ESTIMATED '
    '/ MEASURED - 1.',
    '',
    '| part | shape / L | model | MEASURED | ESTIMATED | error |',
    '|---|---|---|---:|---:|---:|',
  ]
  for key in [k for k in predicted if k in measured] + [k for k in measured if k not in predicted]:
    got, want = measured.get(key), predicted.get(key)
    error = f'{want / got - 1:+.0%}' if got and want else 'not predicted'
    lines.append(
      f'| {key[0]} | {key[1]} | {key[2]} | {got:.4g} s | '
      + (f'{want:.4g} s' if want else '')
      + f' | {error} |'
    )
  missing = [k for k in predicted if k not in measured]
  if missing:
    lines += ['', 'Predicted, not measured in this run: ' + ', '.join(map(str, missing)) + '.']
  return '\n'.join(lines) + '\n'


def latest_prediction(out_dir: str = OUT_DIR) -> str:
  names = sorted(
    n for n in os.listdir(out_dir) if n.startswith('predictions-') and n.endswith('.json')
  )
  if not names:
    raise FileNotFoundError(f'no predictions-*.json in {out_dir}')
  return os.path.join(out_dir, names[-1])


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--target', default='h200:1', help='the GPU of the next run (aot/targets.py)')
  parser.add_argument('--out', default=OUT_DIR, help='where predictions-<date>.json/.md go')
  parser.add_argument('--date', default=datetime.date.today().isoformat())
  parser.add_argument('--report', default='', help="a device run's results.json: its errors")
  parser.add_argument('--predictions', default='', help='the file to compare (default: latest)')
  parser.add_argument('--parts', default=','.join(PARTS), help='rows to predict: steps,long')
  parser.add_argument(
    '--update', action='store_true', help='re-predict into the latest file (or --predictions)'
  )
  args = parser.parse_args(argv)
  parts = tuple(p for p in args.parts.split(',') if p)
  if not parts or set(parts) - set(PARTS):
    print(f'error: --parts={args.parts}: must name some of {",".join(PARTS)}')
    sys.exit(2)
  if args.report:
    if not os.path.exists(args.report):
      print(f'error: --report={args.report}: no such file')
      sys.exit(2)
    text = report(args.report, args.predictions or latest_prediction(args.out))
    with open(os.path.join(os.path.dirname(args.report), 'errors.md'), 'w') as f:
      f.write(text)
    print(text)
    return
  if args.update:
    path = args.predictions or latest_prediction(args.out)
    with open(path) as f:
      base = json.load(f)
    prediction = update(base, args.target, predict_rows(args.target, parts), args.date, _commit())
    write(prediction, os.path.dirname(path))
  elif parts != PARTS:
    print('error: --parts: a new predictions file has every part; re-predict some with --update')
    sys.exit(2)
  else:
    prediction = predict(args.target, args.out, args.date)
  print(render(prediction))


if __name__ == '__main__':
  main(sys.argv[1:])

"""Everything issues 57 and 64 ask a GPU to measure, in one command that fits a short lease.

    python -m benchmarks.device_suite --out=DIR              # one H100 / H200: planned <= 7 min
    python -m benchmarks.device_suite --out=DIR --dry_run    # the plan, each part's seconds
    python -m benchmarks.device_suite --out=DIR --parts=device   # the device check: its own call
    python -m benchmarks.device_suite --out=DIR --toy        # any backend, toy sizes (CI, CPU)
    python -m benchmarks.device_suite --out=DIR --parts=long,split --budget_s=300
    python -m benchmarks.device_suite --out=DIR --parts=long --lengths=131072,32768,16384
    python -m benchmarks.device_suite --out=DIR --parts=long --lengths=65536 \
        --qk_ds_tiles=64x128,128x128              # candidate qk dS tiles, timed side by side
    python -m benchmarks.device_suite --out=DIR --parts=long --lengths=65536 \
        --post_bwd_tiles=128x32x4x5,128x128x8x2   # candidate Post-LN backward tiles

Before a run, `python -m benchmarks.device_predictions` commits what it predicts (ESTIMATED, the
estimator's constants frozen); after it, `--report=DIR/results.json` sets the two side by side.

Parts, always in this order, each printed as it finishes and written at once to
DIR/results.json and DIR/results.md (a part killed by a timeout leaves the earlier ones). The
default call runs the first three within DEFAULT_BUDGET_S (PLAN: each part's planned seconds,
with sources; --dry_run prints it); the device check is its own call (--parts=device):
1. steps   the 32 x 512 step table, BERT-Large, bf16, post / realformer / pre / Hugging Face:
           the four programs compiled side by side, then interleaved rounds
           (benchmarks/measure.py), MEASURED, with MFU against the one stated peak
           (aot/targets.mfu_peak_flops: the datasheet's) and the targets PASS / MISS
           (benchmarks/device_targets.py) printed as the shape finishes; then one traced step
           of each of ours: device time per kernel (benchmarks/trace_breakdown.py);
2. long    the long-sequence table: BERT-Base, batch 1, bf16, full remat, dropout 0.1, learned
           positions (benchmarks.long_sequences's compiled step and timing): Post-LN at 65,536
           with its dropout masks stored and drawn (model.remat_dropout_masks), then 'qk' on
           the Triton kernels (attention_impl='pallas_triton': never a backend 'auto' might
           take) at 65,536 and 131,072 (--lengths: post and qk at other lengths, longest
           first, and the toy size's scores carry 'realformer recomputed'); a row whose
           compile fails (a kernel this jax cannot lower) says so and the suite goes on:
           XLA's memory, the first step and the step MEASURED (a warm-up, then the median of
           2) and the device peak where that row raised it (the allocator keeps one per
           process) beside the roofline's ESTIMATE of the very program that ran
           (realformer_jax/aot/roofline.py, the device's chip from targets.py); a row larger
           than the device says so; the targets it decides, PASS / MISS. With
           --qk_ds_tiles, 'qk' at the longest length again per candidate tile of its dS
           kernel (KEYSxROWS[xWARPSxSTAGES]: key rows a program owns x query rows per step,
           the row's warps and stages unless given; the Triton tile table's row otherwise:
           kernels/backends/triton/tiles.py), so one call decides it;
           with --post_bwd_tiles, post likewise per candidate tile of plain attention's
           backward (KEYSxROWS[xWARPSxSTAGES]: key rows a program owns x rows per step of its
           loops, 4 warps and 2 stages unless given). Each row also reports its last step's
           loss and gradient norm: every row of a variant starts from the same state, batch
           and dropout stream, so a candidate tile whose gradient norm differs from its
           variant's beyond bfloat16 rounding computes another backward (the loss checks
           the forward only: early in the warm-up the parameters barely move);
3. split   a profiler trace of one step of post and of 'qk' at the first length measured:
           device time per kernel (benchmarks/trace_breakdown.py), MEASURED;
4. device  (its own call) `python -m experiments.device_check --notable` in a subprocess: the
           environment,
           every attention kernel vs the einsum path (the Hopper kernels too, whose pass it
           records for 'auto'), 20 training steps kernels vs einsum; its cases print as they
           finish, so a check the budget stops keeps them (INCOMPLETE, not FAIL).
Compiles take minutes on a GPU, so every part (and every long row) first compares what it is
expected to cost (BUDGET, each figure with its source) with what is left of --budget_s, and is
skipped with the reason when it does not fit. Nothing here imports jax or an optional package
until a part runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

# In the order they run: the 32 x 512 step table first (it has never run on a device since
# the kernels changed, issue 57), the device check last (the longest, and its verdict is per
# case: a check stopped by the budget keeps the cases it printed). A call without --parts runs
# DEFAULT_PARTS: the device check is a call of its own (issue 64: one lease, one call each).
PARTS = ('steps', 'long', 'split', 'device')
DEFAULT_PARTS = ('steps', 'long', 'split')


@dataclasses.dataclass(frozen=True)
class Size:
  """How big each part is, and what it is expected to cost (seconds, on one H100)."""

  name: str
  device_args: tuple  # experiments.device_check flags
  device_s: float
  lengths: tuple
  hidden: int
  layers: int
  heads: int
  long_steps: int
  long_compile_s: float  # one long row's compile
  step_shapes: tuple  # benchmarks/profiles.py SHAPES names, in the order they run
  step_rounds: int
  step_shape_s: float  # one shape of the step table: 4 compiles side by side + its rounds
  long_variants: tuple = ('post', 'realformer recomputed', 'realformer qk')
  # The long part's (length, variant) rows in order; () : every length x long_variants.
  long_rows: tuple = ()
  # Planned seconds of one step of a long row by (variant, length) (PLAN); absent: 0.
  long_step_s: tuple = ()


# What each part is expected to cost on one H100 / H200: BUDGET, each figure with its source.
# The default call (DEFAULT_PARTS) is planned to <= 7 minutes (issue 64): budget_s's default.
BUDGET = {
  # The step table: its 4 programs compile side by side (XLA:GPU compiles in threads outside
  # the GIL; 16 host cores), so the shape costs about its slowest compile, Hugging Face's
  # BERT-Large at ~175 s (FACTS.md: an H100, 2026-11-22; ours ~165 s with the scan unrolled,
  # as scan_unroll='auto' takes it on a GPU, ~20-30 s rolled), then 3
  # interleaved rounds of four steps of < 0.3 s. NOT yet timed side by side on a device.
  'steps_compile_s': 175.0,
  'steps_rounds_s': 15.0,  # per shape: warm-up and 3 rounds of 4 steps, ~0.1-0.3 s each
  # One traced step of each of ours at 32 x 512 (< 0.3 s each) and the profiler's start and
  # parse: ~3 s a trace, as the split part's 18 s for two 65k steps of ~4 and ~9 s suggests.
  'steps_split_s': 10.0,
  # One long row's compile: a BERT-Base L = 65,536 step, ~15 s on an H200 (2026-11-26); 11-21 s
  # for the nine of 2026-11-27. 131,072: not compiled on a device yet, planned the same.
  'long_compile_s': 20.0,
  # One step of a long row (a warm-up and `long_steps` timed ones each), H200, 2026-11-27:
  # Post-LN 65,536 4.00 s (drawn; stored planned the same), qk 9.12 s; qk 131,072 never
  # timed: 4x 65,536's (the L^2 work), 36.5 s.
  'post_65536_step_s': 4.0,
  'qk_65536_step_s': 9.12,
  'qk_131072_step_s': 36.5,
  # The device check with --jobs=8: its 10 Triton cases took 300 s one at a time (2026-11-27,
  # nearly all compilation); side by side NOT yet timed; 4 Hopper cases added. Planned at
  # half the serial time; what it does not finish is INCOMPLETE, not FAIL (run_device).
  'device_s': 200.0,
  'split_s': 20.0,  # a traced step of post and of qk at 65,536: 18 s measured (2026-11-27)
}
FULL = Size(
  'full', ('--size=full', '--steps=20', '--jobs=8'), BUDGET['device_s'], (65536,), 768, 12, 12,
  1, BUDGET['long_compile_s'], ('bert_large_512',), 3,
  BUDGET['steps_compile_s'] + BUDGET['steps_rounds_s'] + BUDGET['steps_split_s'],
  ('post', 'realformer qk'),
  long_rows=((65536, 'post stored'), (65536, 'post drawn'), (65536, 'realformer qk'),
             (131072, 'realformer qk')),
  long_step_s=((('post stored', 65536), BUDGET['post_65536_step_s']),
               (('post drawn', 65536), BUDGET['post_65536_step_s']),
               (('realformer qk', 65536), BUDGET['qk_65536_step_s']),
               (('realformer qk', 131072), BUDGET['qk_131072_step_s'])),
)  # fmt: skip
DEFAULT_BUDGET_S = 420.0  # issue 64: the default call on one lease, <= 7 minutes
TOY = Size(
  'toy', ('--size=toy', '--steps=2', '--jobs=2'), 60.0, (64,), 32, 2, 2, 1, 5.0, ('tiny',), 1, 30.0,
)  # fmt: skip
SPLIT_VARIANTS = ('post', 'post stored', 'post drawn', 'realformer qk')
# The long part's variants: long_sequences.VARIANTS, Post-LN with its masks stored or drawn,
# and 'qk' on the Triton kernels whatever 'auto' would take.
TRITON = dict(attention_impl='pallas_triton')
LONG_VARIANTS = {
  'post stored': dict(ln_placement='post', remat_dropout_masks='stored'),
  'post drawn': dict(ln_placement='post', remat_dropout_masks='drawn'),
}


def long_variant(name: str, triton: bool) -> dict:
  """The model overrides of a long row's variant; with `triton` (a GPU run) qk's kernels are
  Triton's, forced."""
  from benchmarks import long_sequences  # pylint: disable=import-outside-toplevel

  overrides = LONG_VARIANTS.get(name) or long_sequences.VARIANTS[name]
  return {**overrides, **TRITON} if triton and name == 'realformer qk' else overrides


class Suite:
  """The parts, their budget and their results, written after every part."""

  def __init__(
    self,
    out_dir: str,
    size: Size,
    budget_s: float,
    log: Callable[[str], None],
    qk_ds_tiles: tuple = (),
    post_bwd_tiles: tuple = (),
  ):
    self.out_dir, self.size, self.budget_s, self.log = out_dir, size, budget_s, log
    # ((keys, rows, warps, stages), ...): parse_tiles
    self.qk_ds_tiles, self.post_bwd_tiles = qk_ds_tiles, post_bwd_tiles
    self.started = time.perf_counter()
    self.results: dict = {
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
      'size': size.name,
      'budget_s': budget_s,
      'parts': {},
    }
    self.kept: dict = {}  # the long part's compiled steps, traced by the split part

  def left_s(self) -> float:
    return self.budget_s - (time.perf_counter() - self.started)

  def fits(self, needs_s: float) -> bool:
    return needs_s <= self.left_s()

  def record(self, part: str, result: dict) -> None:
    result.setdefault('seconds', round(time.perf_counter() - self.started, 1))
    self.results['parts'][part] = result
    self.write()
    self.log(f'[{part}] done at {result["seconds"]:.0f} s of {self.budget_s:.0f} s')
    for line in render_part(part, result):
      self.log('  ' + line)

  def skip(self, part: str, needs_s: float) -> None:
    self.record(
      part,
      {'skipped': f'expected to need ~{needs_s:.0f} s, {max(self.left_s(), 0):.0f} s left of '
       f'--budget_s={self.budget_s:.0f}; run it alone with --parts={part}'},
    )  # fmt: skip

  def write(self) -> None:
    os.makedirs(self.out_dir, exist_ok=True)
    with open(os.path.join(self.out_dir, 'results.json'), 'w') as f:
      json.dump(self.results, f, indent=1, default=str)
    with open(os.path.join(self.out_dir, 'results.md'), 'w') as f:
      f.write(render(self.results))


# ---------------------------------------------------------------------------------------------
# Parts.


def run_device(suite: Suite, command: Optional[list] = None) -> dict:
  """experiments.device_check (or `command`) in a subprocess (its own exit status; a crash
  there is a FAIL here, not the end of the suite). Its lines are passed on as they come and
  kept, so a check stopped by the budget still reports the kernel cases it finished; it is
  INCOMPLETE (`passed` None) unless one of them failed. A check that crashed (killed by a
  signal) while compiling its cases side by side (--jobs) runs again one case at a time, if
  the budget allows: threads are what a crash there would first suspect."""
  path = os.path.join(suite.out_dir, 'device_check.json')
  if command is None:
    command = [sys.executable, '-m', 'experiments.device_check', '--notable', f'--out={path}']
    command += list(suite.size.device_args)
  result = _run_check(suite, command, path)
  side_by_side = any(a.startswith('--jobs=') and a != '--jobs=1' for a in command)
  if result.get('crashed') and side_by_side and suite.fits(suite.size.device_s):
    serial = [a for a in command if not a.startswith('--jobs=')] + ['--jobs=1']
    suite.log(f'  (the check crashed ({result["error"]}); again, one case at a time)')
    result = _run_check(suite, serial, path)
    result['retried_serially'] = True
  return result


def _run_check(suite: Suite, command: list, path: str) -> dict:
  lines: list[str] = []
  deadline = time.perf_counter() + max(suite.left_s(), 1.0)
  os.makedirs(suite.out_dir, exist_ok=True)
  stderr_path = os.path.join(suite.out_dir, 'device_check_stderr.txt')
  with (
    open(stderr_path, 'w') as stderr,
    subprocess.Popen(
      command, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1
    ) as process,
  ):
    timer = threading.Timer(max(deadline - time.perf_counter(), 0.0), process.kill)
    timer.start()
    try:
      for line in process.stdout:
        lines.append(line.rstrip())
        suite.log('  | ' + lines[-1])
    finally:
      timer.cancel()
    returncode = process.wait()
  result = {'passed': returncode == 0, 'summary': lines}
  if returncode < 0:  # killed by a signal: a crash, or the budget's kill below
    result['crashed'] = time.perf_counter() < deadline
  if time.perf_counter() >= deadline:
    result['error'] = f'device_check ran past the budget after {len(lines)} lines (kept above)'
    if not any(line.lstrip().startswith('FAIL') for line in lines):
      result['passed'] = None  # what it finished passed; the rest was not run
  elif returncode and (not lines or result.get('crashed')):
    with open(stderr_path) as f:
      last = (f.read().strip().splitlines() or ['no output'])[-1]
    result['error'] = f'device_check exited {returncode}: {last[:300]}'
  if os.path.exists(path):
    with open(path) as f:
      report = json.load(f)
    result['environment'] = report.get('environment')
  return result


def _chip(device_kind: str):
  from realformer_jax.aot import targets  # pylint: disable=import-outside-toplevel

  return targets.chip_of_device_kind(device_kind)


def _long_shape(size: Size, length: int):
  from realformer_jax.bench import steps  # pylint: disable=import-outside-toplevel

  return steps.Shape(
    f'L{length}', hidden=size.hidden, layers=size.layers, heads=size.heads, vocab=30522,
    seq_len=length, batch=1, predictions=max(1, round(0.15 * length)),
  )  # fmt: skip


def _long_plan(suite: Suite) -> list:
  """(length, variant, candidate tile or None) of every long row, in the order they run: each
  length longest first, and after the longest length's rows its candidate Post-LN backward
  tiles, then its candidate qk dS tiles."""
  plan = []
  if suite.size.long_rows:
    first = suite.size.long_rows[0][0]
    plan = [(length, variant, None) for length, variant in suite.size.long_rows]
    plan += [(first, 'post', tile) for tile in suite.post_bwd_tiles]
    return plan + [(first, 'realformer qk', tile) for tile in suite.qk_ds_tiles]
  for i, length in enumerate(suite.size.lengths):
    plan += [(length, variant, None) for variant in suite.size.long_variants]
    if i == 0:
      plan += [(length, 'post', tile) for tile in suite.post_bwd_tiles]
      plan += [(length, 'realformer qk', tile) for tile in suite.qk_ds_tiles]
  return plan


def _tiles_in_force(variant: str, tile):
  """A context tracing the kernels with a candidate tile (none: the table's row): post's
  backward (keys, rows, warps, stages), or qk's dS kernel (keys, rows)."""
  import contextlib  # pylint: disable=import-outside-toplevel

  if tile is None:
    return contextlib.nullcontext()
  from realformer_jax.kernels.backends.triton import tiles  # pylint: disable=import-outside-toplevel

  keys, rows, warps, stages = tile
  row = tiles.device_tiles()
  if variant == 'post':
    row = row._replace(bwd_keys=keys, bwd_rows=rows, bwd_warps=warps, bwd_stages=stages)
  else:
    row = row._replace(block_bwd=keys, ds_rows=rows, ds_warps=warps, ds_stages=stages)
  return tiles.override(row)


def tile_label(tile: tuple) -> str:
  """(64, 128, 0, 0) -> '64x128'; (128, 32, 4, 5) -> '128x32, 4 warps, 5 stages'."""
  label = f'{tile[0]}x{tile[1]}'
  return label + (f', {tile[2]} warps, {tile[3]} stages' if tile[2] else '')


def run_long(suite: Suite) -> dict:
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import long_sequences  # pylint: disable=import-outside-toplevel
  from realformer_jax.aot import roofline  # pylint: disable=import-outside-toplevel

  device = jax.devices()[0]
  chip = _chip(device.device_kind)
  limit = (device.memory_stats() or {}).get('bytes_limit')
  size, rows = suite.size, []
  peak_so_far = 0.0
  for length, variant, tile in _long_plan(suite):
    row = {'length': length, 'variant': variant}
    if tile is not None:
      row['post_bwd_tile' if variant == 'post' else 'qk_ds_tile'] = tile_label(tile)
    rows.append(row)
    if not suite.fits(size.long_compile_s):
      row['skipped'] = f'no time to compile (~{size.long_compile_s:.0f} s)'
      continue
    shape = _long_shape(size, length)
    try:
      with _tiles_in_force(variant, tile):
        compiled = long_sequences.compiled_step(
          shape, long_variant(variant, size.name == 'full'), 'bfloat16', abstract=False
        )
    except Exception as e:  # pylint: disable=broad-except  # a kernel this jax cannot lower
      row['skipped'] = f'compile failed: {type(e).__name__}: {str(e).strip()[:300]}'
      suite.log(f'  L={length} {_variant_label(row)}: {row["skipped"]}')
      continue
    row.update(long_sequences.memory_figures(compiled))
    if chip is not None:
      est = roofline.estimate(compiled.compiled.as_text(), chip, score_dims=(length, length))
      row['estimate_s'] = est.seconds
      row['estimate_chip'] = chip.name
      row['estimate_leaves_out'] = est.unstated  # kernels that state no L2 / atomics
    # 5 % under the allocator's limit: on the H200 a 101 GiB program (97 % of the limit, one
    # 99.7 GiB buffer) compiled and then ran out of memory (2026-11-26).
    if limit is not None and row['xla_peak_gb'] * 2**30 > 0.95 * limit:
      row['skipped'] = f'does not fit: XLA needs {row["xla_peak_gb"]:.1f} GiB'
      continue
    expected = row.get('estimate_s', 0.0) * (1 + size.long_steps) * 2  # the estimate may err
    if not suite.fits(expected):
      row['skipped'] = f'estimated ~{expected:.0f} s to time; not enough budget'
      continue
    try:
      row.update(long_sequences.time_steps(compiled, size.long_steps))
    except Exception as e:  # pylint: disable=broad-except  # out of memory at run time
      row['skipped'] = f'{type(e).__name__}: {str(e).strip()[:160]}'
      continue
    # The allocator keeps one peak per process: a row that did not raise it has no peak of
    # its own to report (on the H200 a 16k row showed the 32k row's 8.9 GiB, 2026-11-27).
    if row['device_peak_gb'] <= peak_so_far:
      row['device_peak_gb'] = float('nan')
    else:
      peak_so_far = row['device_peak_gb']
    if variant in SPLIT_VARIANTS and tile is None:  # one Post-LN (stored where it ran)
      key = 'post' if variant.startswith('post') else variant
      suite.kept.setdefault(key, (length, compiled))  # the first length, as timed first
    suite.log(
      f'  L={length} {_variant_label(row)}: {row["step_s"]:.3f} s measured'
      + (f', {row["estimate_s"]:.3f} s estimated' if 'estimate_s' in row else '')
    )
  from benchmarks import device_targets  # pylint: disable=import-outside-toplevel

  figures = device_targets.long_figures(rows)
  for line in device_targets.lines(figures):
    suite.log('  ' + line)
  return {
    'targets': figures,
    'device_kind': device.device_kind,
    'estimate_chip': chip.name if chip else None,
    'settings': f'hidden {size.hidden}, {size.layers} layers, {size.heads} heads, batch 1, '
    'bfloat16, remat full, dropout 0.1, learned positions, rolled scan; a warm-up then the '
    f'median of {size.long_steps} steps',
    'rows': rows,
  }


def _kernel_split(compiled: dict) -> dict:
  """{name: {'device_s': one traced step's device time, 'kernels_s': its 8 largest kernels}}
  of compiled steps (benchmarks/trace_breakdown.py), MEASURED."""
  import tempfile  # pylint: disable=import-outside-toplevel

  from benchmarks import measure, trace_breakdown  # pylint: disable=import-outside-toplevel

  split = {}
  for name, step in compiled.items():
    with tempfile.TemporaryDirectory() as scratch:
      kernels = trace_breakdown.device_time_by_kernel(measure.trace_file(step, 1, scratch))
    split[name] = {'device_s': sum(kernels.values()), 'kernels_s': dict(list(kernels.items())[:8])}
  return split


def run_split(suite: Suite) -> dict:
  if not suite.kept:
    return {'skipped': 'no long-sequence step was timed, so none to trace'}
  split = _kernel_split({variant: compiled for variant, (_, compiled) in suite.kept.items()})
  for variant, (length, _) in suite.kept.items():
    split[variant]['length'] = length
  suite.kept.clear()  # their states: device memory
  return {'variants': split}


def run_steps(suite: Suite) -> dict:
  """The 32 x 512 step table: every candidate of every shape compiled side by side (threads:
  XLA compiles outside the GIL), then each shape in turn timed in interleaved rounds
  (benchmarks/measure.py), its rows and the targets they decide printed as it finishes."""
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  import importlib.util  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import device_targets, measure, profiles  # pylint: disable=import-outside-toplevel
  from benchmarks import flops as flops_lib  # pylint: disable=import-outside-toplevel
  from benchmarks.report import Report  # pylint: disable=import-outside-toplevel
  from benchmarks.timing import MatmulPeak  # pylint: disable=import-outside-toplevel
  from realformer_jax.aot import targets  # pylint: disable=import-outside-toplevel

  if importlib.util.find_spec('transformers') is None:
    return {'skipped': 'transformers is not installed (the Hugging Face column)'}
  suite.kept.clear()
  size = suite.size
  profile = dataclasses.replace(
    profiles.PROFILES['accelerator'], rounds=size.step_rounds, warmup=1, trace_steps=0
  )
  if size.name == 'toy':
    profile = dataclasses.replace(profile, peak_n=256)
  kind = jax.devices()[0].device_kind
  chip = targets.chip_of_device_kind(kind)
  peak_flops = targets.mfu_peak_flops(chip) if chip else None
  names = ('post', 'realformer', 'pre', 'hf')
  shapes = {}
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(len(size.step_shapes) * len(names)) as pool:
    futures = {
      (shape, name): pool.submit(
        measure.compile_candidate, profiles.SHAPES[shape], name, profile, 0.1
      )
      for shape in size.step_shapes
      for name in names
    }
    compiled = {key: future.result() for key, future in futures.items()}
  suite.log(f'  compiled {len(compiled)} steps side by side in {time.perf_counter() - start:.0f} s')
  figures = {}
  for name in size.step_shapes:
    shape = profiles.SHAPES[name]
    own = {n: compiled.pop((name, n)) for n in names}
    compile_s = {n: round(c.lower_s + c.compile_s, 1) for n, c in own.items()}
    result = measure.measure_train_steps(
      Report(lambda _: None), shape, profile, 0.1, MatmulPeak(profile.peak_n, profile.dtype),
      suite.log, precompiled=own,
    )  # fmt: skip
    kernels_s = _kernel_split({n: c for n, c in own.items() if n != 'hf'})
    del own
    medians = {k: sorted(v)[len(v) // 2] for k, v in result['times'].items() if v}
    model_flops = flops_lib.model_flops(shape)
    mfu = {k: model_flops / v / peak_flops for k, v in medians.items()} if peak_flops else {}
    shapes[name] = {
      'shape': f'{shape.batch} x {shape.seq_len}, hidden {shape.hidden}, {shape.layers} layers',
      'step_s': medians,
      'tokens_per_s': {k: shape.tokens / v for k, v in medians.items()},
      'mfu': mfu,
      'compile_s': compile_s,  # each side by side with the others
      'kernels_s': kernels_s,  # ours: one traced step's device time per kernel
    }
    for model, seconds in medians.items():
      suite.log(
        f'  {name} {model}: {seconds * 1e3:.1f} ms, {shape.tokens / seconds:,.0f} tokens/s'
        + (f', MFU {mfu[model]:.3f}' if model in mfu else '')
      )
    figures.update(device_targets.step_figures(name, medians, mfu))
    for line in device_targets.lines(figures):
      suite.log('  ' + line)
  return {
    'settings': f"bfloat16 compute, dropout 0.1, layer scan as model.scan_unroll='auto' runs "
    f'it (unrolled at this size on a GPU), {size.step_rounds} '
    'interleaved rounds after a warm-up, median (benchmarks/measure.py); MFU: model FLOPs '
    '(benchmarks/flops.py) / step / the datasheet bf16 peak (aot/targets.mfu_peak_flops'
    + (f': {peak_flops / 1e12:.1f} TFLOP/s, {chip.name})' if peak_flops else ': no chip known)'),
    'shapes': shapes,
    'targets': figures,
  }


RUNNERS = {'device': run_device, 'long': run_long, 'split': run_split, 'steps': run_steps}


def expected_s(part: str, size: Size) -> float:
  """What a part is expected to cost before it starts (the long rows budget themselves)."""
  return {
    'device': size.device_s,
    'long': size.long_compile_s,
    'split': 10.0 if size.name == 'toy' else BUDGET['split_s'],
    'steps': size.step_shape_s * len(size.step_shapes),
  }[part]


def plan(suite: Suite, parts: list) -> list[tuple[str, float]]:
  """(what, planned seconds) of each part in order, each long row on its own: its compile, a
  warm-up and `long_steps` timed steps of the planned step time (BUDGET)."""
  size, planned = suite.size, []
  step_s = dict(size.long_step_s)
  for part in parts:
    if part != 'long':
      planned.append((part, expected_s(part, size)))
      continue
    for length, variant, tile in _long_plan(suite):
      label = f'long L={length} {variant}' + (f' (tile {tile_label(tile)})' if tile else '')
      seconds = size.long_compile_s + (1 + size.long_steps) * step_s.get((variant, length), 0.0)
      planned.append((label, seconds))
  return planned


# ---------------------------------------------------------------------------------------------
# Rendering: every figure says whether it was measured or estimated.


def _f(value: Optional[float], digits: int = 3) -> str:
  if value is None or value != value:  # absent, or NaN: a CPU reports no device peak
    return ''
  return f'{value:.{digits}g}'


def _variant_label(row: dict) -> str:
  if row.get('qk_ds_tile'):
    return f'{row["variant"]} (dS tile {row["qk_ds_tile"]}: keys x rows)'
  if row.get('post_bwd_tile'):
    return f'{row["variant"]} (backward tile {row["post_bwd_tile"]}: keys x rows)'
  return row['variant']


def render_part(part: str, r: dict) -> list[str]:
  if 'skipped' in r:
    return [f'skipped: {r["skipped"]}']
  if 'error' in r and part != 'device':
    return [f'error: {r["error"]}']
  if part == 'device':
    verdict = {True: 'PASS', None: 'INCOMPLETE'}.get(r.get('passed'), 'FAIL')
    return (
      [f'device check: {verdict}']
      + r.get('summary', [])[-12:]
      + ([f'error: {r["error"]}'] if r.get('error') else [])
    )
  if part == 'long':
    lines = [
      f'{r["device_kind"]}; {r["settings"]}. Estimate: the roofline of the program that ran, '
      f'at {r["estimate_chip"] or "no chip (no estimate)"} rates.',
      '',
      '| L | variant | XLA memory (GiB) | step (s), MEASURED | first step (s), MEASURED | '
      "step (s), ESTIMATED | device peak (GiB), MEASURED | last step's loss | its gradient "
      'norm | note |',
      '|---:|---|---:|---:|---:|---:|---:|---:|---:|---|',
    ]
    left_out = {}
    for row in r['rows']:
      left_out.update(row.get('estimate_leaves_out') or {})
      lines.append(
        f'| {row["length"]:,} | {_variant_label(row)} | {_f(row.get("xla_peak_gb"))} | '
        f'{_f(row.get("step_s"))} | {_f(row.get("first_step_s"))} | {_f(row.get("estimate_s"))} | '
        f'{_f(row.get("device_peak_gb"))} | {_f(row.get("loss"), 6)} | '
        f'{_f(row.get("grad_norm"), 6)} | '
        f'{row.get("skipped", "")} |'
      )
    if left_out:
      lines += ['', 'The estimate costs as zero what these kernels do not state: ' + '; '.join(
        f'`{name}` ({", ".join(fields)})' for name, fields in left_out.items()
      )]  # fmt: skip
    return lines + _target_lines(r)
  if part == 'split':
    lines = ['| variant | L | kernel | device s per step, MEASURED |', '|---|---:|---|---:|']
    for variant, v in r['variants'].items():
      lines.append(f'| {variant} | {v["length"]:,} | (all kernels) | {_f(v["device_s"])} |')
      for kernel, seconds in v['kernels_s'].items():
        lines.append(f'| {variant} | {v["length"]:,} | `{kernel[:60]}` | {_f(seconds)} |')
    return lines
  lines = [
    r['settings'] + '.',
    '',
    '| shape | model | step (s), MEASURED | tokens/s, MEASURED | MFU, MEASURED |',
    '|---|---|---:|---:|---:|',
  ]
  for name, s in r['shapes'].items():
    if 'skipped' in s:
      lines.append(f'| {name} | | | skipped: {s["skipped"]} | |')
      continue
    for model, seconds in s['step_s'].items():
      lines.append(
        f'| {name} ({s["shape"]}) | {model} | {_f(seconds, 4)} | '
        f'{s["tokens_per_s"][model]:,.0f} | {_f(s.get("mfu", {}).get(model))} |'
      )
  splits = [(n, m, v) for n, s in r['shapes'].items() for m, v in s.get('kernels_s', {}).items()]
  if splits:
    lines += ['', '| shape | model | kernel | device s per step, MEASURED |', '|---|---|---|---:|']
    for name, model, v in splits:
      lines.append(f'| {name} | {model} | (all kernels) | {_f(v["device_s"])} |')
      lines += [f'| {name} | {model} | `{k[:60]}` | {_f(t)} |' for k, t in v['kernels_s'].items()]
  return lines + _target_lines(r)


def _target_lines(r: dict) -> list[str]:
  from benchmarks import device_targets  # pylint: disable=import-outside-toplevel

  verdicts = device_targets.lines(r.get('targets') or {})
  return (['', "Issue 57's targets:", ''] + [f'- {v}' for v in verdicts]) if verdicts else []


TITLES = {
  'steps': '1. Train steps at 32 x 512',
  'long': '2. Long sequences: measured next to the estimate',
  'split': '3. Per-kernel device time (profiler trace)',
  'device': '4. Device check (experiments.device_check)',
}


def render(results: dict) -> str:
  lines = [
    f'# Device suite ({results["size"]} size), {results["date"]}',
    '',
    '`python -m benchmarks.device_suite` (benchmarks/device_suite.py). MEASURED: timed on '
    'this device. ESTIMATED: the roofline (realformer_jax/aot/roofline.py) of the same '
    'compiled program, never a measurement.',
  ]
  for part, result in results['parts'].items():
    lines += ['', f'## {TITLES[part]}', ''] + render_part(part, result)
  return '\n'.join(lines) + '\n'


def parse_lengths(text: str) -> tuple:
  """'16384,65536' -> (65536, 16384): longest first, so a short budget keeps the longest;
  () for anything but positive integers."""
  try:
    lengths = tuple(sorted({int(n) for n in text.split(',') if n.strip()}, reverse=True))
  except ValueError:
    return ()
  return lengths if lengths and min(lengths) > 0 else ()


def parse_tiles(text: str, launch: tuple = (0, 0)) -> tuple:
  """'64x128,128x128x4x3' -> ((64, 128, 0, 0), (128, 128, 4, 3)): (key rows a program owns,
  rows per step, warps, stages); 'KxR' takes `launch`'s warps and stages (0: the tile
  table's). () for anything else, tiles not powers of two >= 16, warps not a power of two up
  to 16 or stages not 1-8."""
  tiles = []
  for item in (p for p in text.split(',') if p.strip()):
    try:
      numbers = tuple(int(n) for n in item.lower().split('x'))
    except ValueError:
      return ()
    if len(numbers) == 4:
      if numbers[2] not in (1, 2, 4, 8, 16) or not 1 <= numbers[3] <= 8:
        return ()
    elif len(numbers) == 2:
      numbers += tuple(launch)
    else:
      return ()
    if any(n < 16 or n & (n - 1) for n in numbers[:2]):
      return ()
    tiles.append(numbers)
  return tuple(tiles)


def _tiles_flag(flag: str, text: str, launch: tuple, example: str) -> tuple:
  """parse_tiles of a --FLAG's candidates, or one line `error: ...` and exit status 2."""
  tiles = parse_tiles(text, launch)
  if text and not tiles:
    print(
      f'error: --{flag}={text}: expected KEYSxROWS (powers of two >= 16), optionally '
      f'xWARPSxSTAGES (warps 1-16, stages 1-8), e.g. {example}'
    )
    sys.exit(2)
  return tiles


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True, help='folder for results.json and results.md')
  parser.add_argument('--toy', action='store_true', help='toy sizes: any backend, CI on a CPU')
  parser.add_argument(
    '--parts', default=','.join(DEFAULT_PARTS), help=f'of {",".join(PARTS)} (default: '
    f'{",".join(DEFAULT_PARTS)}; the device check is a call of its own)'
  )  # fmt: skip
  parser.add_argument(
    '--dry_run', action='store_true', help='print the plan (each part\'s planned seconds) and '
    'stop: nothing is compiled or run'
  )  # fmt: skip
  parser.add_argument(
    '--budget_s', type=float, default=DEFAULT_BUDGET_S, help='wall-clock budget (s)'
  )
  parser.add_argument(
    '--lengths', default='', help='the long part\'s sequence lengths, longest first (default: '
    'the size\'s own)'
  )  # fmt: skip
  parser.add_argument(
    '--qk_ds_tiles', default='', help='the long part also times qk at the longest length '
    'with each of these dS tiles, KEYSxROWS[xWARPSxSTAGES] (e.g. 64x128,64x128x4x3)'
  )  # fmt: skip
  parser.add_argument(
    '--post_bwd_tiles', default='', help='the long part also times post at the longest length '
    'with each of these backward tiles, KEYSxROWS[xWARPSxSTAGES] (e.g. 128x32x4x5,128x128x8x2)'
  )  # fmt: skip
  args = parser.parse_args(argv)
  requested = [p for p in args.parts.split(',') if p]
  unknown = [p for p in requested if p not in PARTS]
  if unknown:
    print(f'error: --parts={args.parts}: unknown part {unknown[0]!r} (known: {PARTS})')
    sys.exit(2)
  parts = [p for p in PARTS if p in requested]  # always in the suite's order
  if args.budget_s <= 0:
    print(f'error: --budget_s={args.budget_s}: must be positive')
    sys.exit(2)
  size = TOY if args.toy else FULL
  if args.lengths:
    lengths = parse_lengths(args.lengths)
    if not lengths:
      print(f'error: --lengths={args.lengths}: expected positive integers, e.g. 65536,16384')
      sys.exit(2)
    size = dataclasses.replace(size, lengths=lengths, long_rows=())
  qk_ds_tiles = _tiles_flag('qk_ds_tiles', args.qk_ds_tiles, (0, 0), '64x128,64x128x4x3')
  post_bwd_tiles = _tiles_flag('post_bwd_tiles', args.post_bwd_tiles, (4, 2), '128x32x4x5,128x128')
  suite = Suite(
    args.out, size, args.budget_s, lambda s: print(s, flush=True), qk_ds_tiles, post_bwd_tiles
  )
  planned = plan(suite, parts)
  total = sum(seconds for _, seconds in planned)
  if args.dry_run:
    for what, seconds in planned:
      print(f'  {seconds:6.0f} s  {what}')
    print(f'planned {total:.0f} s of --budget_s={args.budget_s:.0f} ({size.name} size)')
    return {'plan': planned, 'planned_s': total, 'budget_s': args.budget_s}
  for part in parts:
    needs = expected_s(part, suite.size)
    if not suite.fits(needs):
      suite.skip(part, needs)
      continue
    suite.log(f'[{part}] starting ({suite.left_s():.0f} s left)')
    suite.record(part, RUNNERS[part](suite))
  suite.log(f'wrote {os.path.join(args.out, "results.md")} and results.json')
  return suite.results


if __name__ == '__main__':
  main(sys.argv[1:])

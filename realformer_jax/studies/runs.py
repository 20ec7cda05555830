"""A resumable grid of experiment runs with a progress line and ETAs (per run and for the grid).

    grid = Grid(out_dir, [Run('post-s0', {'layout': 'post', 'seed': 0}, cost=600), ...])
    results = grid.run(train_one)   # train_one(run, report) -> JSON-serialisable dict

Each finished run's result is written atomically to `<out_dir>/runs/<name>.json`; running the
grid again loads those and trains only what is missing, so an interrupted experiment resumes
instead of starting over (a run itself may also resume, e.g. from checkpoints in its workdir).
A result records the digest of its own contents (`digest`, `result_digest`): one edited by hand
or damaged since is refused (ResultError, one line naming the file), a truncated or empty one
is set aside (`<name>.json.damaged`, named in one line) and its run counts as unfinished.
Results written before digests existed (docs/results/**/runs) carry none and load as they are:
legacy, their contents unverified.
A grid given an `identity` (what its results depend on besides each run's parameters: the code,
`code_identity()`, and settings shared by every run) stores it in each result and runs again,
saying so, every run whose stored result has another: results of other code are not mixed in.
`report(fraction, message)` prints, at most every `min_interval` seconds,

    [3/12 post-s2] step 300/600 loss 4.812 | run ETA 0m41s | grid ETA 9m12s

The run ETA is the run's remainder at its recent pace (the median over its last few reports,
so one report interval that held a pause does not skew it); the grid ETA adds the remaining
runs' cost (e.g. their step counts) at that pace, shared among the grid's `workers` (processes
taking runs from the same queue: `run_planned` counts itself and each run another is training;
the line then names them, `grid ETA 1h10m (2 processes)`).

A grid whose later runs depend on earlier results (e.g. confirmation runs at the best learning
rate of a sweep) is a plan, `plan(results) -> runs`, re-evaluated after every finished run:

    run_planned(out_dir, plan, train_one, select=lambda runs: runs)

runs what the plan lists and `select` keeps, one at a time, until nothing is left; results
written meanwhile by other processes (another part of the same plan) count as finished.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Optional, Sequence

from realformer_jax import atomic_files
from realformer_jax.units import format_duration


@dataclasses.dataclass(frozen=True)
class Run:
  name: str  # unique; the result file's name (letters, digits, '-', '_', '.', '+')
  params: dict[str, Any]
  cost: float = 1.0  # relative work (e.g. training steps): weights the grid ETA


Report = Callable[[float, str], None]

DIGEST_FIELD = 'digest'
_DAMAGED_SUFFIX = '.damaged'


class ResultError(ValueError):
  """A stored result that no longer matches the digest it was written with, or cannot be read
  (one line)."""


def result_digest(result: dict) -> str:
  """SHA-256 of a result's contents, less its digest, written canonically (sorted keys): any
  changed value changes it."""
  contents = {k: v for k, v in result.items() if k != DIGEST_FIELD}
  canonical = json.dumps(contents, sort_keys=True, separators=(',', ':'))
  return hashlib.sha256(canonical.encode()).hexdigest()


def with_digest(result: dict) -> dict:
  return dict(result, **{DIGEST_FIELD: result_digest(result)})


def read_result(path: str, stream=None) -> Optional[dict]:
  """The result stored at `path`; None when there is none, or when it is truncated, empty or
  not a result (then it is renamed aside to `<path>.damaged[-n]`, said in one line on
  `stream`, and its run counts as unfinished). ResultError when its contents no longer match
  its digest: a result edited after its run must not reach a report."""
  try:
    with open(path, 'rb') as f:
      raw = f.read()
  except FileNotFoundError:
    return None
  except OSError as e:  # a directory where the result (or the runs folder) should be
    raise ResultError(
      f'{path}: cannot be read as a stored result ({e.strerror}): move aside what is in its '
      'place, or give the study another --out / --store'
    ) from None
  text = raw.decode('utf-8', errors='replace')
  try:
    result = json.loads(raw.decode('utf-8'))  # bytes that are not UTF-8: not a whole result
    if not isinstance(result, dict):
      raise ValueError(f'a JSON {type(result).__name__}, not an object')
  except ValueError as e:
    why = 'empty' if not text.strip() else f'not a whole result ({str(e).splitlines()[0]})'
    aside = _set_aside(path)
    print(
      f'note: {path}: {why}: set aside to {os.path.basename(aside)}; its run counts as unfinished',
      file=stream or sys.stdout,
      flush=True,
    )
    return None
  recorded = result.get(DIGEST_FIELD)
  if recorded is not None and recorded != result_digest(result):
    raise ResultError(
      f'{path}: its contents do not match the digest it was written with (edited or damaged '
      'since its run): not reported; delete it to train that run again, or put back its own copy'
    )
  return result


def _set_aside(path: str) -> str:
  target, n = path + _DAMAGED_SUFFIX, 1
  while os.path.exists(target):
    n += 1
    target = f'{path}{_DAMAGED_SUFFIX}-{n}'
  os.replace(path, target)
  return target


def write_json(path: str, value: Any) -> None:
  """Atomic: a reader sees the old file or the whole new one, never a partial write."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  atomic_files.write_json(path, value)


def code_identity(extra: Optional[dict] = None) -> dict:
  """{'code': a digest of the project's sources (realformer_jax, benchmarks, studies), 'jax':
  its version} and `extra`: the identity of a grid whose results a compile computes."""
  import jax  # pylint: disable=import-outside-toplevel

  from realformer_jax.source_digest import source_digest  # pylint: disable=import-outside-toplevel

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  folders = [os.path.join(root, package) for package in ('realformer_jax', 'benchmarks', 'studies')]
  return {'code': source_digest(folders), 'jax': jax.__version__, **(extra or {})}


class Grid:
  """Runs `runs` in order, skipping those with a result file (of the same `identity`, when
  the grid has one)."""

  def __init__(
    self,
    out_dir: str,
    runs: Sequence[Run],
    *,
    min_interval: float = 10.0,
    stream=None,
    identity: Optional[dict] = None,
    workers: int = 1,
  ):
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
      raise ValueError(f'duplicate run names in the grid: {sorted(names)}')
    self.out_dir = out_dir
    self.runs = tuple(runs)
    self.min_interval = min_interval
    self._stream = stream or sys.stdout
    self.identity = identity
    self.workers = max(1, workers)

  def _current(self, run: Run) -> Optional[dict]:
    """`run`'s stored result if it has this grid's identity (any result, without one); a
    result of another identity is named in one line and not returned."""
    result = self.load(run)
    if result is None or self.identity is None or result.get('identity') == self.identity:
      return result
    self._print(
      f'{run.name}: its result came from {result.get("identity") or "an unrecorded identity"}, '
      f'not {self.identity}: run again'
    )
    return None

  def result_path(self, run: Run) -> str:
    return os.path.join(self.out_dir, 'runs', f'{run.name}.json')

  def load(self, run: Run) -> Optional[dict]:
    return read_result(self.result_path(run), self._stream)

  def run_first(self, train_one: Callable[[Run, Report], dict]) -> None:
    """Trains only the first unfinished run (the ETA still covers the rest)."""
    self.run(train_one, limit=1)

  def run(
    self, train_one: Callable[[Run, Report], dict], limit: Optional[int] = None
  ) -> dict[str, dict]:
    results = {run.name: r for run in self.runs if (r := self._current(run)) is not None}
    todo = [run for run in self.runs if run.name not in results]
    total = len(self.runs)
    if len(todo) < total:
      self._print(f'{total - len(todo)}/{total} runs already done in {self.out_dir}: skipped')
    rate = float('nan')  # seconds per cost unit of the last run this process finished
    # Processes sharing the queue train its rest side by side: each takes a share of its cost.
    share = 1 / self.workers
    sharing = f' ({self.workers} processes)' if self.workers > 1 else ''
    for position, run in enumerate(todo):
      if limit is not None and position >= limit:
        break
      index = total - len(todo) + position + 1
      remaining_cost = share * sum(r.cost for r in todo[position + 1 :])
      start = time.perf_counter()
      last_print = [-float('inf')]
      # Seconds per fraction of the run between consecutive reports, the last few: the ETA is
      # their median, measured from the first report on (a resumed run reports its first step
      # at a fraction already done by an earlier process, and its compile is not a step's
      # cost), and one interval that held a pause (a suspended machine, a stopped process)
      # does not make it hours for the rest of the run, as the whole run's average did.
      paces, last_call = collections.deque(maxlen=5), []

      def report(
        fraction: float,
        message: str,
        run=run,
        index=index,
        remaining_cost=remaining_cost,
        last_print=last_print,
        paces=paces,
        last_call=last_call,
        previous_rate=rate,
      ) -> None:
        now = time.perf_counter()
        if last_call and fraction > last_call[0][1]:
          paces.append((now - last_call[0][0]) / (fraction - last_call[0][1]))
        last_call[:] = [(now, fraction)]
        if now - last_print[0] < self.min_interval and fraction < 1.0:
          return
        last_print[0] = now
        pace = statistics.median(paces) if paces else float('nan')
        # Until this run has a pace, the last finished run's rate prices the grid.
        per_cost = pace / run.cost if paces and run.cost > 0 else previous_rate
        run_left = pace * (1.0 - fraction)
        grid_left = (run_left if paces else per_cost * run.cost * (1.0 - fraction)) + (
          remaining_cost * per_cost
        )
        self._print(
          f'[{index}/{total} {run.name}] {message} | run ETA '
          f'{format_duration(run_left)} | grid ETA {format_duration(grid_left)}{sharing}'
        )

      self._print(f'[{index}/{total} {run.name}] starting {run.params}')
      result = train_one(run, report)
      # This process's wall time: a run resumed from a checkpoint leaves out its earlier ones.
      seconds = time.perf_counter() - start
      result = dict(result, run=run.name, params=run.params, seconds=seconds)
      if self.identity is not None:
        result['identity'] = self.identity
      result = with_digest(result)
      write_json(self.result_path(run), result)
      results[run.name] = result
      if last_call and last_call[0][1] < 1.0:  # the rest of the run: its evaluation, its save
        paces.append((start + seconds - last_call[0][0]) / (1.0 - last_call[0][1]))
      if paces and run.cost > 0:
        rate = statistics.median(paces) / run.cost
      self._print(
        f'[{index}/{total} {run.name}] done in {format_duration(seconds)} | grid ETA '
        f'{format_duration(remaining_cost * rate)}{sharing}'
      )
    return results

  def _print(self, line: str) -> None:
    print(line, file=self._stream, flush=True)


def load_results(out_dir: str, runs: Sequence[Run]) -> dict[str, dict]:
  """The finished results among `runs` (by name)."""
  grid = Grid(out_dir, runs)
  return {run.name: result for run in grid.runs if (result := grid.load(run)) is not None}


def run_planned(
  out_dir: str,
  plan: Callable[[dict[str, dict]], Sequence[Run]],
  train_one: Callable[[Run, Report], dict],
  select: Callable[[Sequence[Run]], Sequence[Run]] = lambda runs: runs,
  stream=None,
  busy: Callable[[Run], bool] = lambda run: False,
  poll_s: float = 60.0,
) -> dict[str, dict]:
  """Runs the plan's selected unfinished runs one by one, re-planning after each; returns every
  finished result of the final plan; a selected run another process is training (`busy`) is
  left to it. With nothing of its selection left while another process
  is training a run of the plan (`busy`: e.g. its workdir is locked), it waits for that run
  (checking every `poll_s` seconds) instead of returning: the plan may grow when it finishes
  (a process split by seeds would otherwise stop at the end of a stage the other closes)."""
  done_here: set[str] = set()
  waited_for: list[str] = []
  while True:
    every = plan(all_results(out_dir, stream))
    unfinished = [run for run in every if Grid(out_dir, [run], stream=stream).load(run) is None]
    mine = select(every)
    # A run another process is training is not this one's to start (selections may overlap:
    # two processes whose patterns both name it would otherwise meet at its workdir lock).
    elsewhere = [run.name for run in unfinished if busy(run)]
    todo = [run for run in mine if run in unfinished and run.name not in elsewhere]
    if not todo:
      # Only a process with a share of the plan waits (one selecting nothing: a report).
      elsewhere = elsewhere if mine else []
      if not elsewhere:
        return load_results(out_dir, every)
      if elsewhere != waited_for:
        waited_for = elsewhere
        print(
          f'nothing selected left to run; waiting for {", ".join(elsewhere)} (another '
          'process): the plan may grow when it finishes',
          file=stream or sys.stdout,
          flush=True,
        )
      time.sleep(poll_s)
      continue
    # One run at a time through a Grid of what is left, so its progress line and ETA cover
    # the rest of this process's selection, shared with the processes training the plan's
    # other runs (each busy run is one; they take from the same queue when they finish).
    grid = Grid(out_dir, todo, stream=stream, workers=1 + len(elsewhere))
    first = todo[0]
    if first.name in done_here:  # finished but unreadable: do not loop forever
      raise RuntimeError(f'{first.name}: trained, but its result file is missing')
    try:
      grid.run_first(train_one)
    except Exception:
      # Another process took the run between the look above and the workdir lock: it is
      # theirs now (the failure was refusing the lock, nothing was trained); plan again.
      if busy(first):
        print(
          f'{first.name}: taken by another process; planning again',
          file=stream or sys.stdout,
          flush=True,
        )
        continue
      raise
    done_here.add(first.name)


def all_results(out_dir: str, stream=None) -> dict[str, dict]:
  """Every readable result in `out_dir`'s store (by name), whatever plan listed it."""
  directory = os.path.join(out_dir, 'runs')
  if not os.path.isdir(directory):
    return {}
  results = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith('.json'):
      result = read_result(os.path.join(directory, name), stream)
      if result is not None:
        results[name[: -len('.json')]] = result
  return results

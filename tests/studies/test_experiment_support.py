"""realformer_jax/studies/stats.py against tabulated t quantiles, hand computations and formulas
(Holm, the seed + eval-set interval, the verdict rule); realformer_jax/studies/report.py's table
cell; realformer_jax/studies/runs.py resumes a grid without re-running finished runs, prints ETAs,
and follows a plan that grows with its results."""

import io
import json
import math

import numpy as np
import pytest

from realformer_jax.studies import report, runs, stats
from realformer_jax.units import format_duration


@pytest.mark.parametrize(
  'df, expected', [(1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139), (30, 2.042272)]
)
def test_t_quantile_matches_tables(df, expected):
  assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-5)


def test_t_cdf_is_symmetric_and_normal_for_large_df():
  assert stats.t_cdf(0.0, 3) == pytest.approx(0.5)
  assert stats.t_cdf(-1.3, 5) == pytest.approx(1 - stats.t_cdf(1.3, 5))
  assert stats.t_cdf(1.959964, 1e7) == pytest.approx(0.975, abs=1e-6)


def test_mean_ci_by_hand():
  s = stats.mean_ci([1.0, 2.0, 6.0])
  sd = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)
  assert s.mean == 3.0 and s.n == 3
  assert s.half_width == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-6)
  assert (s.low, s.high) == pytest.approx((3.0 - s.half_width, 3.0 + s.half_width))
  assert math.isnan(stats.mean_ci([5.0]).half_width)
  assert stats.format_ci(stats.mean_ci([0.5, 0.5, 0.5]), digits=1, scale=100) == '50.0 ± 0.0'


def test_paired_and_welch_differences():
  a, b = [1.0, 2.0, 3.0], [0.5, 1.4, 2.6]
  paired = stats.paired_diff_ci(a, b)
  assert paired.mean == pytest.approx(0.5)
  assert stats.interval_verdict(paired) == 'higher'
  welch = stats.welch_diff_ci(a, b)
  assert welch.mean == pytest.approx(0.5)
  assert stats.interval_verdict(welch) == 'inconclusive'  # seed-to-seed spread dominates
  with pytest.raises(ValueError, match='pair them'):
    stats.paired_diff_ci([1.0], [1.0, 2.0])
  assert stats.interval_verdict(paired, expected_sign=-1) == 'does not hold'
  assert stats.interval_verdict(stats.mean_ci([1.0])) == 'inconclusive'  # no interval


@pytest.mark.parametrize(
  'mean, p, sign, expected',
  [
    (0.3, 0.01, +1, 'holds'),
    (-0.3, 0.01, +1, 'does not hold'),
    (-0.3, 0.01, -1, 'holds'),
    (0.3, 0.05, +1, 'inconclusive'),  # p < 0.05 is significant, p = 0.05 is not
    (0.3, 0.01, 0, 'higher'),
    (-0.3, 0.01, 0, 'lower'),
  ],
)
def test_the_verdict_rule(mean, p, sign, expected):
  assert stats.p_verdict(mean, p, sign) == expected


def test_seed_cell():
  assert report.seed_cell([0.6121, 0.6190, 0.6082], scale=100) == (
    '61.31 ± 1.36 (61.21, 61.90, 60.82)'
  )
  assert report.seed_cell([4.1234, 4.2], 3) == '4.162 ± 0.487 (4.123, 4.200)'  # t_1 = 12.706
  # The interval is over the finite values; a diverged seed is named, not dropped.
  assert (
    report.seed_cell([0.5, math.nan, 0.7], scale=100) == '60.00 ± 127.06 (50.00, diverged, 70.00)'
  )
  assert report.seed_cell([0.5, math.inf], scale=100) == '50.00, diverged'
  assert report.seed_cell([1.5]) == '1.50'
  assert report.seed_cell([]) == 'n/a'


def test_comparison_cells():
  comparison = {'mean': 0.01234, 'ci95_half_width': 0.005, 'p_value': 0.012345}
  row = {'comparison': comparison, 'holm_p_value': 0.0370351}
  assert report.comparison_cells(row) == ('+1.23 ± 0.50', '0.0123', '0.037')
  # No Holm family: its cell is n/a; no comparison (too few seeds): every cell is.
  assert report.comparison_cells({'comparison': comparison})[2] == 'n/a'
  assert report.comparison_cells({'comparison': None}) == ('n/a', 'n/a', 'n/a')


def test_grid_skips_finished_runs_and_reports_eta(tmp_path):
  calls = []

  def train_one(run, report):
    calls.append(run.name)
    report(0.5, 'half way')
    report(1.0, 'done')
    return {'accuracy': run.params['x'] * 2}

  grid_runs = [runs.Run(f'r{i}', {'x': i}, cost=10) for i in range(3)]
  out = io.StringIO()
  results = runs.Grid(str(tmp_path), grid_runs, min_interval=0.0, stream=out).run(train_one)
  assert calls == ['r0', 'r1', 'r2']
  assert results['r2']['accuracy'] == 4 and results['r2']['params'] == {'x': 2}
  assert 'run ETA' in out.getvalue() and 'grid ETA' in out.getvalue()
  assert json.loads((tmp_path / 'runs' / 'r1.json').read_text())['accuracy'] == 2

  (tmp_path / 'runs' / 'r1.json').unlink()  # as if interrupted during r1
  calls.clear()
  again = runs.Grid(str(tmp_path), grid_runs, min_interval=0.0, stream=io.StringIO())
  assert again.run(train_one)['r0']['accuracy'] == 0
  assert calls == ['r1']


def test_durations_read_as_hours_and_minutes_or_minutes_and_seconds():
  # One format for the train loop's ETA and the grids' (realformer_jax/units.py).
  assert format_duration(3725) == '1h02m' and format_duration(247.4) == '4m07s'
  assert format_duration(-3) == '0m00s'  # a clock that ran backwards: no negative time left
  assert format_duration(float('nan')) == format_duration(float('inf')) == '?'  # not measured


def test_a_grid_with_an_identity_runs_again_what_other_code_computed(tmp_path):
  calls = []

  def train_one(run, report):
    calls.append(run.name)
    return {'value': 1}

  grid_runs = [runs.Run('a', {}), runs.Run('b', {})]
  runs.Grid(str(tmp_path), grid_runs, stream=io.StringIO()).run(train_one)  # no identity
  out = io.StringIO()
  first = {'code': 'c1', 'jax': '0.1'}
  runs.Grid(str(tmp_path), grid_runs, stream=out, identity=first).run(train_one)
  assert calls == ['a', 'b', 'a', 'b']  # results without an identity are not taken as its
  assert "a: its result came from an unrecorded identity, not {'code': 'c1'" in out.getvalue()
  assert json.loads((tmp_path / 'runs' / 'a.json').read_text())['identity'] == first
  calls.clear()
  runs.Grid(str(tmp_path), grid_runs[:1], stream=io.StringIO(), identity=first).run(train_one)
  assert calls == []  # the same identity: done
  out = io.StringIO()
  runs.Grid(str(tmp_path), grid_runs[:1], stream=out, identity={'code': 'c2'}).run(train_one)
  assert calls == ['a'] and "came from {'code': 'c1', 'jax': '0.1'}, not {'code': 'c2'}" in (
    out.getvalue()
  )
  # The project's code identity: the sources' digest and jax's version, plus what is given.
  identity = runs.code_identity({'hidden': 768})
  assert set(identity) == {'code', 'jax', 'hidden'} and len(identity['code']) == 16


def test_grid_rejects_duplicate_names(tmp_path):
  with pytest.raises(ValueError, match='duplicate'):
    runs.Grid(str(tmp_path), [runs.Run('a', {}), runs.Run('a', {})])


def test_t_quantile_non_integer_df_by_quadrature():
  # Welch intervals use fractional df: integrate the t density up to the quantile.
  df = 2.5
  c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
  q = stats.t_quantile(0.975, df)
  n = 20000
  h = q / n
  mass = sum(c * (1 + ((i + 0.5) * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n)) * h
  assert 0.5 + mass == pytest.approx(0.975, abs=1e-7)


def test_holm_by_hand():
  # Sorted p = 0.01, 0.02, 0.04 with m = 3: 0.03, 0.04, 0.04 (monotone), back in input order.
  assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
  assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_t_p_value_matches_the_quantile():
  assert stats.t_p_value(stats.t_quantile(0.975, 3), 1.0, 3) == pytest.approx(0.05, abs=1e-9)
  assert stats.t_p_value(0.0, 1.0, 3) == pytest.approx(1.0)


def test_paired_ratio_comparison_adds_eval_set_variance():
  rng = np.random.default_rng(0)
  count = rng.integers(5, 12, 400).astype(float)
  # Model a is better on every sequence by a constant rate; seeds add noise per seed.
  base = rng.binomial(count.astype(int), 0.3).astype(float)
  a = np.stack([base + rng.binomial(count.astype(int), 0.05) for _ in range(4)])
  b = np.stack([base for _ in range(4)])
  result = stats.paired_ratio_comparison(a, b, count, resamples=500)
  per_seed = (a - b).sum(1) / count.sum()
  assert result.mean == pytest.approx(per_seed.mean())
  assert result.per_seed == pytest.approx(tuple(per_seed))
  seeds_only = stats.paired_diff_ci(list(a.sum(1) / count.sum()), list(b.sum(1) / count.sum()))
  assert result.seed_se == pytest.approx(seeds_only.half_width / stats.t_quantile(0.975, 3))
  # The eval-set part: the standard error of a mean over 400 sequences, by formula.
  diff = (a - b).mean(0)
  ratio = diff.sum() / count.sum()
  by_formula = math.sqrt(np.sum((diff - ratio * count) ** 2)) / count.sum()
  assert result.eval_se == pytest.approx(by_formula, rel=0.15)
  assert result.half_width == pytest.approx(
    stats.t_quantile(0.975, 3) * math.hypot(result.seed_se, result.eval_se)
  )
  assert result.low > 0 and result.p_value < 0.05
  # Identical models: no difference, p = 1.
  same = stats.paired_ratio_comparison(b, b, count, resamples=50)
  assert same.mean == 0 and same.p_value == 1.0


def test_run_planned_follows_a_plan_that_grows_with_results(tmp_path):
  # Stage 2 exists only once both stage-1 runs are done (like confirmation runs at a best
  # rate); a selection splits the work, and another process's results count as finished.
  def plan(done):
    first = [runs.Run('a-s0', {'x': 1}), runs.Run('a-s1', {'x': 2})]
    if all(r.name in done for r in first):
      best = max(first, key=lambda r: done[r.name]['value'])
      return first + [runs.Run(f'b{best.params["x"]}-s{s}', {'x': 10}) for s in (0, 1)]
    return first

  calls = []

  def train_one(run, report):
    calls.append(run.name)
    return {'value': run.params['x']}

  quiet = io.StringIO()
  only_s0 = lambda rs: [r for r in rs if r.name.endswith('-s0')]
  runs.run_planned(str(tmp_path), plan, train_one, select=only_s0, stream=quiet)
  assert calls == ['a-s0']  # stage 2 waits for a-s1, which is not in the selection
  runs.run_planned(str(tmp_path), plan, train_one, stream=quiet)
  assert calls == ['a-s0', 'a-s1', 'b2-s0', 'b2-s1']
  calls.clear()
  done = runs.run_planned(str(tmp_path), plan, train_one, stream=quiet)
  assert calls == [] and sorted(done) == ['a-s0', 'a-s1', 'b2-s0', 'b2-s1']


def test_run_planned_waits_for_a_stage_another_process_is_finishing(tmp_path):
  # Split by seed, the process that ends stage 1 first must not stop: the other one's run
  # (busy) decides stage 2, half of which is this process's.
  def plan(done):
    first = [runs.Run('a-s0', {}), runs.Run('a-s1', {})]
    return first + ([runs.Run('b-s0', {})] if all(r.name in done for r in first) else [])

  calls, polls = [], []

  def train_one(run, report):
    calls.append(run.name)
    return {'value': 1}

  def busy(run):  # a-s1 is being trained elsewhere; it finishes after the second look
    if run.name != 'a-s1':
      return False
    polls.append(run.name)
    if len(polls) == 2:
      runs.write_json(str(tmp_path / 'runs' / 'a-s1.json'), {'value': 2})
    return run.name == 'a-s1'

  quiet = io.StringIO()
  only_s0 = lambda rs: [r for r in rs if r.name.endswith('-s0')]
  runs.run_planned(str(tmp_path), plan, train_one, only_s0, quiet, busy=busy, poll_s=0)
  assert calls == ['a-s0', 'b-s0'] and polls == ['a-s1', 'a-s1']
  assert quiet.getvalue().count('waiting for a-s1') == 1
  # Nobody training the missing run: the process returns instead of waiting for ever.
  calls.clear()
  (tmp_path / 'runs' / 'a-s1.json').unlink()
  runs.run_planned(str(tmp_path), plan, train_one, only_s0, quiet, busy=lambda run: False)
  assert calls == []
  # A process that selects nothing (the report) never waits.
  runs.run_planned(str(tmp_path), plan, train_one, lambda rs: [], quiet, busy=lambda run: True)


def test_run_planned_leaves_a_run_of_two_selections_to_the_process_training_it(tmp_path):
  # Two processes whose patterns both name a-s1: the one that finds it held trains the rest of
  # its selection; one that loses the race for the lock (the check passed, the lock did not)
  # plans again instead of dying with the lock's error.
  plan = lambda done: [runs.Run('a-s0', {}), runs.Run('a-s1', {}), runs.Run('a-s2', {})]
  calls, held = [], {'a-s1'}

  def train_one(run, report):
    if run.name in held:
      raise RuntimeError(f'workdir {run.name} is in use by another run')
    calls.append(run.name)
    if run.name == 'a-s2':  # the other process finishes a-s1 meanwhile
      runs.write_json(str(tmp_path / 'runs' / 'a-s1.json'), {'value': 1})
      held.clear()
    return {'value': 1}

  quiet = io.StringIO()
  busy = lambda run: run.name in held
  done = runs.run_planned(str(tmp_path), plan, train_one, stream=quiet, busy=busy, poll_s=0)
  assert calls == ['a-s0', 'a-s2'] and sorted(done) == ['a-s0', 'a-s1', 'a-s2']
  # The race: the look says free, the lock says taken (and then the run is held): no crash.
  for name in ('a-s0', 'a-s1', 'a-s2'):
    (tmp_path / 'runs' / f'{name}.json').unlink()
  calls.clear()
  looks = []

  def busy_after_first_look(run):
    looks.append(run.name)
    return run.name == 'a-s0' and looks.count('a-s0') > 1

  def train_raced(run, report):
    if run.name == 'a-s0':
      if looks.count('a-s0') == 1:
        raise RuntimeError('workdir a-s0 is in use by another run')
    calls.append(run.name)
    if run.name == 'a-s2':
      runs.write_json(str(tmp_path / 'runs' / 'a-s0.json'), {'value': 1})
    return {'value': 1}

  busy = busy_after_first_look
  runs.run_planned(str(tmp_path), plan, train_raced, stream=quiet, busy=busy, poll_s=0)
  assert calls == ['a-s1', 'a-s2']
  assert 'a-s0: taken by another process; planning again' in quiet.getvalue()
  # A failure of the process's own run (nobody else holds it) still ends the process.
  (tmp_path / 'runs' / 'a-s0.json').unlink()

  def fails(run, report):
    raise RuntimeError('out of memory')

  with pytest.raises(RuntimeError, match='out of memory'):
    runs.run_planned(str(tmp_path), plan, fails, stream=quiet, busy=lambda run: False)


def test_a_workdir_is_held_while_its_owner_lives(tmp_path):
  from realformer_jax.train import workdir_lock  # pylint: disable=import-outside-toplevel

  assert not workdir_lock.held(str(tmp_path))  # no lock file
  lock = workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  try:
    assert workdir_lock.held(str(tmp_path))
  finally:
    lock.release()
  assert not workdir_lock.held(str(tmp_path))


def test_a_study_result_records_its_checkpoint_identity_and_machine(tmp_path):
  # Runs of one study trained on different days can disagree (compare_stability's recipe
  # check); each result says what it came from, so the difference can be traced.
  import hashlib  # pylint: disable=import-outside-toplevel

  from realformer_jax.studies import study  # pylint: disable=import-outside-toplevel
  from realformer_jax.train import checkpoint_integrity, run_identity  # pylint: disable=import-outside-toplevel

  config = {'model': {'num_layers': 2}, 'train': {'seed': 1}}
  (tmp_path / 'config.json').write_text(json.dumps(config))
  (tmp_path / 'tokenizer.model').write_bytes(b'pieces')
  for step in ('2', '10', '12', 'tmp'):  # 12: a save that never committed
    (tmp_path / 'checkpoints' / step).mkdir(parents=True)
    if step in ('2', '10'):
      (tmp_path / 'checkpoints' / step / checkpoint_integrity.COMMIT_MARKER).write_text('')
  origin = study.origin(str(tmp_path))
  checkpoint = origin['checkpoint']
  assert checkpoint['step'] == 10 and 'workdir' not in checkpoint
  assert checkpoint['config_digest'] == run_identity.config_digest(config)
  assert checkpoint['tokenizer_digest'] == hashlib.sha256(b'pieces').hexdigest()[:16]
  assert {'cpu', 'cores', 'jax', 'numpy', 'python'} <= set(origin['machine'])
  json.dumps(origin)  # JSON-ready, as the result file needs
  assert study.origin(str(tmp_path / 'never_trained'))['checkpoint'] is None


def test_a_resumed_run_estimates_from_the_steps_it_trains(tmp_path, monkeypatch):
  """A run resumed at 3/4 done reports its first step at fraction 0.75: the ETA must come from
  the steps this process trains (here 10 s per 1/8), not from 0.75 done in no time."""
  clock = iter([0.0, 100.0, 110.0, 120.0, 130.0, 140.0])
  monkeypatch.setattr(runs.time, 'perf_counter', lambda: next(clock))

  def train_one(run, report):
    report(0.75, 'step 3601')  # t = 100: resumed after 100 s of compile
    report(0.875, 'step 4200')  # t = 110
    return {}

  out = io.StringIO()
  two = [runs.Run('r', {}, cost=1), runs.Run('next', {}, cost=1)]
  runs.Grid(str(tmp_path), two, min_interval=0.0, stream=out).run(train_one, limit=1)
  lines = out.getvalue().splitlines()
  assert lines[1].endswith('step 3601 | run ETA ? | grid ETA ?'), lines
  # 10 s per 1/8: 10 s left of this run, 80 s for the next
  assert lines[2].endswith('step 4200 | run ETA 0m10s | grid ETA 1m30s'), lines
  # done at t = 120: 20 s for the last 1/4, so 80 s for the next whole run
  assert lines[3].endswith('done in 2m00s | grid ETA 1m20s'), lines


def test_a_pause_in_one_report_interval_does_not_skew_the_eta(tmp_path, monkeypatch):
  """10 s per tenth of a run, but one interval held a 1,000 s pause (a stopped process, a
  suspended machine): the ETA is the median pace of the last intervals, not the run's average
  (which said 5h26m for a 30-minute remainder after a pause in the tuned-rates study)."""
  times = [0.0, 10.0, 1010.0, 1020.0, 1030.0, 1040.0, 1050.0, 1060.0]
  clock = iter(times)
  monkeypatch.setattr(runs.time, 'perf_counter', lambda: next(clock))

  def train_one(run, report):
    for tenth in (1, 2, 3, 4, 5):  # t = 10, 1010 (after the pause), 1020, 1030, 1040
      report(tenth / 10, f'step {tenth}')
    return {}

  out = io.StringIO()
  two = [runs.Run('r', {}, cost=1), runs.Run('next', {}, cost=2)]
  runs.Grid(str(tmp_path), two, min_interval=0.0, stream=out).run(train_one, limit=1)
  lines = out.getvalue().splitlines()
  # 100 s per run (10 s a tenth): half of it left, then the next run's 200 s.
  assert lines[-2].endswith('step 5 | run ETA 0m50s | grid ETA 4m10s'), lines
  # Done at t = 1050 (the pause among the last five paces, outvoted); the next run costs 2: 200 s.
  assert lines[-1].endswith('done in 17m30s | grid ETA 3m20s'), lines


def test_processes_sharing_a_queue_share_its_grid_eta(tmp_path, monkeypatch):
  """Two processes on one plan (the depth study's commands) each take the next free run: the
  runs left after this one cost half as long as one process alone would take (which said 12h
  for a 3.5 h remainder), and the line says the ETA counts both."""
  clock = iter([0.0, 10.0, 20.0, 30.0])
  monkeypatch.setattr(runs.time, 'perf_counter', lambda: next(clock))

  def train_one(run, report):
    report(0.5, 'step 1')  # t = 10
    report(0.75, 'step 2')  # t = 20: 40 s a run
    return {}

  out = io.StringIO()
  three = [runs.Run(f'r{i}', {}, cost=1) for i in range(3)]
  runs.Grid(str(tmp_path), three, min_interval=0.0, stream=out, workers=2).run(train_one, limit=1)
  lines = out.getvalue().splitlines()
  # 10 s left of this run, then two runs of 40 s shared by two processes.
  assert lines[-2].endswith('step 2 | run ETA 0m10s | grid ETA 0m50s (2 processes)'), lines
  assert lines[-1].endswith('done in 0m30s | grid ETA 0m40s (2 processes)'), lines


def test_run_planned_counts_each_run_trained_elsewhere_as_a_process(tmp_path):
  plan = lambda done: [runs.Run(f'a-s{i}', {}) for i in range(4)]
  seen = []
  original = runs.Grid.run_first

  def spy(self, train_one):
    seen.append(self.workers)
    return original(self, train_one)

  # Another process trains a-s1 until this one has finished its share.
  busy = lambda run: run.name == 'a-s1' and not (tmp_path / 'runs' / 'a-s3.json').exists()
  train_one = lambda run, report: {'value': 1}
  quiet = io.StringIO()
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(runs.Grid, 'run_first', spy)
    runs.run_planned(str(tmp_path), plan, train_one, lambda rs: rs[2:], quiet, busy=busy, poll_s=0)
  assert seen == [2, 2]  # a-s2 and a-s3, each beside the process on a-s1

"""A study as a declared plan: arms of seeded runs, the rules that decide later arms from
earlier results, and the comparisons with their verdict rule, all data that one runner
(studies/runner.py, `python -m experiments.study --plan=NAME`) trains, resumes and reports.

    PLAN = Plan(
      name='depths', title='Pre-LN vs RealFormer at three depths', scale=SCALE,
      rules=(BestRate('r', 'pre', rates=(1e-3, 2e-3, 4e-3), steps=600, seeds=(0, 1)),),
      arms=tuple(Arm(layout, 'r', 600, SEEDS, model={'num_layers': n}, tag=f'L{n}-')
                 for n in (6, 12, 24) for layout in ('pre', 'realformer')),
      comparisons=tuple(Comparison(f'P{n}', f'RealFormer - Pre-LN, {n} layers',
                                   Side('realformer', 'r', 600, f'L{n}-'),
                                   Side('pre', 'r', 600, f'L{n}-'), SEEDS)
                        for n in (6, 12, 24)),
    )

An arm's rate is a number or the name of a rule; a rule's value (a rate, a flag) is decided
from finished runs, and an arm (or a rule) whose rule is undecided is not planned yet. The
runs of a plan are listed in priority order: the rules' own runs first, then the arms, each
arm seed by seed with the layouts of one seed together, so a process per seed pattern
(`--runs='*-s[02]'`) finishes pairs together. One run serves every arm, rule and comparison
that names it (runs are files by name in one store, shared between studies of one recipe).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from studies import runs as runs_lib
from studies.study import Scale

Rate = Union[float, str]  # a peak learning rate, or the name of the rule that decides it
Results = Mapping[str, dict]  # finished runs' results by run name

# The layouts a plan can name: the model fields each sets.
LAYOUTS = {
  'post': {'ln_placement': 'post'},
  'pre': {'ln_placement': 'pre'},
  'realformer': {'ln_placement': 'realformer'},
}

# The metrics a comparison can test: (numerator, denominator) of the per-sequence sums every
# scored run stores (study.SEQUENCE_SUMS), so each has an interval over the eval set too.
METRICS = {
  'mask_accuracy': ('mask_correct_sum', 'mask_count'),  # [MASK] slots only
  'accuracy': ('correct_sum', 'count'),  # every selected position (BERT's MLM accuracy)
}
METRIC_NAMES = {
  'mask_accuracy': 'accuracy at [MASK] slots',
  'accuracy': 'accuracy at all selected positions',
}


@dataclasses.dataclass(frozen=True)
class Side:
  """One arm of a comparison, without its seeds."""

  layout: str
  rate: Rate
  steps: int
  tag: str = ''  # a prefix of the run names that sets arms of one layout apart


@dataclasses.dataclass(frozen=True)
class Arm:
  """Runs of one layout, rate and budget, one per seed."""

  layout: str
  rate: Rate
  steps: int
  seeds: tuple[int, ...]
  tag: str = ''
  when: str = ''  # a rule's name: the arm is planned once that rule decided True
  model: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # more model fields

  @property
  def side(self) -> Side:
    return Side(self.layout, self.rate, self.steps, self.tag)


class Rule:
  """Decides a value from finished runs. `needs` lists the arms it reads (planned before any
  arm that names the rule); `decide` returns None until it can decide; `describe` is what
  the report shows of it (JSON-ready)."""

  name: str

  def needs(self, plan: 'Plan', results: Results) -> list[Arm]:
    raise NotImplementedError

  def decide(self, plan: 'Plan', results: Results) -> Any:
    raise NotImplementedError

  def describe(self, plan: 'Plan', results: Results) -> dict:
    return {'value': self.decide(plan, results)}


def final_metric(run: Optional[dict], metric: str, default: float = math.nan) -> float:
  """A finished run's final eval value of `metric` ('mask_accuracy', 'accuracy', 'loss');
  `default` for a run with no final evaluation (diverged)."""
  if not run or not run.get('final'):
    return default
  key = 'mlm_accuracy' if metric == 'accuracy' else metric
  return float(run['final'][key])


@dataclasses.dataclass(frozen=True)
class BestRate(Rule):
  """The rate of `rates` whose runs (`layout`, `steps`, `seeds`) have the highest mean final
  `metric`; a run that diverged scores 0; ties go to the smaller rate. Decided when all those
  runs finished.

  With `extend` = (lower, upper): a best rate at the grid's lower (upper) edge adds the
  `lower` (`upper`) rung, and the rate is decided again over the grid with that rung once its
  runs finished; a best rate at the edge of the grid as finally run is 'not bracketed'."""

  name: str
  layout: str
  rates: tuple[float, ...]
  steps: int
  seeds: tuple[int, ...]
  metric: str = 'mask_accuracy'
  extend: Optional[tuple[float, float]] = None
  tag: str = ''

  def _grid_arms(self, rates: Sequence[float]) -> list[Arm]:
    return [Arm(self.layout, r, self.steps, self.seeds, self.tag) for r in rates]

  def _means(self, plan: 'Plan', results: Results, rates: Sequence[float]) -> Optional[list]:
    means = []
    for rate in rates:
      runs = [results.get(plan.run_name(self.layout, rate, self.steps, s, self.tag)) for s in self.seeds]
      if any(r is None for r in runs):
        return None
      means.append(float(np.mean([final_metric(r, self.metric, 0.0) for r in runs])))
    return means

  def _best(self, rates: Sequence[float], means: Sequence[float]) -> float:
    best = max(means)
    return min(rate for rate, mean in zip(rates, means) if mean == best)

  def grid(self, plan: 'Plan', results: Results) -> tuple[float, ...]:
    """The rates this rule runs: `rates`, plus the extension rung once the grid asks it."""
    rates = tuple(sorted(self.rates))
    if self.extend is None:
      return tuple(self.rates)
    means = self._means(plan, results, rates)
    if means is None:
      return rates
    best = self._best(rates, means)
    if best == rates[0]:
      return (self.extend[0],) + rates
    if best == rates[-1]:
      return rates + (self.extend[1],)
    return rates

  def needs(self, plan: 'Plan', results: Results) -> list[Arm]:
    return self._grid_arms(self.grid(plan, results))

  def decide(self, plan: 'Plan', results: Results) -> Optional[float]:
    rates = self.grid(plan, results)
    means = self._means(plan, results, rates)
    return None if means is None else self._best(rates, means)

  def describe(self, plan: 'Plan', results: Results) -> dict:
    rates = self.grid(plan, results)
    per_rate = {}
    for rate in sorted(rates):
      names = [plan.run_name(self.layout, rate, self.steps, s, self.tag) for s in self.seeds]
      per_rate[f'{rate:g}'] = [
        final_metric(results[n], self.metric) if n in results else None for n in names
      ]
    value = self.decide(plan, results)
    edges = (min(rates), max(rates))
    return {
      'layout': self.layout,
      'steps': self.steps,
      'seeds': list(self.seeds),
      'metric': self.metric,
      'per_rate': per_rate,
      'value': value,
      'bracketed': None if value is None else value not in edges,
      'extended': len(rates) > len(self.rates),
    }


@dataclasses.dataclass(frozen=True)
class Scaled(Rule):
  """Another rule's rate times `factor` (e.g. 2 r*)."""

  name: str
  of: str
  factor: float

  def needs(self, plan: 'Plan', results: Results) -> list[Arm]:
    return []

  def decide(self, plan: 'Plan', results: Results) -> Optional[float]:
    base = plan.rule(self.of).decide(plan, results)
    return None if base is None else self.factor * base


@dataclasses.dataclass(frozen=True)
class Comparison:
  """a - b in `metric`, paired by seed over `seeds`; `expected` is the sign the paper
  predicts. `family` '' is a primary comparison (its own 5% level); comparisons sharing a
  family name are Holm-adjusted together."""

  key: str
  label: str
  a: Side
  b: Side
  seeds: tuple[int, ...]
  metric: str = 'mask_accuracy'
  expected: int = +1
  family: str = ''
  when: str = ''  # a rule's name: tested once that rule decided True


@dataclasses.dataclass(frozen=True)
class Plan:
  """A study: its recipe (`scale`), rules, arms and comparisons (module docstring)."""

  name: str
  title: str
  scale: Scale
  arms: tuple[Arm, ...]
  rules: tuple[Rule, ...] = ()
  comparisons: tuple[Comparison, ...] = ()
  # The run names: a format of {tag}, {steps}, {rate} (a float), {layout} and {seed}.
  name_format: str = '{tag}b{steps}-lr{rate:g}-{layout}-s{seed}'
  store: str = ''  # the folder of runs/<name>.json; '' = the report's folder
  out: str = ''  # the report's folder (results.md, results.json, plots)
  workdirs: str = ''  # checkpoints and TensorBoard files, one folder per run
  alpha: float = 0.05
  # Long runs keep a checkpoint at least this often (steps): a fault loses little.
  checkpoint_every_steps: int = 600

  def rule(self, name: str) -> Rule:
    for rule in self.rules:
      if rule.name == name:
        return rule
    raise KeyError(f'{self.name}: no rule named {name!r}')

  def run_name(self, layout: str, rate: float, steps: int, seed: int, tag: str = '') -> str:
    return self.name_format.format(tag=tag, steps=steps, rate=rate, layout=layout, seed=seed)

  def rate(self, rate: Rate, results: Results) -> Optional[float]:
    """A number as it is; a rule's name as that rule's value (None while undecided)."""
    return self.rule(rate).decide(self, results) if isinstance(rate, str) else float(rate)

  def active(self, when: str, results: Results) -> bool:
    return not when or self.rule(when).decide(self, results) is True

  def side_runs(self, side: Side, seeds: Sequence[int], results: Results) -> dict[int, str]:
    """The run name of each seed of `side` (empty while its rate is undecided)."""
    rate = self.rate(side.rate, results)
    if rate is None:
      return {}
    return {s: self.run_name(side.layout, rate, side.steps, s, side.tag) for s in seeds}

  def run(self, arm: Arm, rate: float, seed: int) -> runs_lib.Run:
    params = dict(steps=arm.steps, learning_rate=rate, layout=arm.layout, seed=seed)
    if arm.model:
      params['model'] = dict(arm.model)
    name = self.run_name(arm.layout, rate, arm.steps, seed, arm.tag)
    return runs_lib.Run(name, params, cost=arm.steps)

  def runs(self, results: Results) -> list[runs_lib.Run]:
    """Every run the results so far define, in priority order (module docstring)."""
    needed = [rule.needs(self, results) for rule in self.rules]
    # The rules' grids side by side (the first rate of each, then the second, ...), then the
    # arms; consecutive arms with the same seeds form one group, trained seed by seed.
    rounds = [
      [arms[i] for arms in needed if i < len(arms)] for i in range(max(map(len, needed), default=0))
    ]
    groups: list[list[Arm]] = rounds[:]
    for arm in self.arms:
      if groups and len(groups) > len(rounds) and groups[-1][0].seeds == arm.seeds:
        groups[-1].append(arm)
      else:
        groups.append([arm])
    runs: dict[str, runs_lib.Run] = {}
    for group in groups:
      planned = [(arm, self.rate(arm.rate, results)) for arm in group]
      planned = [(a, r) for a, r in planned if r is not None and self.active(a.when, results)]
      seeds = sorted({s for arm, _ in planned for s in arm.seeds})
      for seed in seeds:
        for arm, rate in planned:
          if seed in arm.seeds:
            run = self.run(arm, rate, seed)
            runs.setdefault(run.name, run)
    return list(runs.values())


def default_train(plan: Plan, run: runs_lib.Run, workdir: str, data_dir: str, report) -> dict:
  """Trains and scores one run of `plan` (study.train_run, study.score_workdir)."""
  from studies import study  # pylint: disable=import-outside-toplevel

  p = run.params
  config = study.mlm_config(
    plan.scale,
    seed=p['seed'],
    learning_rate=p['learning_rate'],
    data_dir=data_dir,
    steps=p['steps'],
    # Fully unrolled layer scan: ~25% faster steps for the deep, narrow models studied on CPU.
    model=dict(LAYOUTS[p['layout']], scan_unroll=plan.scale.layers, **p.get('model', {})),
  )
  config.train.checkpoint_every_steps = min(
    config.train.checkpoint_every_steps, plan.checkpoint_every_steps
  )
  result = study.train_run(config, workdir, report, progress_share=0.95)
  result['params'] = dict(p)
  if result['diverged_at_step'] is None:
    report(0.95, 'scoring per sequence')
    result['scored'] = study.score_workdir(workdir)
  return result


Train = Callable[[Plan, runs_lib.Run, str, str, Any], dict]

"""A study as a declared plan: arms of seeded runs, the rules that decide later arms from
earlier results, and the comparisons with their verdict rule, all data that one runner
(`python -m experiments.study --plan=NAME`: studies/runner.py) trains, resumes and reports.

    PLANS = {'cpu': Plan(name=..., title=..., scale=Scale(...), rules=(BestRate(...),),
                         arms=(Arm(...), ...), comparisons=(Comparison(...), ...), out=...)}

(a whole plan file: docs/experiments.md, "Declaring a study"; the studies: studies/plans/).

A rate is a number or the name of a rule; a rule decides a value (a rate, a flag) from
finished runs, and an arm, rule or comparison that needs an undecided rule waits for it. The
runs are listed in priority order: the rules' own runs first (their grids side by side), then
the arms' groups (a tuple of arms goes seed by seed, so a process per seed pattern,
`--runs='*-s[02]'`, finishes pairs together). A run is a file by name in one store
(`<store>/runs/<name>.json`), shared by every arm, rule, comparison and study that names it.

The verdict rule (studies/analysis.py, the same for every plan): a comparison whose runs are
not all finished is "pending (k of n seeds)"; "not testable at this scale" when no run on
either side learned (study.learned); else "holds" / "does not hold" when its p-value (Holm-
adjusted within its family; a primary comparison, family '', alone) is below `alpha` with the
expected / the opposite sign, else "inconclusive". In a family, a member whose condition is
undecided or that has no result yet counts p = 1 (a later p can only lower the others').
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from realformer_jax.studies import runs as runs_lib
from realformer_jax.studies.scale import Scale

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

# The trainers a plan can name (Plan.trainer): the 'module:function' that trains and scores one
# run, train(plan, run, workdir, data_dir, report) -> its result; imported only when a run
# trains, so that a plan imports no JAX.
TRAINERS = {
  # Masked-LM pretraining of a layout (LAYOUTS), scored per sequence on the held-out split.
  'masked_lm': 'realformer_jax.studies.plan:default_train',
  # Masked-LM pretraining of a variant (Arm.model), then scored at every Plan.options['lengths'].
  'at_lengths': 'realformer_jax.studies.lengths:train',
  # Masked-LM pretraining of a variant, then probed: attention to neighbours, the position table.
  'position_probe': 'realformer_jax.studies.position_probe:train',
  # Fine-tuning bible_sections from a run of another plan (Plan.options['pretraining']) or from
  # that run's architecture randomly initialised.
  'finetune': 'realformer_jax.studies.finetune_compare:train',
  # A deep, narrow encoder of a variant measured at init, trained a few hundred AdamW steps,
  # measured again: per-layer gradient norms, DS-Init ratios, token cosines (no checkpoints).
  'grad_norms': 'realformer_jax.studies.grad_norms:train',
  # The grad_norms model under one change, measured at init only (no training, no checkpoints).
  'init_sweep': 'realformer_jax.studies.init_sweep:train',
  # Attention entropy and adjacent-layer JSD of a finished run of another plan
  # (Plan.options['pretraining']) on its held-out split: nothing is trained.
  'attention': 'realformer_jax.studies.attention_analysis:train',
}


@dataclasses.dataclass(frozen=True)
class Report:
  """What a plan's report reads and draws: `module` has analyse(plan, results) -> analysis
  and write(plan, results, analysis, command) (results.md, results.json and the plots)."""

  module: str
  metrics: tuple[str, ...]  # what it can report (Plan.metrics: those it does)
  plots: tuple[str, ...]  # what it can draw (Plan.plots: those it does)


# The reports a plan can name (Plan.report).
REPORTS = {
  # Arms, rules and paired comparisons with verdicts (studies/analysis.py, plan_report.py).
  'comparisons': Report(
    'realformer_jax.studies.plan_report', tuple(METRICS), ('rates', 'curves', 'comparisons')
  ),
  # Accuracy and attention entropy at every evaluation length, comparisons at each.
  'lengths': Report(
    'realformer_jax.studies.lengths',
    ('mask_accuracy', 'accuracy', 'attention_entropy'),
    ('accuracy_vs_length',),
  ),
  # One row per variant: accuracy beside the floors, attention locality, the position table.
  'position_probe': Report(
    'realformer_jax.studies.position_probe',
    ('mask_accuracy', 'accuracy', 'loss', 'neighbour_attention', 'table_cosine'),
    ('curves',),
  ),
  # Test accuracy and Matthews correlation per starting point, paired differences with verdicts.
  'finetune': Report(
    'realformer_jax.studies.finetune_compare', ('accuracy', 'matthews_corrcoef'), ('test_accuracy',)
  ),
  # Per-layer gradient norms of every variant at init and trained, side by side.
  'grad_norms': Report(
    'realformer_jax.studies.grad_norms',
    ('grad_norms', 'input_grad_norms', 'beta', 'token_cosine', 'loss'),
    ('grad_norms',),
  ),
  # One row per setting: first/last gradient ratios and token cosines at init.
  'init_sweep': Report('realformer_jax.studies.init_sweep', ('grad_norms', 'token_cosine'), ()),
  # Entropy and JSD per layer, paired differences, the comparisons with Holm and verdicts.
  'attention': Report(
    'realformer_jax.studies.attention_analysis',
    ('top_entropy', 'top_entropy_std', 'middle_jsd'),
    ('entropy', 'jsd'),
  ),
}


def resolve(reference: str):
  """The function a 'module:function' names (imported now)."""
  import importlib  # pylint: disable=import-outside-toplevel

  module, _, function = reference.partition(':')
  return getattr(importlib.import_module(module), function)


@dataclasses.dataclass(frozen=True)
class Side:
  """One arm of a comparison, without its seeds."""

  variant: str  # the plan's VARIANTS key (for the masked-LM trainer, a layout: LAYOUTS)
  rate: Rate
  steps: int
  tag: str = ''  # a prefix of the run names that sets arms of one variant apart


@dataclasses.dataclass(frozen=True)
class Arm:
  """Runs of one variant, rate and budget, one per seed."""

  variant: str
  rate: Rate
  steps: int
  seeds: tuple[int, ...]
  tag: str = ''
  when: str = ''  # a condition rule's name: the arm is planned once it decided True
  model: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # more model fields

  @property
  def side(self) -> Side:
    return Side(self.variant, self.rate, self.steps, self.tag)


def final_metric(run: Optional[Mapping], metric: str, default: float = math.nan) -> float:
  """A run's final eval value of `metric` ('mask_accuracy', 'accuracy' (all selected
  positions), 'loss', 'kept_accuracy', 'random_accuracy'); `default` without a final
  evaluation (a run that diverged)."""
  if not run or not run.get('final'):
    return default
  key = 'mlm_accuracy' if metric == 'accuracy' else metric
  return float(run['final'].get(key, default))


class Rule:
  """Decides a value from finished runs: `needs` lists the arms it reads (planned before any
  arm that names the rule), `decide` returns None until it can decide, `describe` is what
  the report shows of it (JSON-ready)."""

  name: str

  def needs(self, plan: 'Plan', results: Results) -> list[Arm]:
    return []

  def decide(self, plan: 'Plan', results: Results) -> Any:
    raise NotImplementedError

  def describe(self, plan: 'Plan', results: Results) -> dict:
    return {'value': self.decide(plan, results)}


@dataclasses.dataclass(frozen=True)
class BestRate(Rule):
  """The rate of `rates` whose runs (`variant`, `steps`, `seeds`) have the highest mean final
  `metric` (a run that diverged scores 0; ties: the smaller rate), decided when all of them
  finished. With `extend` = (lower, upper), a best rate at the grid's lower (upper) edge adds
  that rung, and the rate is chosen again over the grid with it once its runs finished; a
  best rate at an edge of the grid as run is reported 'not bracketed'."""

  name: str
  variant: str
  rates: tuple[float, ...]
  steps: int
  seeds: tuple[int, ...]
  metric: str = 'mask_accuracy'
  extend: Optional[tuple[float, float]] = None
  tag: str = ''
  model: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # as Arm.model

  def _means(self, plan: 'Plan', results: Results, rates) -> Optional[list[float]]:
    means = []
    for rate in rates:
      names = [plan.run_name(self.variant, rate, self.steps, s, self.tag) for s in self.seeds]
      if any(n not in results for n in names):
        return None
      means.append(float(np.mean([final_metric(results[n], self.metric, 0.0) for n in names])))
    return means

  @staticmethod
  def _best(rates, means) -> float:
    best = max(means)
    return min(rate for rate, mean in zip(rates, means) if mean == best)

  def grid(self, plan: 'Plan', results: Results) -> tuple[float, ...]:
    """The rates this rule runs: `rates` (in their declared order, the order they are
    trained in), and the extension rung once the grid asks for it."""
    if self.extend is None:
      return self.rates
    means = self._means(plan, results, self.rates)
    if means is None:
      return self.rates
    best = self._best(self.rates, means)
    if best == min(self.rates):
      return self.rates + (self.extend[0],)
    if best == max(self.rates):
      return self.rates + (self.extend[1],)
    return self.rates

  def needs(self, plan: 'Plan', results: Results) -> list[Arm]:
    grid = self.grid(plan, results)
    return [Arm(self.variant, r, self.steps, self.seeds, self.tag, model=self.model) for r in grid]

  def decide(self, plan: 'Plan', results: Results) -> Optional[float]:
    grid = self.grid(plan, results)
    means = self._means(plan, results, grid)
    return None if means is None else self._best(grid, means)

  def describe(self, plan: 'Plan', results: Results) -> dict:
    grid = sorted(self.grid(plan, results))
    per_rate, learned = {}, {}
    for rate in grid:
      names = [plan.run_name(self.variant, rate, self.steps, s, self.tag) for s in self.seeds]
      per_rate[f'{rate:g}'] = [
        final_metric(results[n], self.metric) if n in results else None for n in names
      ]
      learned[f'{rate:g}'] = [bool(results[n].get('learned')) for n in names if n in results]
    value = self.decide(plan, results)
    complete = value is not None
    trainable = [float(r) for r, flags in learned.items() if flags and all(flags)]
    return {
      'kind': 'best_rate',
      'layout': self.variant,  # the reports' key since before variants
      'steps': self.steps,
      'seeds': list(self.seeds),
      'metric': self.metric,
      'per_rate': per_rate,
      'learned': learned,
      'value': value,
      'bracketed': None if value is None else value not in (grid[0], grid[-1]),
      'extended': len(grid) > len(self.rates),
      'largest_trainable_rate': max(trainable) if complete and trainable else None,
    }


@dataclasses.dataclass(frozen=True)
class Scaled(Rule):
  """Another rule's rate times `factor` (e.g. 2 r*)."""

  name: str
  of: str
  factor: float

  def decide(self, plan: 'Plan', results: Results) -> Optional[float]:
    base = plan.rule(self.of).decide(plan, results)
    return None if base is None else self.factor * base


@dataclasses.dataclass(frozen=True)
class Gain(Rule):
  """A condition: the mean final `metric` over `variants` x `seeds` at the rate `rate` gains at
  least `threshold` from `steps[0]` to `steps[1]` (the learning curve has not flattened).
  Decided when all those runs finished; `describe` also gives the gain of the runs finished
  so far, and what `after` (a later doubling, e.g. (2400, 4800)) gained, descriptively."""

  name: str
  rate: Rate
  steps: tuple[int, int]
  variants: tuple[str, ...]
  seeds: tuple[int, ...]
  threshold: float
  metric: str = 'mask_accuracy'
  after: Optional[tuple[int, int]] = None

  def _gain(self, plan, results, rate, between, partial=False) -> Optional[float]:
    means = []
    for steps in between:
      names = [plan.run_name(v, rate, steps, s) for v in self.variants for s in self.seeds]
      if any(n not in results for n in names) and not partial:
        return None
      runs = [results[n] for n in names if n in results]
      if not runs:
        return None
      means.append(float(np.mean([final_metric(r, self.metric, 0.0) for r in runs])))
    return means[1] - means[0]

  def decide(self, plan: 'Plan', results: Results) -> Optional[bool]:
    rate = plan.rate(self.rate, results)
    gain = None if rate is None else self._gain(plan, results, rate, self.steps)
    return None if gain is None else gain >= self.threshold

  def describe(self, plan: 'Plan', results: Results) -> dict:
    rate = plan.rate(self.rate, results)
    out = {'kind': 'gain', 'value': self.decide(plan, results), 'threshold': self.threshold}
    out.update(steps=list(self.steps), metric=self.metric)
    if rate is None:
      return out
    names = [
      plan.run_name(v, rate, b, s) for b in self.steps for v in self.variants for s in self.seeds
    ]
    out['finished_runs'] = sum(n in results for n in names)
    out['planned_runs'] = len(names)
    out['gain'] = self._gain(plan, results, rate, self.steps, partial=True)
    if self.after and out['value']:
      out['after'] = list(self.after)
      out['gain_after'] = self._gain(plan, results, rate, self.after, partial=True)
      out['after_complete'] = self._gain(plan, results, rate, self.after) is not None
    return out


@dataclasses.dataclass(frozen=True)
class AllLearned(Rule):
  """A condition: every run of `arms` learned (study.learned, and did not diverge by the
  plan's outcome rules); decided when all of them finished."""

  name: str
  arms: tuple[Arm, ...]

  def decide(self, plan: 'Plan', results: Results) -> Optional[bool]:
    names = [
      plan.run_name(a.variant, plan.rate(a.rate, results), a.steps, s, a.tag)
      for a in self.arms
      for s in a.seeds
    ]
    if any(n not in results for n in names):
      return None
    return all(plan.outcome(results[n])['learned'] for n in names)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """a - b, paired by seed over `seeds`, in `metric`; `expected` is the sign the paper
  predicts (+1: a ahead). `test` 'paired' tests the difference of `metric` (seeds and the
  eval set's sampling: stats.paired_ratio_comparison); 'failures' tests the fraction of runs
  that failed (diverged or did not learn: Plan.outcome) with Boschloo's exact test, where
  the paper's sign means b fails more. `family` '' is a primary comparison at its own level;
  comparisons of one family are Holm-adjusted together."""

  key: str
  label: str
  a: Side
  b: Side
  seeds: tuple[int, ...]
  metric: str = 'mask_accuracy'
  expected: int = +1
  family: str = ''
  when: str = ''  # a condition rule's name: a member once it decided True
  test: str = 'paired'
  # A trend: (a2, b2) whose difference is subtracted, so the test is (a - b) - (a2 - b2), paired
  # by seed (e.g. a gap at 24 layers minus the gap at 6). All four sides share the eval set.
  minus: Optional[tuple[Side, Side]] = None

  @property
  def sides(self) -> tuple[Side, ...]:
    """Every side the comparison reads: a, b, then minus's."""
    return (self.a, self.b) + (self.minus or ())


# The family of the all-position twins added on 2026-11-28 to plans declared earlier (issue 58:
# every study reports both metrics); added after their runs, so apart from the declared ones.
ADDED_ALL_POSITIONS = 'all positions, added after the runs'


def all_positions_twins(
  comparisons: Sequence[Comparison], keys: Sequence[str], family: str = ADDED_ALL_POSITIONS
) -> tuple[Comparison, ...]:
  """The comparisons named `keys` again on all selected positions (the paper's metric), in
  their own Holm `family`: a study declared on [MASK] accuracy alone reports both metrics
  without touching its declared verdicts."""
  return tuple(
    dataclasses.replace(
      c, key=f'{c.key}-all', label=f'{c.label}, all positions', metric='accuracy', family=family
    )
    for c in comparisons
    if c.key in keys
  )


@dataclasses.dataclass(frozen=True)
class Plan:
  """A study: its recipe (`scale`), rules, arms and comparisons (module docstring)."""

  name: str
  title: str
  scale: Scale
  # In priority order; a tuple of arms is one group, trained seed by seed (both layouts of
  # seed 0, then of seed 1, ...), a lone arm seed after seed.
  arms: tuple[Union[Arm, tuple[Arm, ...]], ...]
  rules: tuple[Rule, ...] = ()
  comparisons: tuple[Comparison, ...] = ()
  # The run names: a format of {tag}, {steps}, {rate} (a float), {variant} (or {layout}, as the
  # masked-LM plans name it) and {seed}.
  name_format: str = '{tag}b{steps}-lr{rate:g}-{layout}-s{seed}'
  store: str = ''  # the folder of runs/<name>.json; '' = the report's folder
  out: str = ''  # the report's folder (results.md, results.json, plots)
  workdirs: str = ''  # checkpoints and TensorBoard files, one folder per run
  alpha: float = 0.05
  # A run whose last training loss or final eval loss ends this many nats above ln(vocab)
  # (a uniform guess, where every run starts) blew up: it diverged though finite.
  blowup_margin: float = 1.0
  # Effects whose power the report states for every paired comparison in `effects_metric`
  # (name: difference); the paper's masked-LM gains count every selected position.
  effects: Mapping[str, float] = dataclasses.field(default_factory=dict)
  effects_metric: str = 'accuracy'
  # Verdicts over the comparisons' verdicts (e.g. a claim tested at several rates):
  # conclude(analysis) -> {key: verdict}.
  conclude: Optional[Callable[[dict], dict]] = None
  # Long runs keep a checkpoint at least this often (steps): a fault loses little.
  checkpoint_every_steps: int = 600
  # The command that regenerates the report, for the report's first line.
  command: str = ''
  # What trains a run (TRAINERS), what reports the runs (REPORTS), the metrics it reports
  # (default: all the report's) and the plots it draws (default: all).
  trainer: str = 'masked_lm'
  report: str = 'comparisons'
  metrics: tuple[str, ...] = ()
  plots: tuple[str, ...] = ()
  # What the trainer and the report read besides the scale (e.g. the evaluation lengths).
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.trainer not in TRAINERS:
      raise ValueError(
        f'plan {self.name}: trainer {self.trainer!r} (trainers: {", ".join(TRAINERS)})'
      )
    if self.report not in REPORTS:
      raise ValueError(f'plan {self.name}: report {self.report!r} (reports: {", ".join(REPORTS)})')
    report = REPORTS[self.report]
    for field, known in (('metrics', report.metrics), ('plots', report.plots)):
      unknown = sorted(set(getattr(self, field)) - set(known))
      if unknown:
        raise ValueError(
          f'plan {self.name}: {field} {unknown}: the {self.report} report has {", ".join(known)}'
        )
      if not getattr(self, field):
        object.__setattr__(self, field, known)
    for c in self.comparisons:
      if c.metric not in self.metrics:
        raise ValueError(f'plan {self.name}: comparison {c.key}: metric {c.metric!r} not reported')

  @property
  def variant_key(self) -> str:
    """A run's parameter naming its variant: 'layout' for the masked-LM trainer, as its runs
    (docs/results/**/runs/*.json) stored it before plans had other variants."""
    return 'layout' if self.trainer == 'masked_lm' else 'variant'

  def rule(self, name: str) -> Rule:
    for rule in self.rules:
      if rule.name == name:
        return rule
    raise KeyError(f'{self.name}: no rule named {name!r}')

  def run_name(self, variant: str, rate: float, steps: int, seed: int, tag: str = '') -> str:
    return self.name_format.format(
      tag=tag, steps=steps, rate=rate, variant=variant, layout=variant, seed=seed
    )

  def rate(self, rate: Rate, results: Results) -> Optional[float]:
    """A number as it is; a rule's name as that rule's value (None while undecided)."""
    return self.rule(rate).decide(self, results) if isinstance(rate, str) else float(rate)

  def condition(self, when: str, results: Results) -> Optional[bool]:
    """True without a condition; else the rule's decision (None: undecided)."""
    return True if not when else self.rule(when).decide(self, results)

  def side_runs(self, side: Side, seeds: Sequence[int], results: Results) -> dict[int, str]:
    """The run name of each seed of `side` ({} while its rate is undecided)."""
    rate = self.rate(side.rate, results)
    if rate is None:
      return {}
    return {s: self.run_name(side.variant, rate, side.steps, s, side.tag) for s in seeds}

  def run(self, arm: Arm, rate: float, seed: int) -> runs_lib.Run:
    params = {'steps': arm.steps, 'learning_rate': rate, self.variant_key: arm.variant}
    params['seed'] = seed
    if arm.model:
      params['model'] = dict(arm.model)
    name = self.run_name(arm.variant, rate, arm.steps, seed, arm.tag)
    # A step's cost grows with the layer count (the depth study's 24-layer runs take about
    # twice the 12-layer ones): the grid ETA weighs the runs left by it. A run of no steps
    # (an analysis of a trained model) costs one, or its grid would never have an ETA.
    layers = arm.model.get('num_layers', self.scale.layers) / self.scale.layers
    return runs_lib.Run(name, params, cost=max(arm.steps, 1) * layers)

  def arm_groups(self) -> list[tuple[Arm, ...]]:
    """The arms in priority order, each group (a tuple in `arms`) trained seed by seed."""
    return [group if isinstance(group, tuple) else (group,) for group in self.arms]

  def all_arms(self) -> list[Arm]:
    return [arm for group in self.arm_groups() for arm in group]

  def runs(self, results: Results) -> list[runs_lib.Run]:
    """Every run the results so far define, in priority order (module docstring)."""
    needed = [rule.needs(self, results) for rule in self.rules]
    # The rules' grids side by side (the first rate of each, then the second, ...), then the
    # arms' groups; a group goes seed by seed.
    rounds = [
      tuple(arms[i] for arms in needed if i < len(arms))
      for i in range(max(map(len, needed), default=0))
    ]
    runs: dict[str, runs_lib.Run] = {}
    for group in rounds + self.arm_groups():
      planned = [(arm, self.rate(arm.rate, results)) for arm in group]
      planned = [(a, r) for a, r in planned if r is not None and self.condition(a.when, results)]
      for seed in sorted({s for arm, _ in planned for s in arm.seeds}):
        for arm, rate in planned:
          if seed in arm.seeds:
            run = self.run(arm, rate, seed)
            runs.setdefault(run.name, run)
    return list(runs.values())

  def outcome(self, run: Mapping) -> dict:
    """The rules per run: diverged (a non-finite value ended it, or it ended above the
    blow-up line), spiked (a logged training loss above the line, not at the end), learned
    (study.learned, not diverged), failed (diverged or not learned)."""
    from realformer_jax.studies import study  # pylint: disable=import-outside-toplevel

    line = math.log(self.scale.vocab) + self.blowup_margin
    losses = [v for _, v in run.get('train_loss') or []]
    final = run.get('final') or {}
    ends = [x for x in (losses[-1] if losses else None, final.get('loss')) if x is not None]
    non_finite = run.get('diverged_at_step') is not None
    blew_up = any(not math.isfinite(x) or x > line for x in ends)
    diverged = non_finite or blew_up
    learned = bool(study.learned(run)) and not diverged
    return {
      'diverged': diverged,
      'non_finite_at_step': run.get('diverged_at_step'),
      'blew_up': blew_up and not non_finite,
      'spiked': any(math.isfinite(x) and x > line for x in losses) and not blew_up,
      'learned': learned,
      'failed': diverged or not learned,
      'step1_loss': losses[0] if losses else math.nan,
    }


def default_train(plan: Plan, run: runs_lib.Run, workdir: str, data_dir: str, report) -> dict:
  """Trains and scores one run of `plan` (study.train_run, study.score_workdir)."""
  from realformer_jax.studies import study  # pylint: disable=import-outside-toplevel

  p = run.params
  config = study.mlm_config(
    plan.scale,
    seed=p['seed'],
    learning_rate=p['learning_rate'],
    data_dir=data_dir,
    steps=p['steps'],
    # Fully unrolled layer scan: ~25% faster steps for the deep, narrow models studied on CPU.
    model={
      **LAYOUTS[p['layout']],
      'scan_unroll': p.get('model', {}).get('num_layers', plan.scale.layers),
      **p.get('model', {}),
    },
  )
  config.train.checkpoint_every_steps = min(
    config.train.checkpoint_every_steps, plan.checkpoint_every_steps
  )
  result = study.train_run(config, workdir, report, progress_share=0.95)
  result['params'] = dict(p)
  if result['diverged_at_step'] is None:
    report(0.95, 'scoring per sequence')
    result['scored'] = study.score_workdir(workdir, mask_draws=plan.scale.eval_mask_draws)
  return result


Train = Callable[[Plan, runs_lib.Run, str, str, Any], dict]

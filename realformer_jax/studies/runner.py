"""The one runner of declared plans (studies/plan.py): train what a plan lists, resumably and
with a progress line and ETA, and report it.

    plan = load_plan('tuned_rates', 'cpu')
    results = train(plan, runs='*-s[02]')       # one process's share; resumes
    analysis = report(plan, results, command)   # results.md, results.json, plots in plan.out
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Optional

from realformer_jax.studies import plan as plan_lib
from realformer_jax.studies import runs as runs_lib

# Loading a plan imports no JAX (a mistyped --plan is one line in a fraction of a second): what
# trains, scores and plots (study, plan_report, train's workdir_lock) is imported where used.


def load_module(name_or_path: str):
  """A plan file: a name in studies/plans/ or the path of a .py file anywhere."""
  if name_or_path.endswith('.py') or os.sep in name_or_path:
    path = os.path.abspath(name_or_path)
    if not os.path.isfile(path):
      raise FileNotFoundError(f'--plan: no file {name_or_path}')
    spec = importlib.util.spec_from_file_location(f'plan_{os.path.basename(path)[:-3]}', path)
    module = importlib.util.module_from_spec(spec)
    try:
      spec.loader.exec_module(module)
    except SyntaxError as error:
      raise ValueError(
        f'--plan: {name_or_path} line {error.lineno}: {error.msg} (a syntax error)'
      ) from None
    return module
  try:
    return importlib.import_module(f'realformer_jax.studies.plans.{name_or_path}')
  except ModuleNotFoundError as error:
    if error.name != f'realformer_jax.studies.plans.{name_or_path}':
      raise
    known = sorted(
      f[:-3]
      for f in os.listdir(os.path.join(os.path.dirname(__file__), 'plans'))
      if f.endswith('.py') and not f.startswith('_')
    )
    raise ValueError(f'--plan: no plan {name_or_path!r} (plans: {", ".join(known)})') from None


def load_plan(name_or_path: str, scale: str = 'cpu') -> plan_lib.Plan:
  module = load_module(name_or_path)
  plans = getattr(module, 'PLANS', None)
  if not plans:
    raise ValueError(f'--plan: {name_or_path} defines no PLANS')
  if scale not in plans:
    raise ValueError(f'--scale: {name_or_path} has no {scale!r} scale (it has {", ".join(plans)})')
  return plans[scale]


def train(
  plan: plan_lib.Plan,
  *,
  runs: str = '*',
  store: Optional[str] = None,
  workdirs: Optional[str] = None,
  data_dir: str = '',
  train_one: Optional[plan_lib.Train] = None,
) -> dict[str, dict]:
  """Trains, one by one, the unfinished runs of `plan` that `runs` (comma-separated globs)
  selects, re-planning after each, with `train_one` (default: the plan's trainer); a run
  another process trains (its workdir is locked) is left to it. Returns every finished
  result of the plan."""
  from realformer_jax.studies import study  # pylint: disable=import-outside-toplevel
  from realformer_jax.train import workdir_lock  # pylint: disable=import-outside-toplevel

  store = store or plan.store or plan.out
  workdirs = workdirs or plan.workdirs
  os.makedirs(store, exist_ok=True)
  train_one = train_one or plan_lib.resolve(plan_lib.TRAINERS[plan.trainer])
  return runs_lib.run_planned(
    store,
    plan.runs,
    lambda run, report: train_one(plan, run, os.path.join(workdirs, run.name), data_dir, report),
    select=lambda every: study.selected(every, runs),
    busy=lambda run: workdir_lock.held(os.path.join(workdirs, run.name)),
  )


# What `--runs` takes for "train nothing, report only": no run is named so.
REPORT_ONLY = 'none'
_NAMES_SHOWN = 12


def check_selection(plan: plan_lib.Plan, runs: str, store: str) -> None:
  """ValueError (one line naming the plan's runs) for a `runs` that selects none of the runs
  the plan lists now: a mistyped glob would otherwise train nothing and say nothing."""
  if runs == REPORT_ONLY:
    return
  from realformer_jax.studies import study  # pylint: disable=import-outside-toplevel

  listed = [run.name for run in plan.runs(runs_lib.all_results(store))]
  if study.selected([runs_lib.Run(name, {}) for name in listed], runs):
    return
  shown = ', '.join(listed[:_NAMES_SHOWN]) + (
    f', ... ({len(listed)} in all)' if len(listed) > _NAMES_SHOWN else ''
  )
  raise ValueError(
    f'--runs={runs}: selects none of the runs plan {plan.name} lists now ({shown}); '
    f'--runs={REPORT_ONLY} reports without training'
  )


def analyse(plan: plan_lib.Plan, results: dict[str, dict]) -> dict:
  """The analysis of the plan's finished runs by its report (plan.report)."""
  module = importlib.import_module(plan_lib.REPORTS[plan.report].module)
  return module.analyse(plan, results)


def report(plan: plan_lib.Plan, results: dict[str, dict], command: str) -> dict:
  """Analyses the plan's finished runs and writes its report into plan.out."""
  module = importlib.import_module(plan_lib.REPORTS[plan.report].module)
  analysis = module.analyse(plan, results)
  module.write(plan, results, analysis, command)
  return analysis

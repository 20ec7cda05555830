"""Finished pretraining runs that other plans start from or analyse (their
Plan.options['pretraining']: the Plan whose store and workdirs hold the runs): the
finetune_compare and attention_analysis trainers find them here. The rate is
Plan.options['rate'] where a plan names one (the depth study's shared 2e-3), else the layouts
study's r*, read from its report; the tag is the analysing arm's (the depth study's 'L6-', ...).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from realformer_jax.studies.plan import Plan, Results, Rule
from realformer_jax.studies.plans import layouts as layouts_plan


def pretraining_rate(plan: Plan) -> float:
  """The pretraining runs' rate: the plan's own, else r* of the layouts study, from its report
  (one error line before it reported)."""
  if plan.options.get('rate') is not None:
    return float(plan.options['rate'])
  pretraining = plan.options['pretraining']
  star, _, _ = layouts_plan.decisions(pretraining.out)
  if star is None:
    raise SystemExit(
      f'error: no r* in {pretraining.out}/results.json: run the layouts study first '
      '(python -m experiments.study --plan=layouts)'
    )
  return star


def _locations(plan: Plan, layout: str, seed: int, tag: str, rate: float) -> tuple[str, str, str]:
  """(run name, result file, workdir) of one pretraining run."""
  pretraining = plan.options['pretraining']
  name = pretraining.run_name(layout, rate, pretraining.scale.steps, seed, tag)
  store = pretraining.store or pretraining.out
  return name, os.path.join(store, 'runs', f'{name}.json'), os.path.join(pretraining.workdirs, name)


def pretrained_run(plan: Plan, layout: str, seed: int, tag: str = '') -> tuple[str, dict]:
  """(workdir, run record) of the pretraining of `layout`, `seed` and `tag` at the plan's rate
  (one error line, before anything compiles, where it has not finished)."""
  pretraining = plan.options['pretraining']
  name, record, workdir = _locations(plan, layout, seed, tag, pretraining_rate(plan))
  if not os.path.exists(record) or not os.path.isdir(workdir):
    raise SystemExit(
      f'error: {name} is not a finished run of the {pretraining.name} study in '
      f'{os.path.dirname(record)} / {workdir}'
    )
  with open(record) as f:
    return os.path.abspath(workdir), json.load(f)


@dataclasses.dataclass(frozen=True)
class PretrainingFinished(Rule):
  """A condition: every pretraining run of `tag` that `layouts` x `seeds` name has finished (its
  result in the pretraining store); undecided (None) until then, so the arms that wait for it
  are planned once their checkpoints are final and never before. The records alone decide: a
  clone without the checkpoints still plans, and so reports, the committed analyses (analysing
  a run whose workdir is gone is pretrained_run's error line)."""

  name: str
  tag: str
  layouts: tuple[str, ...]
  seeds: tuple[int, ...]

  def _missing(self, plan: Plan) -> list[str]:
    rate = pretraining_rate(plan)
    missing = []
    for layout in self.layouts:
      for seed in self.seeds:
        name, record, _ = _locations(plan, layout, seed, self.tag, rate)
        if not os.path.exists(record):
          missing.append(name)
    return missing

  def decide(self, plan: Plan, results: Results) -> Optional[bool]:
    return True if not self._missing(plan) else None

  def describe(self, plan: Plan, results: Results) -> dict:
    missing = self._missing(plan)
    return {'kind': 'pretraining_finished', 'value': not missing or None, 'missing': missing}

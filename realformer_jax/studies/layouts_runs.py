"""The layouts study's finished runs that other plans start from or analyse (their
Plan.options['pretraining']: the layouts Plan whose report holds r* and whose store and workdirs
hold the runs): the finetune_compare and attention_analysis trainers find them here.
"""

from __future__ import annotations

import json
import os

from realformer_jax.studies.plan import Plan
from realformer_jax.studies.plans import layouts as layouts_plan


def pretraining_rate(plan: Plan) -> float:
  """r* of the pretraining plan, from its report (one error line before it reported)."""
  pretraining = plan.options['pretraining']
  star, _, _ = layouts_plan.decisions(pretraining.out)
  if star is None:
    raise SystemExit(
      f'error: no r* in {pretraining.out}/results.json: run the layouts study first '
      '(python -m experiments.study --plan=layouts)'
    )
  return star


def pretrained_run(plan: Plan, layout: str, seed: int) -> tuple[str, dict]:
  """(workdir, run record) of the pretraining of `layout` and `seed` at r* (one error line, before
  anything compiles, where it has not finished)."""
  pretraining = plan.options['pretraining']
  rate = pretraining_rate(plan)
  name = pretraining.run_name(layout, rate, pretraining.scale.steps, seed)
  store = pretraining.store or pretraining.out
  record = os.path.join(store, 'runs', f'{name}.json')
  workdir = os.path.join(pretraining.workdirs, name)
  if not os.path.exists(record) or not os.path.isdir(workdir):
    raise SystemExit(
      f'error: {name} is not a finished run of the layouts study in {store} / {workdir}'
    )
  with open(record) as f:
    return os.path.abspath(workdir), json.load(f)

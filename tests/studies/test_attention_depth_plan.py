"""The attention analysis of the depth study's models (studies/plans/attention_depth.py), with
no model: the pretraining runs it waits for are exactly the depth plan's, a depth is planned
only once all of them finished (PretrainingFinished, on a fabricated store), and its
statements stay "pending" while some seeds are not analysed."""

import dataclasses
import json
import os

import pytest

from realformer_jax.studies import attention_analysis, layouts_runs
from realformer_jax.studies.plans import attention_analysis as plans_attention
from realformer_jax.studies.plans import attention_depth, depth

PLAN = attention_depth.PLANS['cpu']


def test_each_depth_is_an_analysis_of_the_depth_plans_runs_with_its_own_family():
  assert [(a.tag, a.variant) for a in PLAN.all_arms()] == [
    (tag, layout) for tag in ('L6-', 'L12-', 'L24-') for layout in ('post', 'realformer')
  ]
  families = {c.key: c.family for c in PLAN.comparisons}
  assert families['L24-5c'] == 'L24-5' and len(set(families.values())) == 3
  depth_runs = {run.name for run in depth.PLANS['cpu'].runs({})}
  for rule in PLAN.rules:
    waited = rule.describe(PLAN, {})['missing'] + [n for n in depth_runs if n.startswith(rule.tag)]
    # Every run a depth waits for is one the depth plan trains (the L12- reruns included).
    assert set(waited) <= depth_runs and len(set(waited)) == 12
  sub = attention_analysis.of_tag(PLAN, 'L24-')
  assert sub.out == 'docs/results/compare_layouts/depth/attention/L24'
  assert [c.key for c in sub.comparisons] == ['L24-5a', 'L24-5b', 'L24-5c']
  # An analysis trains no steps; each run costs one, so its grid has an ETA after the first.
  sub = attention_analysis.of_tag(PLAN, 'L6-')
  assert [sub.run(arm, 0.0, 2).cost for arm in sub.all_arms()] == [1.0, 1.0]


def _attention_plan_on_a_store(tmp_path):
  pretraining = dataclasses.replace(
    depth.PLANS['toy'], out=str(tmp_path / 'store'), workdirs=str(tmp_path / 'runs')
  )
  return plans_attention.make(pretraining, (0, 1), rate=depth.RATE, tags=('L1-', 'L3-'))


def _finish(plan, name, workdir=True):
  pretraining = plan.options['pretraining']
  os.makedirs(os.path.join(pretraining.out, 'runs'), exist_ok=True)
  with open(os.path.join(pretraining.out, 'runs', f'{name}.json'), 'w') as f:
    json.dump({'run': name}, f)
  if workdir:
    os.makedirs(os.path.join(pretraining.workdirs, name))


def test_a_depth_is_planned_once_all_its_pretraining_runs_finished(tmp_path):
  plan = _attention_plan_on_a_store(tmp_path)
  assert plan.runs({}) == []
  shallow = [
    f'L1-b4-lr0.002-{layout}-s{seed}' for layout in ('post', 'realformer') for seed in (0, 1)
  ]
  for name in shallow[:3]:
    _finish(plan, name)
  assert plan.runs({}) == []  # 3 of 4: nothing yet
  missing = plan.rule('L1-pretraining finished').describe(plan, {})['missing']
  assert missing == ['L1-b4-lr0.002-realformer-s1']
  _finish(plan, shallow[3], workdir=False)  # a clone: the records, not the checkpoints
  assert [run.name for run in plan.runs({})] == [
    'L1-post-s0',
    'L1-realformer-s0',
    'L1-post-s1',
    'L1-realformer-s1',
  ]
  # Analysing a run whose checkpoints are not here is one error line naming it.
  with pytest.raises(SystemExit, match=r'^error: L1-b4-lr0.002-realformer-s1 is not a finished'):
    layouts_runs.pretrained_run(plan, 'realformer', 1, 'L1-')


def _model(entropy: list[float], jsd: list[float]) -> dict:
  return {
    'pretraining': {'run': 'x', 'rate': 0.002, 'learned': True, 'diverged_at_step': None},
    'workdir': 'x',
    'tokens': 10,
    'heads': 2,
    'length': 64,
    'entropy_mean': entropy,
    'entropy_std': [0.5] * len(entropy),
    'entropy_head_std': [0.1] * len(entropy),
    'jsd_mean': jsd,
  }


def test_statements_are_pending_until_every_seed_is_analysed(tmp_path):
  plan = _attention_plan_on_a_store(tmp_path)
  results = {
    'L3-post-s0': _model([3.0, 2.0, 1.5], [0.2, 0.3]),
    'L3-realformer-s0': _model([3.0, 2.0, 1.0], [0.1, 0.2]),
  }
  analysis = attention_analysis.analyse(plan, results)
  assert {row['verdict'] for row in analysis['tags']['L1-']['claims']} == {'pending (0 of 2 seeds)'}
  assert {row['verdict'] for row in analysis['tags']['L3-']['claims']} == {'pending (1 of 2 seeds)'}
  results.update(
    {
      'L3-post-s1': _model([3.0, 2.0, 1.6], [0.2, 0.35]),
      'L3-realformer-s1': _model([3.0, 2.0, 1.2], [0.1, 0.22]),
    }
  )
  claims = attention_analysis.analyse(plan, results)['tags']['L3-']['claims']
  rows = {row['key']: row for row in claims}
  assert rows['L3-5a']['difference']['mean'] == pytest.approx(-0.45)  # (1.0-1.5 + 1.2-1.6) / 2
  assert not rows['L3-5a']['verdict'].startswith('pending')

"""The fine-tuning comparison, once a script, runs through the one runner as a declared plan
(studies/plans/finetune_compare.py: trainer and report 'finetune') and reproduces its committed
results exactly from the committed per-run JSON: the whole analysis in results.json and the
whole results.md but for its command line. No training."""

import dataclasses
import json
import os

from repo_paths import REPO

from realformer_jax.studies import finetune_compare, runner, runs


def test_the_finetune_plan_reproduces_the_committed_analysis_and_report(tmp_path):
  plan = runner.load_plan('finetune_compare')
  pretraining = plan.options['pretraining']
  plan = dataclasses.replace(
    plan,
    out=os.path.join(REPO, plan.out),
    options=dict(
      plan.options,
      pretraining=dataclasses.replace(pretraining, out=os.path.join(REPO, pretraining.out)),
    ),
  )
  results = runs.load_results(plan.out, plan.runs({}))
  assert sorted(results) == sorted(
    f'{start}-s{seed}' for start in ('realformer', 'post', 'scratch') for seed in (0, 1, 2)
  )
  analysis = runner.analyse(plan, results)
  committed = json.load(open(os.path.join(plan.out, 'results.json')))
  assert json.loads(json.dumps(analysis)) == {k: v for k, v in committed.items() if k != 'runs'}
  # The verdicts read from the runs stored before plans (their params name the 'start').
  assert analysis['differences']['realformer - post']['verdict'] == 'inconclusive'
  assert analysis['settings']['pretraining_rate'] == 0.002
  assert analysis['starts']['post']['last_step'] == [plan.all_arms()[0].steps] * 3
  finetune_compare.write_markdown(str(tmp_path / 'results.md'), plan, analysis, 'CMD')
  mine = open(tmp_path / 'results.md').read().splitlines()
  theirs = open(os.path.join(plan.out, 'results.md')).read().splitlines()
  command = 'Regenerate: `python -m experiments.study --plan=finetune_compare`'
  assert mine == [line.replace(command, 'Regenerate: `CMD`') for line in theirs]

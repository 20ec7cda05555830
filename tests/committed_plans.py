"""The committed results of a declared plan, for the tests that reproduce them without training:
the plan with its report folder under the repository, its finished runs from the committed
per-run JSON, and the checks that an analysis and a results.md regenerated from them are the
committed ones."""

import dataclasses
import json
import os

from repo_paths import REPO

from realformer_jax.studies import runner, runs


def committed(name: str):
  """(the cpu plan `name` reading the repository's folders, its committed runs by name)."""
  plan = runner.load_plan(name)
  plan = dataclasses.replace(plan, out=os.path.join(REPO, plan.out))
  return plan, runs.load_results(plan.out, plan.runs({}))


def analysis_is_committed(plan, results) -> dict:
  """The plan's analysis of `results`, asserted equal to the committed results.json's summary."""
  analysis = runner.analyse(plan, results)
  with open(os.path.join(plan.out, 'results.json')) as f:
    assert json.loads(json.dumps(analysis)) == json.load(f)['summary']
  return analysis


def markdown_is_committed(path: str, plan, command: str) -> None:
  """`path` (written with the command 'CMD') is the committed results.md but for its command."""
  mine = open(path).read().splitlines()
  theirs = open(os.path.join(plan.out, 'results.md')).read().splitlines()
  assert mine == [line.replace(f'Regenerate: `{command}`', 'Regenerate: `CMD`') for line in theirs]

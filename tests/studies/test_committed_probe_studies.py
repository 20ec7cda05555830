"""The length-extrapolation study and the position probe, once scripts, run through the one runner
as declared plans (studies/plans/length_extrapolation.py, position_probe.py: their own trainers
and reports) and reproduce their committed results exactly from the committed per-run JSON: the
whole analysis in results.json and the whole results.md but for its command line. No
training."""

import dataclasses
import json
import os

from committed_plans import committed as _committed

from realformer_jax.studies import lengths, position_probe, runner


def test_the_length_plan_reproduces_the_committed_analysis_and_report(tmp_path):
  plan, results = _committed('length_extrapolation')
  assert len(results) == 12
  analysis = runner.analyse(plan, results)
  committed = json.load(open(os.path.join(plan.out, 'results.json')))
  assert json.loads(json.dumps(analysis)) == committed['summary']
  assert committed['scale'] == {
    k: v for k, v in dataclasses.asdict(plan.scale).items() if k in committed['scale']
  }
  lengths.write_markdown(str(tmp_path / 'results.md'), plan, analysis, 'CMD', [0, 1, 2])
  mine = open(tmp_path / 'results.md').read().splitlines()
  theirs = open(os.path.join(plan.out, 'results.md')).read().splitlines()
  command = 'Regenerate: `python -m experiments.study --plan=length_extrapolation`'
  assert mine == [line.replace(command, 'Regenerate: `CMD`') for line in theirs]


def test_the_position_probe_plan_reproduces_the_committed_analysis_and_report(tmp_path):
  plan, results = _committed('position_probe')
  assert sorted(results) == sorted(
    f'{v}-s0' for v in ('learned', 'rope', 'none', 'learned-lr4', 'learned-4x')
  )
  analysis = runner.analyse(plan, results)
  committed = json.load(open(os.path.join(plan.out, 'results.json')))
  assert json.loads(json.dumps(analysis)) == committed['summary']
  assert analysis['variants']['learned-4x']['steps'] == 4 * plan.scale.steps
  position_probe.write_markdown(str(tmp_path / 'results.md'), plan, analysis, 'CMD')
  mine = open(tmp_path / 'results.md').read().splitlines()
  theirs = open(os.path.join(plan.out, 'results.md')).read().splitlines()
  command = 'Regenerate: `python -m experiments.study --plan=position_probe`'
  assert mine == [line.replace(command, 'Regenerate: `CMD`') for line in theirs]

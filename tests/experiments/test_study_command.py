"""`python -m experiments.study --plan=NAME`: bad plans and scales are one `error:` line before
any run starts, a plan file anywhere runs by its path, and the tuned-rates
and stability plans run at toy size (phase A and its extension rung; the failure test and P2)
and report; a second start trains nothing."""

import json
import os
import subprocess
import sys

import jit_cache
import pytest
from data_fixtures import quick_study_argv
from repo_paths import REPO

from realformer_jax.commands import study as study_command


def _run(*argv: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, '-m', 'experiments.study', *argv],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_an_unknown_plan_or_scale_is_one_error_line(tmp_path):
  result = _run('--plan=nope')
  assert result.returncode != 0
  assert result.stderr.strip().splitlines() == [
    "error: --plan: no plan 'nope' (plans: attention_analysis, attention_depth, budgets, depth, "
    'finetune_compare, '
    'grad_norms, init_grad_sweep, layouts, length_extrapolation, position_probe, stability, '
    'tuned_rates)'
  ]
  result = _run('--plan=budgets', '--scale=tpu')
  assert result.stderr.strip().splitlines() == [
    "error: --scale: budgets has no 'tpu' scale (it has cpu, toy)"
  ]
  result = _run(f'--plan={tmp_path}/missing.py')
  assert result.stderr.strip() == f'error: --plan: no file {tmp_path}/missing.py'


def test_a_plan_file_outside_the_repository_is_a_plan(tmp_path):
  """A researcher's own comparison is one short file: the toy layouts plan, renamed."""
  path = tmp_path / 'my_study.py'
  path.write_text(
    'import dataclasses\n'
    'from realformer_jax.studies.plans import layouts\n'
    "PLANS = {'toy': dataclasses.replace(layouts.PLANS['toy'], name='mine')}\n"
  )
  from realformer_jax.studies import runner  # pylint: disable=import-outside-toplevel

  plan = runner.load_plan(str(path), 'toy')
  assert plan.name == 'mine' and len(plan.runs({})) == 6  # 3 layouts x 1 rate x 2 seeds


def test_ctrl_c_is_one_line_saying_how_to_resume(tmp_path, monkeypatch, capsys):
  """The training loop saves on the first Ctrl-C and re-raises it: the study ends on one line
  (no traceback), status 130, saying where the finished runs are and that a rerun resumes."""
  from realformer_jax.studies import runner  # pylint: disable=import-outside-toplevel

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(runner, 'train', interrupted)
  with pytest.raises(SystemExit) as ended:
    study_command.main(
      ['--plan=layouts', '--quick', f'--out={tmp_path}', f'--workdirs={tmp_path}/w']
    )
  assert ended.value.code == 130
  assert capsys.readouterr().err.splitlines() == [
    f'interrupted: finished runs are in {tmp_path}/runs; the same command resumes each '
    'unfinished run from its last checkpoint'
  ]


@pytest.mark.slow
def test_tuned_rates_quick_phase_a_then_the_extension_rung(tmp_path, capsys):
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  argv = ['--plan=tuned_rates'] + quick_study_argv(out, workdirs, '--runs', 'b4-lr0.00[13]-*')
  with jit_cache.in_process():  # the seeds' runs compile the same programs
    report = study_command.main(argv)
  assert sorted(report['results']) == [
    f'b4-lr{rate}-{layout}-s0' for rate in ('0.001', '0.003') for layout in ('post', 'realformer')
  ]
  rules = report['analysis']['rules']
  # Two rates: the best is at an edge of the grid, so the declared rung joins the plan and
  # the rate waits for it.
  for layout in ('post', 'realformer'):
    assert rules[f'r_{layout}']['value'] is None and rules[f'r_{layout}']['extended']
  listed = [run.name for run in report['plan'].runs(report['results'])]
  assert sum(name.startswith(('b4-lr0.0003-', 'b4-lr0.01-')) for name in listed) == 2
  rows = {row['key']: row for row in report['analysis']['comparisons']}
  assert rows['P']['verdict'] == 'pending (0 of 2 seeds)'
  text = open(os.path.join(out, 'results.md')).read()
  assert '`r_post` is not decided yet' in text and 'all-position accuracy' in text
  assert json.load(open(os.path.join(out, 'results.json')))['plan']['name'] == 'tuned_rates'
  for plot in ('rates.png',):
    assert os.path.getsize(os.path.join(out, plot)) > 1000
  capsys.readouterr()
  study_command.main(argv)  # every selected run is finished: nothing is trained again
  assert 'starting' not in capsys.readouterr().out


@pytest.mark.slow
def test_stability_quick_failure_test_and_p2(tmp_path):
  # The ladder's one toy rate (4 runs; the reference rung is left out: minutes on 2 cores).
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  argv = ['--plan=stability'] + quick_study_argv(out, workdirs)
  with jit_cache.in_process():
    report = study_command.main(argv + ['--runs', 'b4-lr0.03-*'])
  assert sorted(report['results']) == [
    f'b4-lr0.03-{layout}-s{seed}' for layout in ('post', 'realformer') for seed in (0, 1)
  ]
  rows = {row['key']: row for row in report['analysis']['comparisons']}
  assert rows['S@0.03']['complete'] and rows['S@0.03']['failures']['n_a'] == 2
  assert rows['A@0.03']['complete']
  assert report['analysis']['rules']['extend']['value'] in (True, False)
  assert 'P2' in report['analysis']['conclusions']
  table = open(os.path.join(out, 'results.md')).read()
  assert "## Failure tests (Boschloo's exact test, two-sided)" in table
  assert '| S@0.03 | fraction failed at 0.03 |' in table
  again = study_command.main(argv + ['--runs', 'none'])  # the report only
  assert again['analysis']['conclusions'] == report['analysis']['conclusions']


def _declared_example() -> str:
  """The plan file docs/experiments.md shows under "Declaring a study"."""
  text = open(os.path.join(REPO, 'docs', 'experiments.md')).read()
  section = text[text.index('### Declaring a study') :]
  return section.split('```python\n', 1)[1].split('```', 1)[0]


def test_the_documented_plan_file_runs_as_written(tmp_path, monkeypatch):
  path = tmp_path / 'depths.py'
  path.write_text(_declared_example())
  out, workdirs = tmp_path / 'report', tmp_path / 'runs'
  argv = [f'--plan={path}', '--runs=none', f'--out={out}', f'--workdirs={workdirs}']
  report = study_command.main(argv)  # nothing trained yet: the report of the plan so far
  plan = report['plan']
  assert [run.name for run in plan.runs({})] == [
    f'b2400-lr{rate:g}-pre-s{seed}' for rate in (1e-3, 2e-3, 4e-3) for seed in (0, 1)
  ]
  assert report['analysis']['rules']['r']['value'] is None
  assert '`r` is not decided yet' in (out / 'results.md').read_text()
  # Once the rate is known, each depth's arms train that many layers.
  done = {
    name: {'final': {'mask_accuracy': 0.3 if '-lr0.002-' in name else 0.2}}
    for name in [run.name for run in plan.runs({})]
  }
  later = [run for run in plan.runs(done) if run.name not in done]
  assert later[0].name == 'L6-b2400-lr0.002-pre-s0' and len(later) == 3 * 2 * 4
  from realformer_jax.studies import plan as plan_lib  # pylint: disable=import-outside-toplevel
  from realformer_jax.studies import study  # pylint: disable=import-outside-toplevel

  configs = []
  monkeypatch.setattr(
    study, 'train_run', lambda c, *a, **k: configs.append(c) or {'diverged_at_step': 1}
  )
  plan_lib.default_train(plan, later[0], str(workdirs / later[0].name), '', lambda *a: None)
  model = configs[0].model
  assert (model.num_layers, model.scan_unroll, model.ln_placement) == (6, 6, 'pre')

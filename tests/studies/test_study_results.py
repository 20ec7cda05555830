"""`python -m experiments.study` trusts no stored result blindly and never ends in a traceback
at its edges: a result edited since its run is refused in one line naming the file, a truncated
or empty one is set aside (named) and its run counts as unfinished, a `--runs` that selects
nothing names the plan's runs, a plan file with a syntax error and an `--out` under a regular
file are one line each. Results written before digests existed still load (legacy). No
training: the report of hand-placed results only (`--runs=none`)."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
from repo_paths import REPO

from realformer_jax.studies import runs as runs_lib

# A committed result (no digest: written before digests existed), under a toy layouts name.
_COMMITTED = os.path.join(
  REPO, 'docs', 'results', 'compare_layouts', 'budgets', 'runs', 'b1200-lr0.002-post-s0.json'
)
_NAME = 'lr0.003-post-s0'


def _study(out, *argv: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, '-m', 'experiments.study', '--plan=layouts', '--quick', f'--out={out}']
    + [f'--workdirs={out}/w', *argv],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )


def _store_result(out, result: dict) -> str:
  path = os.path.join(out, 'runs', f'{_NAME}.json')
  runs_lib.write_json(path, result)
  return path


def _committed() -> dict:
  with open(_COMMITTED) as f:
    return json.load(f)


@pytest.mark.slow  # two reports through the command, ~5 s each
def test_a_result_edited_since_its_run_is_refused_naming_the_file(tmp_path):
  result = runs_lib.with_digest(dict(_committed(), run=_NAME))
  path = _store_result(tmp_path, result)
  assert _study(tmp_path, '--runs=none').returncode == 0  # its digest matches: reported
  assert os.path.exists(tmp_path / 'results.md')
  edited = dict(result, eval_accuracy=[[150, 0.93]])  # the hand edit, digest kept
  runs_lib.write_json(path, edited)
  ended = _study(tmp_path, '--runs=none')
  assert ended.returncode != 0
  assert ended.stderr.strip().splitlines() == [
    f'error: {path}: its contents do not match the digest it was written with (edited or '
    'damaged since its run): not reported; delete it to train that run again, or put back its '
    'own copy'
  ]


def test_a_result_without_a_digest_loads_as_legacy(tmp_path):
  """docs/results/**/runs hold results of earlier studies, written before digests."""
  _store_result(tmp_path, _committed())
  ended = _study(tmp_path, '--runs=none')
  assert ended.returncode == 0, ended.stderr
  with open(tmp_path / 'results.json') as f:
    assert _NAME in json.load(f)['runs']


@pytest.mark.slow  # two reports through the command, ~5 s each
def test_a_truncated_or_empty_result_is_set_aside_and_named(tmp_path):
  path = _store_result(tmp_path, runs_lib.with_digest(_committed()))
  with open(path, 'r+') as f:
    f.truncate(100)
  ended = _study(tmp_path, '--runs=none')
  assert ended.returncode == 0, ended.stderr
  assert 'Traceback' not in ended.stderr
  notes = [line for line in ended.stdout.splitlines() if line.startswith('note:')]
  assert len(notes) == 1 and notes[0].startswith(f'note: {path}: not a whole result (')
  assert notes[0].endswith(f'set aside to {_NAME}.json.damaged; its run counts as unfinished')
  assert not os.path.exists(path) and os.path.getsize(path + '.damaged') == 100
  open(path, 'w').close()  # empty
  ended = _study(tmp_path, '--runs=none')
  assert f'note: {path}: empty: set aside to {_NAME}.json.damaged-2' in ended.stdout
  assert sorted(glob.glob(f'{path}*')) == [path + '.damaged', path + '.damaged-2']


def test_runs_that_select_nothing_name_the_plans_runs(tmp_path):
  ended = _study(tmp_path, '--runs=lr0.1-*')
  assert ended.returncode != 0
  assert ended.stderr.strip().splitlines() == [
    'error: --runs=lr0.1-*: selects none of the runs plan layouts lists now '
    '(lr0.003-post-s0, lr0.003-realformer-s0, lr0.003-pre-s0, lr0.003-post-s1, '
    'lr0.003-realformer-s1, lr0.003-pre-s1); --runs=none reports without training'
  ]
  assert not os.path.exists(tmp_path / 'w')  # nothing trained


@pytest.mark.slow  # two commands
def test_a_plan_with_a_syntax_error_and_an_out_under_a_file_are_one_line(tmp_path):
  plan = tmp_path / 'broken.py'
  plan.write_text('PLANS = {\n')
  ended = subprocess.run(
    [sys.executable, '-m', 'experiments.study', f'--plan={plan}'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert ended.returncode != 0
  assert ended.stderr.strip().splitlines() == [
    f"error: --plan: {plan} line 1: '{{' was never closed (a syntax error)"
  ]
  (tmp_path / 'file').write_text('')
  ended = _study(tmp_path / 'file' / 'out', '--runs=none')
  assert ended.returncode != 0
  assert ended.stderr.strip().splitlines() == [
    f'error: --out {tmp_path}/file/out: {tmp_path}/file is a file, not a directory'
  ]
  shutil.rmtree(tmp_path / 'file', ignore_errors=True)


@pytest.mark.slow  # two reports through the command, ~5 s each
def test_a_runs_folder_that_is_a_file_or_a_result_not_utf8_is_one_line(tmp_path):
  """Issue 68's fault pass: each ended in a traceback (NotADirectoryError, UnicodeDecodeError)."""
  (tmp_path / 'runs').write_text('not a folder')
  ended = _study(tmp_path, '--runs=none')
  assert ended.returncode == 1 and 'Traceback' not in ended.stderr, ended.stderr
  assert ended.stderr.strip().splitlines() == [
    f'error: {tmp_path}/runs/{_NAME}.json: cannot be read as a stored result (Not a directory): '
    'move aside what is in its place, or give the study another --out / --store'
  ]
  os.remove(tmp_path / 'runs')
  path = _store_result(tmp_path, runs_lib.with_digest(_committed()))
  with open(path, 'r+b') as f:
    f.write(b'\xff\xfe')  # bytes that are no UTF-8
  ended = _study(tmp_path, '--runs=none')
  assert ended.returncode == 0 and 'Traceback' not in ended.stderr, ended.stderr
  assert f'note: {path}: not a whole result (' in ended.stdout
  assert os.path.exists(path + '.damaged')

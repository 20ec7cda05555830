"""`experiments.study --plan=depth --quick` through the real command: runs at two depths scored
under several mask draws (study.score_workdir), the trend row and the one-draw column in
the report; then `--plan=attention_depth` on those runs: each depth analysed, its statements
and report in its own folder, the index of both."""

import json
import os

import jit_cache
import numpy as np
import pytest
from data_fixtures import quick_study_argv

from realformer_jax.commands import study as study_command


@pytest.mark.slow
def test_depth_study_quick_scores_every_draw_and_reports_the_trend(tmp_path, capsys):
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  argv = ['--plan=depth'] + quick_study_argv(out, workdirs, '--runs', 'L1-*,L3-*')
  with jit_cache.in_process():
    report = study_command.main(argv)
  assert sorted(report['results']) == sorted(
    f'L{layers}-b4-lr0.002-{layout}-s{seed}'
    for layers in (1, 3)
    for layout in ('realformer', 'post')
    for seed in (0, 1)
  )
  for run in report['results'].values():
    scored = run['scored']
    assert scored['mask_draws'] == 2 and len(scored['draw_metrics']) == 2
    first, second = scored['draw_metrics']
    # Draw 0 is the training evaluations' draw; the draws mask other positions.
    assert first['mask_accuracy'] == pytest.approx(run['final']['mask_accuracy'], abs=1e-6)
    assert first['loss'] == pytest.approx(run['final']['loss'], rel=1e-5)
    assert scored['metrics']['predictions'] == first['predictions'] + second['predictions']
    first_sums = scored['first_draw_sequence_sums']  # draw 0's per-sequence sums
    assert np.sum(first_sums['mask_correct_sum']) / np.sum(first_sums['mask_count']) == (
      pytest.approx(first['mask_accuracy'], abs=1e-4)
    )
    assert len(scored['sequence_sums']['count']) == scored['sequences']
  rows = {row['key']: row for row in report['analysis']['comparisons']}
  assert rows['T']['comparison']['n'] == 2 and 'first_draw' in rows['T']
  assert rows['R1']['verdict'] == 'pending (0 of 2 seeds)'  # the reruns were not selected
  table = open(os.path.join(out, 'results.md')).read()
  assert '| T | gap(3) - gap(1), all positions |' in table and 'Held-out resolution' in table
  saved = json.load(open(os.path.join(out, 'results.json')))
  assert saved['plan']['scale']['eval_mask_draws'] == 2
  _attention_on_the_depth_runs(tmp_path, out, workdirs, capsys)


# The toy attention_depth plan reading this test's depth runs (the toy depth plan names no folders).
_ATTENTION_ON = """
import dataclasses
from realformer_jax.studies.plans import attention_analysis, depth
pretraining = dataclasses.replace(depth.PLANS['toy'], out={out!r}, workdirs={workdirs!r})
PLANS = {{'toy': attention_analysis.make(
  pretraining, (0, 1), max_batches=1, rate=depth.RATE, tags=('L1-', 'L3-'), name='attention_depth'
)}}
"""


def _attention_on_the_depth_runs(tmp_path, out, workdirs, capsys):
  plan_file = tmp_path / 'attention_on_the_depth_runs.py'
  plan_file.write_text(_ATTENTION_ON.format(out=out, workdirs=workdirs))
  report_out = tmp_path / 'attention'
  argv = [f'--plan={plan_file}'] + quick_study_argv(str(report_out), str(tmp_path / 'analyses'))
  analysis = study_command.main(argv)['analysis']
  assert sorted(analysis['tags']) == ['L1-', 'L3-']
  for tag, layers in (('L1-', 1), ('L3-', 3)):
    part = analysis['tags'][tag]
    assert part['seeds'] == [0, 1] and part['rate'] == 0.002
    for layout in ('post', 'realformer'):
      assert len(part['summary'][layout]['entropy_mean']) == layers
      assert part['per_model'][layout]['0']['workdir'].endswith(f'{tag}b4-lr0.002-{layout}-s0')
    assert [row['key'] for row in part['claims']] == [f'{tag}5a', f'{tag}5b', f'{tag}5c']
    folder = report_out / tag.rstrip('-')
    assert "The paper's statements" in (folder / 'results.md').read_text()
    assert os.path.getsize(folder / 'entropy.png') > 1000
  index = (report_out / 'results.md').read_text()
  assert '| [L3](L3/results.md) | L3-5c |' in index
  capsys.readouterr()
  study_command.main(argv)  # every depth analysed: nothing is analysed again
  assert 'starting' not in capsys.readouterr().out

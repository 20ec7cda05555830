"""`python -m benchmarks.device_suite` (issue 40's one command for a GPU) at its toy size on this
CPU: every part reports, labelled measured or estimated, and a part that does not fit its
budget is skipped with the reason; importing it pulls in no optional package. And
`python -m benchmarks.qk_calibration`'s paths: the committed table re-timed, and the compile of
the measured commit at a toy length."""

import json
import os
import subprocess
import sys

import pytest
import repo_paths

REPO = repo_paths.REPO
OPTIONAL = ('tensorflow_datasets', 'grain', 'tensorboardX', 'transformers', 'jax')


def _run(*args, timeout=2400, fast=False):  # slow tests on a loaded 2-core machine took > 15 min
  """`fast`: the suite's XLA setting (conftest.py) for a run whose time is compiling toy
  programs for this CPU, checked for form, not for their figures' size."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  if fast:
    env['JAX_DISABLE_MOST_OPTIMIZATIONS'] = 'true'
  return subprocess.run(
    [sys.executable, '-m', *args], cwd=REPO, env=env, capture_output=True, text=True,
    timeout=timeout,
  )  # fmt: skip


def test_importing_the_suite_imports_no_optional_package_and_not_jax():
  code = (
    f'import sys, benchmarks.device_suite; print([m for m in {OPTIONAL!r} if m in sys.modules])'
  )
  done = subprocess.run(
    [sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=60
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == '[]'


def test_bad_arguments_are_one_line_errors(tmp_path):
  done = _run('benchmarks.device_suite', f'--out={tmp_path}', '--parts=long,nope', timeout=60)
  assert done.returncode == 2
  assert done.stdout.strip() == (
    "error: --parts=long,nope: unknown part 'nope' (known: ('steps', 'long', 'split', 'device'))"
  )


def test_lengths_run_longest_first_and_bad_ones_are_one_line_errors(tmp_path):
  from benchmarks import device_suite  # pylint: disable=import-outside-toplevel

  assert device_suite.parse_lengths('16384,65536,16384') == (65536, 16384)
  for bad in ('', 'a,1', '0', '-5'):
    assert device_suite.parse_lengths(bad) == ()
  done = _run('benchmarks.device_suite', f'--out={tmp_path}', '--lengths=64,x', timeout=60)
  assert done.returncode == 2
  assert done.stdout.strip() == (
    'error: --lengths=64,x: expected positive integers, e.g. 65536,16384'
  )


def test_qk_ds_tile_candidates_parse_and_plan(tmp_path):
  from benchmarks import device_suite  # pylint: disable=import-outside-toplevel

  assert device_suite.parse_tiles('64x128, 128X128x4x3') == ((64, 128, 0, 0), (128, 128, 4, 3))
  for bad in ('64', '64x', 'ax64', '64x96', '8x64', '64x128x2', '64x128x3x2'):
    assert device_suite.parse_tiles(bad) == ()
  assert device_suite.tile_label((64, 128, 0, 0)) == '64x128'  # the table's warps, stages
  plan = device_suite._long_plan(
    device_suite.Suite(
      str(tmp_path), device_suite.FULL, 1.0, print, ((64, 128, 0, 0),), ((128, 32, 4, 5),)
    )
  )
  # the full size's rows in issue 64's order (Post-LN 65,536 stored and drawn, qk 65,536 and
  # 131,072), then the candidates at the first length: post's, then qk's
  assert plan == [
    (65536, 'post stored', None),
    (65536, 'post drawn', None),
    (65536, 'realformer qk', None),
    (131072, 'realformer qk', None),
    (65536, 'post', (128, 32, 4, 5)),
    (65536, 'realformer qk', (64, 128, 0, 0)),
  ]
  # qk runs on the Triton kernels, forced, on a device (never what 'auto' might take there)
  assert device_suite.long_variant('realformer qk', True)['attention_impl'] == 'pallas_triton'
  assert 'attention_impl' not in device_suite.long_variant('realformer qk', False)
  assert device_suite.long_variant('post drawn', True)['remat_dropout_masks'] == 'drawn'


def test_the_default_call_fits_one_lease_by_its_own_plan(tmp_path):
  # issue 64: `python -m benchmarks.device_suite` within 420 s including compiles, the device
  # check a call of its own; the dry run prints the plan and runs nothing.
  done = _run('benchmarks.device_suite', f'--out={tmp_path}', '--dry_run', timeout=60)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.strip().splitlines()
  planned = [(float(line.split()[0]), line.split('s  ', 1)[1]) for line in lines[:-1]]
  assert [what for _, what in planned] == [
    'steps',
    'long L=65536 post stored',
    'long L=65536 post drawn',
    'long L=65536 realformer qk',
    'long L=131072 realformer qk',
    'split',
  ]
  total = sum(seconds for seconds, _ in planned)
  assert total <= 420 and lines[-1] == f'planned {total:.0f} s of --budget_s=420 (full size)'
  assert not list(tmp_path.iterdir())  # nothing run, nothing written
  device = _run('benchmarks.device_suite', f'--out={tmp_path}', '--dry_run', '--parts=device')
  assert device.stdout.splitlines()[0].split()[-1] == 'device', device.stdout


def test_post_backward_tile_candidates_parse():
  from benchmarks import device_suite  # pylint: disable=import-outside-toplevel

  assert device_suite.parse_tiles('128x32x4x5,128X128', launch=(4, 2)) == (
    (128, 32, 4, 5),
    (128, 128, 4, 2),
  )
  for bad in ('128x32x4', '128x32x3x2', '128x32x4x0', '128x32x4x9', '96x32'):
    assert device_suite.parse_tiles(bad, launch=(4, 2)) == ()
  assert device_suite.tile_label((128, 32, 4, 5)) == '128x32, 4 warps, 5 stages'


@pytest.mark.parametrize(
  'flag,value,example',
  [
    ('qk_ds_tiles', '64x96', '64x128,64x128x4x3'),
    ('post_bwd_tiles', '128x3', '128x32x4x5,128x128'),
  ],
)
def test_a_bad_tile_candidate_is_a_one_line_error(tmp_path, flag, value, example):
  done = _run('benchmarks.device_suite', f'--out={tmp_path}', f'--{flag}={value}', timeout=60)
  assert done.returncode == 2
  assert done.stdout.strip() == (
    f'error: --{flag}={value}: expected KEYSxROWS (powers of two >= 16), optionally '
    f'xWARPSxSTAGES (warps 1-16, stages 1-8), e.g. {example}'
  )


def test_a_part_that_does_not_fit_the_budget_is_skipped_with_the_reason(tmp_path):
  done = _run(
    'benchmarks.device_suite', f'--out={tmp_path}', '--toy', '--budget_s=1',
    '--parts=device,split,long,steps', timeout=60,
  )  # fmt: skip
  assert done.returncode == 0, done.stderr[-2000:]
  results = json.loads((tmp_path / 'results.json').read_text())
  assert list(results['parts']) == ['steps', 'long', 'split', 'device']  # the suite's order
  for part in results['parts'].values():
    assert 'budget_s=1' in part['skipped']
  assert 'run it alone with --parts=device' in (tmp_path / 'results.md').read_text()


def test_a_device_check_stopped_by_the_budget_keeps_the_lines_it_printed(tmp_path):
  from benchmarks import device_suite  # pylint: disable=import-outside-toplevel

  logged = []
  suite = device_suite.Suite(str(tmp_path), device_suite.TOY, 3.0, logged.append)
  code = 'import time; print("PASS case 1", flush=True); time.sleep(60)'
  slow_check = [sys.executable, '-c', code]
  result = device_suite.run_device(suite, slow_check)
  assert result['passed'] is None  # INCOMPLETE: what it finished passed
  assert device_suite.render_part('device', result)[0] == 'device check: INCOMPLETE'
  assert result['summary'] == ['PASS case 1']
  assert 'ran past the budget after 1 lines' in result['error']
  assert '  | PASS case 1' in logged  # passed on as it came, not at the end


def test_a_check_that_crashes_compiling_side_by_side_runs_again_one_case_at_a_time(tmp_path):
  from benchmarks import device_suite  # pylint: disable=import-outside-toplevel

  logged = []
  suite = device_suite.Suite(str(tmp_path), device_suite.TOY, 200.0, logged.append)
  code = (
    'import os, signal, sys; print("PASS case 1", flush=True); '
    'os.kill(os.getpid(), signal.SIGSEGV) if "--jobs=2" in sys.argv else print("overall: PASS")'
  )
  result = device_suite.run_device(suite, [sys.executable, '-c', code, '--jobs=2'])
  assert result['passed'] is True and result['retried_serially']
  assert result['summary'] == ['PASS case 1', 'overall: PASS']
  assert any('the check crashed (device_check exited -11' in line for line in logged)


@pytest.mark.slow
def test_the_toy_suite_measures_each_part_and_labels_every_figure(tmp_path):
  # The device check has its own test (tests/experiments/test_device_check.py); here the suite's
  # other parts.
  done = _run(
    'benchmarks.device_suite', f'--out={tmp_path}', '--toy', '--parts=long,split,steps',
    '--budget_s=800', '--qk_ds_tiles=16x32x4x2', '--post_bwd_tiles=32x16x4x3', fast=True,
  )  # fmt: skip
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  results = json.loads((tmp_path / 'results.json').read_text())
  long_rows = results['parts']['long']['rows']
  assert [r['variant'] for r in long_rows] == [
    'post', 'realformer recomputed', 'realformer qk', 'post', 'realformer qk'
  ]  # fmt: skip
  assert (
    long_rows[-1]['qk_ds_tile'] == '16x32, 4 warps, 2 stages' and 'qk_ds_tile' not in long_rows[-3]
  )
  assert long_rows[-2]['post_bwd_tile'] == '32x16, 4 warps, 3 stages'
  assert all(r['step_s'] > 0 and r['xla_peak_gb'] > 0 for r in long_rows)
  # A candidate tile starts from its variant's state, batch and dropout stream: the same loss
  # and gradient norm (here on the CPU's path, which has no tiles).
  for candidate, variant in ((3, 0), (4, 2)):
    for figure in ('loss', 'grad_norm'):
      assert long_rows[candidate][figure] > 0
      assert long_rows[candidate][figure] == pytest.approx(long_rows[variant][figure], rel=1e-5)
  # No chip for a CPU: no estimate, and the table says so.
  assert results['parts']['long']['estimate_chip'] is None
  split = results['parts']['split']['variants']
  assert set(split) == {'post', 'realformer qk'} and all(v['device_s'] > 0 for v in split.values())
  steps = results['parts']['steps']['shapes']['tiny']['step_s']
  assert set(steps) == {'post', 'realformer', 'pre', 'hf'}
  markdown = (tmp_path / 'results.md').read_text()
  assert 'step (s), MEASURED' in markdown and 'step (s), ESTIMATED' in markdown
  assert '| realformer qk (dS tile 16x32, 4 warps, 2 stages: keys x rows) |' in markdown
  assert '| post (backward tile 32x16, 4 warps, 3 stages: keys x rows) |' in markdown
  # Each part printed as it finished, the step table first whatever --parts lists.
  assert done.stdout.index('[steps] done') < done.stdout.index('[long] done')
  assert done.stdout.index('[long] done') < done.stdout.index('[split] done')
  assert results['parts']['steps']['shapes']['tiny']['mfu'] == {}  # a CPU: no datasheet peak


@pytest.mark.slow
def test_a_commit_that_was_not_measured_is_a_one_line_error(tmp_path):
  done = _run('benchmarks.qk_calibration', '--table', f'--out={tmp_path}', '--commits=abc')
  assert done.returncode == 2
  assert done.stdout.startswith('error: --commits=abc: matches no measured commit (measured: ')


def test_the_calibration_table_re_times_the_committed_inputs(tmp_path):
  done = _run('benchmarks.qk_calibration', '--table', '--fit', f'--out={tmp_path}', timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  # --fit refits the two constants from the same inputs: targets.py holds what it prints.
  assert (
    'FUSED_KERNEL_EFFICIENCY = 0.78, HOPPER_L2_FRACTION = 0.44 (targets.py has 0.78 and '
    '0.44)' in done.stdout
  )
  committed = json.loads(
    open(os.path.join(REPO, 'docs/results/aot/qk_calibration/results.json')).read()
  )
  assert json.loads((tmp_path / 'results.json').read_text()) == committed


@pytest.mark.slow
def test_the_calibration_compiles_the_measured_commit_at_a_toy_length(tmp_path):
  # The full command compiles eighteen programs at 16k-65k (~45 min): the same path at L = 256
  # for the set whose kernels the estimator states on their behalf (legacy_kernels.py).
  done = _run(
    'benchmarks.qk_calibration', '--seq_len=256', f'--out={tmp_path}', '--commits=eaf81ca'
  )
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads((tmp_path / 'results.json').read_text())
  assert results['toy_seq_len'] == 256
  inputs = json.loads((tmp_path / 'inputs-eaf81ca-qk-256.json').read_text())
  assert sum(k['work']['atomics'] * k['count'] for k in inputs['kernels']) > 0  # the old bwd
  assert 'not comparable' in (tmp_path / 'results.md').read_text()
  assert [r['commit'][:7] for r in results['rows']] == ['eaf81ca', 'eaf81ca']


def test_issue_57_targets_are_judged_per_measured_row():
  from benchmarks import device_targets  # pylint: disable=import-outside-toplevel

  steps = {'post': 0.080, 'realformer': 0.082, 'pre': 0.081, 'hf': 0.125}
  figures = device_targets.step_figures('bert_large_512', steps, {'post': 0.41})
  assert device_targets.step_figures('bert_base_512', steps, {}) == {}  # the targets are Large's
  rows = [
    {'length': 65536, 'variant': 'post', 'step_s': 3.2},
    {'length': 65536, 'variant': 'realformer qk', 'step_s': 6.5, 'first_step_s': 8.4},
    {'length': 65536, 'variant': 'realformer qk', 'step_s': 5.0, 'qk_ds_tile': '64x128'},
    {'length': 32768, 'variant': 'post', 'step_s': 1.0},
  ]
  figures.update(device_targets.long_figures(rows))
  assert figures['qk_65536_s'] == 6.5  # a candidate tile is not the table's own row
  verdicts = {line.split(': ')[0]: line.split(' ')[0] for line in device_targets.lines(figures)}
  assert verdicts == {
    'MISS (MEASURED) Post-LN step, L = 65,536 <= 3.00 s': 'MISS',
    'PASS (MEASURED) RealFormer qk step, L = 65,536 <= 6.60 s': 'PASS',
    'MISS (MEASURED) RealFormer qk first step, L = 65,536 <= 8.00 s': 'MISS',
    'PASS (MEASURED) BERT-Large 32 x 512 Post-LN step <= 85.0 ms': 'PASS',
    'MISS (MEASURED) BERT-Large 32 x 512 Post-LN step (stretch) <= 75.0 ms': 'MISS',
    'PASS (MEASURED) BERT-Large 32 x 512 Post-LN MFU of the datasheet peak >= 0.39': 'PASS',
    'PASS (MEASURED) BERT-Large 32 x 512 tokens/s Post-LN / Hugging Face >= 1.50x': 'PASS',
  }
  # Judged ESTIMATED, issue 64's own deviceless bounds: 3.2 s passes 3.6, RealFormer 115 ms
  estimated = {line.split(': ')[0]: line for line in device_targets.lines(figures, 'ESTIMATED')}
  assert 'PASS (ESTIMATED) Post-LN step, L = 65,536 <= 3.60 s' in estimated
  assert 'PASS (ESTIMATED) RealFormer qk step, L = 65,536 <= 8.50 s' in estimated
  assert 'PASS (ESTIMATED) BERT-Large 32 x 512 RealFormer step <= 115.0 ms' in estimated
  assert 'PASS (ESTIMATED) BERT-Large 32 x 512 Post-LN step <= 85.0 ms' in estimated


def test_the_predictions_cover_every_row_the_suite_times_and_report_its_error(tmp_path):
  from benchmarks import device_predictions, device_suite  # pylint: disable=import-outside-toplevel

  size = device_suite.FULL
  steps = device_predictions._step_rows(size)  # pylint: disable=protected-access
  models = ('post', 'realformer', 'pre', 'hf')
  assert steps == [('steps', s, m) for s in size.step_shapes for m in models]
  assert size.step_shapes == ('bert_large_512',)  # the targets' shape
  assert device_predictions._long_rows(size) == [  # pylint: disable=protected-access
    ('long', 65536, 'post stored'),
    ('long', 65536, 'post drawn'),
    ('long', 65536, 'realformer qk'),
    ('long', 131072, 'realformer qk'),
  ]
  rows = [
    {'part': 'steps', 'key': 'bert_large_512', 'model': 'post', 'estimate_s': 0.09},
    {'part': 'long', 'key': 65536, 'model': 'post', 'estimate_s': 4.4},
    {'part': 'long', 'key': 131072, 'model': 'realformer qk', 'estimate_s': 38.0},
  ]
  prediction = {'date': '2026-11-28', 'commit': 'abcdef0123', 'rows': rows}
  results = {
    'date': '2026-11-29',
    'parts': {
      'steps': {'shapes': {'bert_large_512': {'step_s': {'post': 0.1, 'hf': 0.15}}}},
      'long': {'rows': [{'length': 65536, 'variant': 'post', 'step_s': 4.0}]},
    },
  }
  (tmp_path / 'p.json').write_text(json.dumps(prediction))
  (tmp_path / 'results.json').write_text(json.dumps(results))
  text = device_predictions.report(str(tmp_path / 'results.json'), str(tmp_path / 'p.json'))
  assert '| steps | bert_large_512 | post | 0.1 s | 0.09 s | -10% |' in text
  assert '| long | 65536 | post | 4 s | 4.4 s | +10% |' in text
  assert '| steps | bert_large_512 | hf | 0.15 s |  | not predicted |' in text
  assert "Predicted, not measured in this run: ('long', 131072, 'realformer qk')." in text
  done = _run('benchmarks.device_predictions', f'--report={tmp_path}/none.json', timeout=60)
  assert done.returncode == 2
  assert done.stdout.strip() == f'error: --report={tmp_path}/none.json: no such file'

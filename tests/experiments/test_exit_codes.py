"""Exit codes a script can trust (issues 68, 69): a command stopped by Ctrl-C or SIGTERM exits
130 or 143 after saving what it can, never 0, so `realformer-train ... && realformer-export ...`
does not go on from a half-trained run; SIGTERM while data is prepared stops the worker
processes and removes what was half-written, as Ctrl-C does, with one line. (Pretraining's
codes at its hardest moments: tests/train/test_faults_checkpoints.py.)"""

import ast
import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import repo_paths
from data_fixtures import bible_config, write_corpus
from finetune_fixtures import cli_flags, tokenizer_file
from toy_flags import TRAIN_TOY_FLAGS

from realformer_jax import data
from realformer_jax.train import preemption

_LAUNCHER = os.path.join(repo_paths.TESTS, 'prepare_fault_launcher.py')


def test_exit_status_is_the_shells_for_the_signal():
  assert preemption.exit_status('SIGINT') == 130
  assert preemption.exit_status('SIGTERM') == 143


def _children(pid: int) -> list[int]:
  """The live processes whose parent is `pid` (Linux /proc)."""
  children = []
  for stat in glob.glob('/proc/[0-9]*/stat'):
    try:
      with open(stat) as f:
        fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid and fields[0] != 'Z':
      children.append(int(stat.split('/')[2]))
  return children


def _alive(pids) -> list[int]:
  alive = []
  for pid in pids:
    try:
      with open(f'/proc/{pid}/stat') as f:
        if f.read().rsplit(')', 1)[1].split()[0] != 'Z':
          alive.append(pid)
    except OSError:
      pass
  return alive


@pytest.mark.slow  # a preparation with two worker processes, stopped in its tokenizer (~15 s)
@pytest.mark.parametrize(
  'sig, status, said', [(signal.SIGTERM, 143, 'SIGTERM'), (signal.SIGINT, 130, 'Ctrl-C')]
)
def test_a_signal_during_preparation_stops_the_workers_and_leaves_nothing(
  tmp_path, sig, status, said
):
  write_corpus(tmp_path / 'corpus', train_files=4, docs_per_file=200)
  tmpdir = tmp_path / 'tmp'
  tmpdir.mkdir()
  data_dir = tmp_path / 'cache'
  argv = [
    sys.executable,
    _LAUNCHER,
    '--config=configs/tiny.py',
    f'--config.data.data_dir={data_dir}',
  ]
  argv += [
    f'--config.data.train_files={tmp_path / "corpus"}/train-*.txt',
    f'--config.data.eval_files={tmp_path / "corpus"}/eval.txt',
    '--config.data.vocab_size=500',
    '--workers=2',
  ]
  env = dict(os.environ, REALFORMER_PREPARE_FAULTS='blocking_trainer', TMPDIR=str(tmpdir))
  process = subprocess.Popen(
    argv, cwd=repo_paths.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  try:
    seen = []
    for line in process.stderr:  # the trainer blocks ~60 s in one C call
      seen.append(line)
      if 'FAULT: trainer blocked' in line:
        break
    else:
      raise AssertionError(''.join(seen))
    workers = _children(process.pid)
    assert workers, 'no worker process to stop'
    time.sleep(0.5)
    process.send_signal(sig)
    out, err = process.communicate(timeout=60)
  finally:
    process.kill()
  assert process.returncode == status, ''.join(seen) + err
  lines = [line for line in err.splitlines() if not line.startswith('prepare ')]  # progress
  assert len(lines) == 1 and lines[0].startswith(f'interrupted ({said}): what was finished'), err
  deadline = time.monotonic() + 10
  while _alive(workers) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not _alive(workers)  # none orphaned
  assert os.listdir(tmpdir) == []  # no ids directory left in $TMPDIR
  assert not glob.glob(f'{data_dir}/**/*.tmp*', recursive=True)  # nothing half-written


@pytest.mark.slow  # a toy fine-tuning run stopped mid-way (~25 s)
def test_a_finetuning_run_stopped_by_sigterm_exits_143_without_results(tmp_path):
  workdir = tmp_path / 'run'
  flags = cli_flags(
    **{
      'finetune.num_epochs': 500,
      'data.vocab_file': tokenizer_file(),
      'model.vocab_size': data.prepare(bible_config()).vocab_size,
    }
  )
  process = subprocess.Popen(
    [sys.executable, '-m', 'experiments.finetune', '--config=configs/finetune/bible_sections.py']
    + [f'--workdir={workdir}', '--config.model.max_len=64', *flags],
    cwd=repo_paths.REPO,
    env=dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS='true'),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    seen = []
    for line in process.stdout:
      seen.append(line)
      if re.match(r'step +3/', line):  # the step number is padded
        break
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
  finally:
    process.kill()
  out = ''.join(seen) + out
  assert process.returncode == 143, out + err
  assert 'SIGTERM: saved a checkpoint at step' in out
  assert not (workdir / 'results.json').exists()  # not finished: no results


@pytest.mark.slow  # a toy pretraining run stopped mid-way (~20 s)
def test_train_then_export_does_not_export_an_interrupted_run(tmp_path):
  # The shell's `&&` sees the exit status: a Ctrl-C'd training run stops the chain.
  workdir = tmp_path / 'run'
  long_run = {
    'train.num_train_steps': 5000,
    'train.stop_at_step': -1,
    'train.eval_every_steps': 5000,
    'train.checkpoint_every_steps': 5000,
  }
  flags = ' '.join(f'--config.{k}={v}' for k, v in {**TRAIN_TOY_FLAGS, **long_run}.items())
  script = (
    f'{sys.executable} -m experiments.train --config=configs/tiny.py --workdir={workdir} '
    f'--config.data.data_dir={bible_config().data_dir} {flags} && '
    f'{sys.executable} -m experiments.export_hf --workdir={workdir} --out={tmp_path / "hf"}'
  )
  process = subprocess.Popen(
    ['bash', '-c', script],
    cwd=repo_paths.REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,
  )
  try:
    for line in process.stdout:
      if line.startswith('step '):
        break
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    out, err = process.communicate(timeout=120)
  finally:
    process.kill()
  assert process.returncode == 130, out + err
  assert 'SIGINT: saved a checkpoint at step' in out
  assert not (tmp_path / 'hf').exists()


@pytest.mark.slow  # a first training start stopped while its tokenizer trains (~15 s)
def test_sigterm_while_a_first_train_start_prepares_data_is_one_line_143(tmp_path):
  write_corpus(tmp_path / 'corpus', train_files=2)
  data_dir = tmp_path / 'cache'
  # The trainer blocks ~60 s in one C call (tests/prepare_fault_launcher.py's fault), here
  # under experiments.train.
  launcher = (
    'import runpy, sys; sys.path.insert(0, sys.argv[1]); import prepare_fault_launcher as f; '
    "f._FAULTS['blocking_trainer'](); sys.argv = sys.argv[1:]; "
    "runpy.run_module('experiments.train', run_name='__main__', alter_sys=True)"
  )
  argv = [sys.executable, '-c', launcher, repo_paths.TESTS, '--config=configs/tiny.py']
  argv += [
    f'--workdir={tmp_path / "run"}',
    f'--config.data.data_dir={data_dir}',
    f'--config.data.train_files={tmp_path / "corpus"}/train-*.txt',
    f'--config.data.eval_files={tmp_path / "corpus"}/eval.txt',
    '--config.data.vocab_size=500',
  ]
  process = subprocess.Popen(
    argv, cwd=repo_paths.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  try:
    seen = []
    for line in process.stderr:
      seen.append(line)
      if 'FAULT: trainer blocked' in line:
        break
    else:
      raise AssertionError(''.join(seen))
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
  finally:
    process.kill()
  assert process.returncode == 143, ''.join(seen) + err
  lines = [line for line in err.splitlines() if not line.startswith('prepare ')]  # progress
  assert lines == [
    'error: SIGTERM while no step was running (nothing to save); no checkpoint was saved yet: '
    'a rerun starts from step 0'
  ], err
  assert not glob.glob(f'{data_dir}/**/*.tmp*', recursive=True)


@pytest.mark.parametrize('module', ['train', 'finetune', 'prepare_data', 'translate'])
def test_each_commands_help_states_the_exit_codes(module):
  # --help prints the module's docstring (realformer_jax/commands/cli.py parse_flags); read from the
  # source, as importing two commands would define their absl flags twice.
  with open(os.path.join(repo_paths.REPO, 'realformer_jax', 'commands', f'{module}.py')) as f:
    doc = ' '.join(ast.get_docstring(ast.parse(f.read())).split())
  assert '130' in doc and '143' in doc and '0 only when' in doc, module

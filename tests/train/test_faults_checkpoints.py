"""Fault injection, checkpoints: damaged checkpoints fall back to the newest step that restores
(the damaged one renamed aside, never deleted), a run with none stops in one line, a failed
save (full disk, permission denied; blocking or background) stops in one line without touching
a committed checkpoint, and SIGTERM during a save or an evaluation, or kill -9 at random
moments, still ends with the parameters of the uninterrupted run.

The training runs are the real CLI in subprocesses (fault_support.py; faults patched in by
fault_launcher.py); checks of restore_latest on each kind of damage run in-process on copies
of one trained workdir.
"""

import errno
import functools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import fault_support as fs
import jax
import jax.numpy as jnp
import pytest
import repo_paths
from data_fixtures import bible_config
from orbax.checkpoint._src.futures import future as orbax_future

from realformer_jax import data
from realformer_jax.data.tokenizers import SentencePieceTokenizer
from realformer_jax.train import build, checkpoint_integrity, pretraining
from realformer_jax.train.checkpointing import Checkpointer
from realformer_jax.train.errors import CheckpointError

# Reading checkpoints in-process, orbax leaves coroutines behind (a failed restore's, or
# TensorStore callbacks that complete after orbax closed their event loop: "Event loop is
# closed"); their teardown is orbax's, not what these tests check.
# slow: the tests share the module's straight run (~9 s to build); the last one, which does
# not, runs a subprocess (~7 s).
pytestmark = [
  pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning'),
  pytest.mark.slow,
]


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """The uninterrupted run: checkpoints 4, 6, 8; every fault below must end where it ends."""
  workdir = str(tmp_path_factory.mktemp('straight'))
  returncode, out, err = fs.run(workdir)
  assert returncode == 0 and not fs.unexpected_stderr(err), out + err
  assert fs.checkpoint_entries(workdir) == ['4', '6', '8']
  return workdir


# --- restoring: each kind of damage, in-process --------------------------------------------


@functools.cache
def _setup():
  config = fs.cli_config()
  return config, build.make_setup(pretraining.validate_config(config))


def _restore_latest(workdir, setup=None):
  """(restored step, warnings) of Checkpointer.restore_latest on `workdir`."""
  config, default_setup = _setup()
  return fs.restore_latest(workdir, config, setup or default_setup)


def _state_file(step_dir):
  return fs.largest_file(os.path.join(step_dir, 'state'))


_DAMAGE = {
  'truncated': (
    lambda d: fs.truncate(_state_file(d), 1000),
    r'state/\S+ has 1000 bytes, \d+ were saved',
  ),
  'zero_length': (
    lambda d: fs.truncate(_state_file(d), 0),
    r'state/\S+ has 0 bytes, \d+ were saved',
  ),
  'missing_file': (lambda d: os.remove(_state_file(d)), r'state/\S+ is missing'),
  'flipped_bytes': (
    lambda d: fs.flip_bytes(_state_file(d), 5000),
    r'state/\S+ does not match its saved checksum \(its bytes changed\)',
  ),
  'flipped_data_position': (
    lambda d: fs.flip_bytes(os.path.join(d, 'data', 'process_0-of-1.json'), 20, 4),
    r'data/process_0-of-1\.json does not match its saved checksum \(its bytes changed\)',
  ),
  'no_commit_marker': (
    lambda d: os.remove(os.path.join(d, 'commit_success.txt')),
    r'it has no commit marker \(commit_success\.txt\): its save never '
    r'finished',
  ),
  'unreadable_checksums': (
    lambda d: fs.truncate(os.path.join(d, 'checksums.json'), 10),
    r'its checksums\.json is unreadable \(JSONDecodeError\)',
  ),
}


@pytest.mark.parametrize('damage', sorted(_DAMAGE))
def test_damaged_step_is_moved_aside_and_the_previous_one_restores(straight, tmp_path, damage):
  workdir = fs.copy_workdir(straight, tmp_path / 'w')
  damage_fn, reason = _DAMAGE[damage]
  damage_fn(os.path.join(workdir, 'checkpoints', '8'))
  evidence = {path: open(path, 'rb').read() for path in _all_files(workdir, '8')}

  state = _step_6_restores_with_8_moved_aside(
    workdir,
    rf'checkpoint step 8 in {re.escape(workdir)}/checkpoints is damaged '
    rf'\({reason}\): moved aside to 8\.damaged; trying the next older step',
  )
  # Renamed, not changed: the evidence is all there, byte for byte.
  assert {
    path.replace('/8.damaged/', '/8/'): open(path, 'rb').read()
    for path in _all_files(workdir, '8.damaged')
  } == evidence
  fs.assert_same_state(jax.device_get(state.params), fs.saved_state(straight, 6)['params'])


def _step_6_restores_with_8_moved_aside(workdir, warning_pattern: str):
  """Restores the latest step of `workdir`, whose step 8 is damaged: step 6 comes back, with
  one warning matching `warning_pattern`, and 8 is moved aside. Returns the restored state."""
  (step, state, _), warnings = _restore_latest(workdir)
  assert step == 6
  [warning] = warnings
  assert re.fullmatch(warning_pattern, warning), warning
  assert fs.checkpoint_entries(workdir) == ['4', '6', '8.damaged']
  return state


def _all_files(workdir, step_name):
  root = os.path.join(workdir, 'checkpoints', step_name)
  return [os.path.join(r, n) for r, _, names in os.walk(root) for n in names]


def test_a_step_saved_without_checksums_falls_back_when_its_restore_fails(straight, tmp_path):
  """Checkpoints written before checksums existed: the failed restore itself is the check."""
  workdir = fs.copy_workdir(straight, tmp_path / 'w')
  for step in (4, 6, 8):  # neither checksums.json nor run_record.json: the format of then
    for name in ('checksums.json', 'run_record.json'):
      os.remove(os.path.join(workdir, 'checkpoints', str(step), name))
  fs.truncate(_state_file(os.path.join(workdir, 'checkpoints', '8')), 1000)

  _step_6_restores_with_8_moved_aside(
    workdir,
    r'checkpoint step 8 in \S+ is damaged \(.+\): moved aside to 8\.damaged; '
    r'resuming from step 6',
  )


def test_when_every_restore_fails_nothing_is_moved(straight, tmp_path):
  """A restore that fails on every step is no proof of damage (here: another model's
  shapes), so the steps stay where they are and the error says so."""
  workdir = fs.copy_workdir(straight, tmp_path / 'w')
  other_model = build.make_setup(pretraining.validate_config(fs.cli_config(model__mlp_dim=48)))
  with pytest.raises(CheckpointError) as raised:
    _restore_latest(workdir, setup=other_model)
  assert re.fullmatch(
    rf'no checkpoint in {re.escape(workdir)}/checkpoints can be restored: step 8: .+; '
    r'step 6: .+; step 4: .+; the steps that failed to restore are left in place \(damaged '
    r'files, or a config that differs from the one they were saved with\); fix the config, '
    r'or move those step directories aside to start from step 0',
    str(raised.value),
  )
  assert fs.checkpoint_entries(workdir) == ['4', '6', '8']


def test_a_damaged_latest_checkpoint_resumes_from_the_previous_one_exactly(straight, tmp_path):
  """The issue's case through the CLI: the newest checkpoint has a truncated file."""
  workdir = fs.copy_workdir(straight, tmp_path / 'w')
  damaged = _state_file(os.path.join(workdir, 'checkpoints', '8'))
  fs.truncate(damaged, 1000)

  out = fs.run_saying(
    workdir,
    0,
    rf'warning: checkpoint step 8 in {re.escape(workdir)}/checkpoints is '
    r'damaged \(state/\S+ has 1000 bytes, \d+ were saved\): moved aside to '
    r'8\.damaged; trying the next older step',
  )
  assert f'resumed from the checkpoint at step 6 in {workdir}/checkpoints' in out
  assert fs.checkpoint_entries(workdir) == ['4', '6', '8', '8.damaged']
  assert os.path.getsize(damaged.replace('/8/', '/8.damaged/')) == 1000
  for step in (4, 6, 8):  # 4 and 6 untouched; 8 trained again from 6, identically
    fs.assert_same_state(fs.saved_state(workdir, step), fs.saved_state(straight, step))


def test_no_restorable_checkpoint_is_one_error_line(straight, tmp_path):
  workdir = fs.copy_workdir(straight, tmp_path / 'w')
  for step in (4, 6):
    shutil.rmtree(os.path.join(workdir, 'checkpoints', str(step)))
  fs.flip_bytes(_state_file(os.path.join(workdir, 'checkpoints', '8')), 5000)

  fs.run_saying(
    workdir,
    1,
    rf'error: no checkpoint in {re.escape(workdir)}/checkpoints can be restored: '
    r'step 8: state/\S+ does not match its saved checksum \(its bytes '
    r'changed\); they were moved aside \(8\.damaged\); rerun to start from step '
    r'0, or put back a good copy of a step',
  )
  assert fs.checkpoint_entries(workdir) == ['8.damaged']


def test_committed_steps_carry_checksums_of_every_file(straight):
  step_dir = os.path.join(straight, 'checkpoints', '8')
  assert checkpoint_integrity.problem(step_dir) is None
  listed = fs.read_json(os.path.join(step_dir, 'checksums.json'))['files']
  on_disk = {os.path.relpath(p, step_dir) for p in _all_files(straight, '8')}
  assert set(listed) == on_disk - {'checksums.json', 'commit_success.txt', '_CHECKPOINT_METADATA'}


# --- saving: a failed save stops in one line and touches nothing committed ------------------


# Both parts of a save and both causes in two runs: a permission denied in the blocking part
# (the data position's file, written before save() returns), a full disk in the background
# commit (which surfaces at the next save, step 8's).
@pytest.mark.parametrize(
  'phase, code, what, remedy',
  [
    ('blocking', 'EACCES', r'permission denied writing to {dir}', 'make it writable and rerun'),
    (
      'background',
      'ENOSPC',
      r'no space left on the device of {dir} \(\S+ \S+ free\)',
      'free space and rerun',
    ),
  ],
)
def test_a_failed_save_is_one_line_and_keeps_every_committed_step(
  straight, tmp_path, phase, code, what, remedy
):
  workdir = str(tmp_path / 'w')
  returncode, out, err = fs.run(workdir, faults=f'save_error:6:{phase}:{code}')

  assert returncode == 1, out + err
  directory = re.escape(f'{workdir}/checkpoints')
  fs.the_line(
    err,
    rf'error: saving the checkpoint at step 6 failed: '
    rf'{what.format(dir=directory)}; intact checkpoints: steps 2, 4 \(untouched\); '
    rf'{remedy} to resume from step 4',
  )
  # Nothing committed was deleted (rotation waits for a newer commit) and the failed step's
  # partial directory is gone.
  assert fs.checkpoint_entries(workdir) == ['2', '4']
  fs.assert_same_state(fs.saved_state(workdir, 4), fs.saved_state(straight, 4))
  if phase == 'background':  # then the rerun resumes from 4 and ends where the straight run did
    returncode, out, err = fs.run(workdir)
    assert returncode == 0 and not fs.unexpected_stderr(err), out + err
    assert 'resumed from the checkpoint at step 4' in out
    fs.assert_same_state(fs.saved_state(workdir, 8), fs.saved_state(straight, 8))


@fs.NEEDS_PRIVATE_MOUNTS
def test_a_restart_on_a_nearly_full_disk_is_one_line(straight, tmp_path):
  """The straight run's workdir without step 8, on a tmpfs with 64 KiB left: the restart
  rewrites no run file (config.json and the tokenizer are unchanged), trains steps 7-8 and the
  final save of step 8 meets ENOSPC inside TensorStore's background writes. The tmpfs lives in
  a private mount namespace, so the workdir is copied out before it goes."""
  mount, out_dir = tmp_path / 'tmpfs', tmp_path / 'copy'
  mount.mkdir()
  workdir = f'{mount}/w'
  command = fs.command(workdir)
  script = (
    f'mount -t tmpfs -o size=8m tmpfs {mount} && cp -a {straight} {workdir} && '
    f'rm -r {workdir}/checkpoints/8 && {{ dd if=/dev/zero of={mount}/fill bs=64k 2>/dev/null; '
    f'truncate -s -64K {mount}/fill && {{ {fs.shell_join(command)}; status=$?; '
    f'cp -a {workdir} {out_dir}; exit $status; }}; }}'
  )
  proc = fs.in_private_mounts(script)

  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert 'resumed from the checkpoint at step 6' in proc.stdout
  fs.the_line(
    proc.stderr,
    rf'error: saving the checkpoint at step 8 failed: no space left on '
    rf'the device of {re.escape(workdir)}/checkpoints \(\S+ \S+ free\); '
    r'intact checkpoints: steps 4, 6 \(untouched\); free space and rerun '
    r'to resume from step 6',
  )
  assert fs.checkpoint_entries(out_dir) == ['4', '6']  # no partial step 8 is left
  for name in (
    'config.json',
    SentencePieceTokenizer.file_name,
  ):  # cp -a kept their times: never rewritten
    assert os.stat(out_dir / name).st_mtime_ns == os.stat(os.path.join(straight, name)).st_mtime_ns
  fs.assert_same_state(fs.saved_state(out_dir, 6), fs.saved_state(straight, 6))


def test_a_failed_save_whose_writer_threads_raise_is_still_one_line(tmp_path):
  """orbax's writer threads raise their own failure again from join(): waiting for them must
  not replace the one-line error (a real full disk, in a run's final save)."""
  release = threading.Event()

  def write():  # a TensorStore write that fails while the failed save drains
    release.wait(30)
    raise ValueError('RESOURCE_EXHAUSTED: Failed writing: No space left on device')

  writer = orbax_future._SignalingThread(target=write, send_signals=[], receive_signals=[])
  writer.start()
  checkpointer = Checkpointer(str(tmp_path), keep=1)
  os.makedirs(tmp_path / 'checkpoints' / '5.orbax-checkpoint-tmp')
  threading.Timer(0.2, release.set).start()
  error = checkpointer._save_failed(5, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
  assert re.fullmatch(
    rf'saving the checkpoint at step 5 failed: no space left on the device of '
    rf'{re.escape(str(tmp_path))}/checkpoints \(\S+ \S+ free\); no checkpoint was committed '
    r'before; free space and rerun to start from step 0',
    str(error),
  ), str(error)
  assert not writer.is_alive() and os.listdir(tmp_path / 'checkpoints') == []


# --- interruptions: SIGTERM mid-evaluation and mid-save, kill -9 at random moments ---------


def test_sigterm_during_a_save_and_during_an_evaluation_then_an_exact_resume(straight, tmp_path):
  """The CLI's preemption contract (SIGTERM or a Ctrl-C saves at the step it reached and exits
  143 or 130, never 0: the run did not finish; the restart resumes there, redoing nothing), at
  its two hardest moments; a second Ctrl-C aborts at once, as does one before training starts.
  (This replaces the former test_train_preemption.py, whose plain SIGTERM case it covers.)"""
  workdir = str(tmp_path / 'w')
  # A Ctrl-C before training starts (once the data is built): one line, exit 130, nothing made.
  fs.run_saying(
    workdir,
    130,
    r'error: interrupted before training started \(nothing to save\); a rerun starts, or '
    r'resumes, as this one would have',
    faults='sigint_before_lock',
  )
  assert not os.path.exists(workdir)

  # SIGTERM while step 2's save commits in the background (held there for 3 s): training goes
  # on until a step sees the signal, which saves and exits 143; step 2 still commits.
  proc = fs.start(workdir, faults='slow_save:2:3')
  fs.wait_for_line(proc.stderr, r'^FAULT: saving step 2$', [])
  out, err = fs.terminate(proc)
  assert proc.returncode == 143, out + err
  assert not fs.unexpected_stderr(err), err
  stopped = int(re.search(r'SIGTERM: saved a checkpoint at step (\d+); exiting\.', out)[1])
  assert stopped in (3, 4, 5)  # the step-4 save waits for step 2's commit: 5 at the latest
  for step in (2, stopped):
    assert checkpoint_integrity.problem(os.path.join(workdir, 'checkpoints', str(step))) is None

  # Ctrl-C (SIGINT) does the same: while the evaluation at step 6 runs (held for 3 s before
  # it computes), it finishes, step 7 saves, exit 130.
  proc = fs.start(workdir, faults='slow_eval:6:3')
  fs.wait_for_line(proc.stderr, r'^FAULT: evaluating step 6$', [])
  out, err = fs.terminate(proc, signal.SIGINT)
  assert proc.returncode == 130, out + err
  assert not fs.unexpected_stderr(err), err
  assert f'resumed from the checkpoint at step {stopped}' in out
  assert 'eval  step 6:' in out and 'SIGINT: saved a checkpoint at step 7; exiting.' in out

  # A second Ctrl-C aborts at once (here in the final evaluation, after step 8 is saved): one
  # line, exit 130, nothing lost.
  proc = fs.start(workdir, faults='slow_eval:8:30')
  fs.wait_for_line(proc.stderr, r'^FAULT: evaluating step 8$', [])
  for _ in range(40):  # until it has seen two (two close together can arrive as one)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    if proc.poll() is not None:
      break
  out, err = proc.communicate(timeout=60)  # 130 only if it ended before the 30 s evaluation
  assert proc.returncode == 130, out + err
  fs.the_line(
    err,
    r'error: interrupted twice: stopped without saving; a rerun resumes from the checkpoint at '
    r'step 8',
  )
  assert 'resumed from the checkpoint at step 7' in out and 'eval  step 8:' not in out
  # The first Ctrl-C said at once what it does (while the evaluation held the main thread).
  assert 'Ctrl-C: stopping after the step in progress' in out
  # Step 8, committed before the evaluation, is the uninterrupted run's (no rerun needed: the
  # restores above, and the kill test's, show that a committed step resumes).
  assert checkpoint_integrity.problem(os.path.join(workdir, 'checkpoints', '8')) is None
  fs.assert_same_state(fs.saved_state(workdir, 8), fs.saved_state(straight, 8))


def test_kill_9_at_random_moments_then_the_parameters_of_the_uninterrupted_run(straight, tmp_path):
  """Three kill -9s, each at a random step line plus a random delay (so inside a step, a save
  or an evaluation), each followed by a restart; the stale lock of the killed run never
  blocks it. The seed is printed for a failure's reproduction."""
  seed = random.randrange(1 << 30)
  print(f'kill -9 moments: random.Random({seed})')
  rng = random.Random(seed)
  workdir = str(tmp_path / 'w')
  for _ in range(3):
    proc = fs.start(workdir)
    seen = []
    try:
      first = int(
        fs.wait_for_line(proc.stdout, r'^training steps \d+-8', seen).split()[2].split('-')[0]
      )
      fs.wait_for_line(proc.stdout, rf'^step +{rng.randint(first, 8)}/8 ', seen)
      time.sleep(rng.uniform(0.0, 0.5))  # inside the next step, a save or an evaluation
    except AssertionError:
      pass  # the run had nothing left to train
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert 'error' not in err and 'Traceback' not in err, ''.join(seen) + out + err
  returncode, out, err = fs.run(workdir)
  assert returncode == 0, out + err
  assert not re.search(r'^(error|warning):|Traceback', err, re.M), err  # nothing fell back
  # No partial or damaged step is left. (A kill in the middle of rotation can leave part of an
  # older step, 2, which the next save's rotation deletes; orbax then warns about its metadata.)
  entries = fs.checkpoint_entries(workdir)
  assert entries[-3:] == ['4', '6', '8'] and set(entries[:-3]) <= {'2'}, entries
  fs.assert_same_state(fs.saved_state(workdir, 8), fs.saved_state(straight, 8))


_LIBRARY_RUN = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import conftest  # the suite's JAX settings
from train_fixtures import tiny_config
from realformer_jax import train

def on_log(step, stop, scalars):
  if step == 3:
    os.kill(os.getpid(), signal.SIGTERM)

config = tiny_config(train__num_train_steps=8, train__log_every_steps=1,
                     train__checkpoint_every_steps=100, train__eval_every_steps=100)
config.data.data_dir = {data_dir!r}
result = train.train_and_evaluate(config, {workdir!r}, on_log=on_log)
print('returned', result)
"""


def test_sigterm_in_library_use_saves_then_ends_the_process(tmp_path):
  """train_and_evaluate called from Python (not the CLI): SIGTERM waits for the end of the
  step, the checkpoint is saved and committed, then the signal ends the process as it would
  have without the loop, instead of returning a result its caller takes for a finished run."""
  workdir = str(tmp_path / 'w')
  script = _LIBRARY_RUN.format(
    tests=repo_paths.TESTS, data_dir=fs.bible_config().data_dir, workdir=workdir
  )
  data.prepare(bible_config())
  proc = subprocess.run(
    [sys.executable, '-c', script],
    cwd=fs.REPO,
    env=fs.env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == -signal.SIGTERM, proc.stdout + proc.stderr
  assert 'SIGTERM: saved a checkpoint at step 4; exiting.' in proc.stdout
  assert 'returned' not in proc.stdout
  assert fs.checkpoint_entries(workdir) == ['4']
  assert checkpoint_integrity.problem(os.path.join(workdir, 'checkpoints', '4')) is None

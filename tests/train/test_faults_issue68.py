"""Issue 68, through the real commands where a run is needed (experiments.train, export_hf at
toy size), deterministically (a lock held, a step without its commit marker; never timing):

- an export reads a finished step only, under a read lock the run's rotation respects: a step
  a reader holds outlives rotation, a step being rotated away is not opened, a step being
  written by the live run is skipped (named in one note), never called damaged;
- export_hf --out inside any run's checkpoints/ is refused, not only its own;
- a resume that replaces the user's tokenizer.model or config.json, or changes the batch or
  the masking, says so in one note; a damaged loss_reference.json is named and rebuilt.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import types

import fault_support as fs
import pytest
from train_fixtures import REPO

from realformer_jax.interop import hf_export
from realformer_jax.train import checkpointing, workdir_lock
from realformer_jax.train.errors import CheckpointError


def _fake_run(tmp_path, steps=(2, 4, 6)):
  """A workdir with committed steps (their files are not read here)."""
  workdir = tmp_path / 'fake'
  for step in steps:
    (workdir / 'checkpoints' / str(step)).mkdir(parents=True)
    (workdir / 'checkpoints' / str(step) / 'commit_success.txt').write_text('')
  return str(workdir)


def _infos(*steps):
  return [types.SimpleNamespace(step=s) for s in steps]


def test_rotation_spares_a_step_a_reader_holds_and_readers_skip_a_doomed_one(tmp_path):
  workdir = _fake_run(tmp_path)
  directory = os.path.join(workdir, 'checkpoints')
  reader = checkpointing.Checkpointer(workdir, keep=1, writer=False)
  rotation = checkpointing._SparingReaders(directory, keep=1)  # pylint: disable=protected-access
  try:
    with reader.reading(2) as step:  # an export reading step 2
      assert step == 2
      # keep=1 would delete 2 and 4; 2 is being read, so only 4 goes (2 at a later save).
      assert rotation.should_preserve(_infos(2, 4, 6), context=None) == [True, False, True]
      # Step 4's deletion is decided (orbax deletes it after the save commits): not opened.
      with pytest.raises(CheckpointError, match=r'step 4 in .* is being deleted by the live run'):
        with reader.reading(4):
          pass
      with reader.reading() as newest:
        assert newest == 6
    rotation.release()  # the next save: 2 is free now
    assert rotation.should_preserve(_infos(2, 6), context=None) == [False, True]
  finally:
    rotation.release()
    reader.close()


def test_a_step_being_written_by_the_live_run_is_skipped_not_damaged(tmp_path, capsys):
  workdir = _fake_run(tmp_path)
  os.remove(os.path.join(workdir, 'checkpoints', '6', 'commit_success.txt'))
  reader = checkpointing.Checkpointer(workdir, keep=3, writer=False)
  lock = workdir_lock.WorkdirLock(workdir).acquire()  # the live run
  try:
    with reader.reading() as step:
      assert step == 4
    assert capsys.readouterr().err.splitlines() == [
      f'note: checkpoint step 6 in {workdir}/checkpoints is being written by the live run (no '
      'commit marker yet): skipped'
    ]
  finally:
    lock.release()
    reader.close()
  with reader.reading() as step:  # no live run: a step without its marker is damaged
    assert step == 4
  assert 'is damaged (it has no commit marker' in capsys.readouterr().err


def test_export_out_inside_another_runs_checkpoints_is_refused(tmp_path):
  other = _fake_run(tmp_path)
  os.rename(other, tmp_path / 'other')
  (tmp_path / 'other' / 'checkpoints' / '4' / 'run_record.json').write_text('{}')
  out = str(tmp_path / 'other' / 'checkpoints' / '4' / 'hf')
  with pytest.raises(hf_export.ExportError) as raised:
    hf_export.check_out_dir(out, str(tmp_path / 'mine'))
  assert str(raised.value) == (
    f'--out {out}: inside checkpoints/ of the run in {tmp_path}/other, whose contents that run '
    'manages (old checkpoint steps are rotated away, damaged ones renamed): the export could be '
    'deleted with them; name a directory outside it'
  )
  hf_export.check_out_dir(str(tmp_path / 'other' / 'hf'), str(tmp_path / 'mine'))  # beside it
  os.makedirs(tmp_path / 'notes' / 'checkpoints')  # a folder of that name in no run: fine
  hf_export.check_out_dir(str(tmp_path / 'notes' / 'checkpoints' / 'hf'), str(tmp_path / 'mine'))


# --- through the real commands ---------------------------------------------------------------


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  return fs.trained_workdir(tmp_path_factory, 'issue68')[0]


@pytest.mark.slow  # a trained toy workdir and CLI subprocesses
def test_export_of_a_live_run_skips_the_step_being_written_and_records_truth(trained, tmp_path):
  """The newest step directory has no commit marker and the run holds its workdir: the export
  names it in one note and exports the step before, verified, its corpus recorded."""
  workdir = fs.copy_workdir(trained, tmp_path / 'run')
  writing = os.path.join(workdir, 'checkpoints', '6')
  shutil.copytree(os.path.join(workdir, 'checkpoints', '4'), writing)
  for name in ('commit_success.txt', 'checksums.json'):
    os.remove(os.path.join(writing, name))
  lock = workdir_lock.WorkdirLock(workdir).acquire()
  try:
    result = fs.cli('experiments.export_hf', f'--workdir={workdir}', f'--out={tmp_path / "hf"}')
  finally:
    lock.release()
  assert result.returncode == 0, result.stderr
  assert fs.unexpected_stderr(result.stderr) == [
    f'note: checkpoint step 6 in {workdir}/checkpoints is being written by the live run (no '
    'commit marker yet): skipped'
  ]
  source = fs.read_json(tmp_path / 'hf' / hf_export.SOURCE_FILE)['source']
  assert source['step'] == 4 and source['checksums'].startswith('verified')
  assert source['corpus']


@pytest.mark.slow
def test_export_into_another_runs_checkpoints_is_one_line(trained, tmp_path):
  workdir = fs.copy_workdir(trained, tmp_path / 'run')
  other = fs.copy_workdir(trained, tmp_path / 'other')
  for name in ('config.json', 'run.lock'):  # a finished run's steps still record it
    if os.path.exists(os.path.join(other, name)):
      os.remove(os.path.join(other, name))
  out = os.path.join(other, 'checkpoints', '2', 'hf')
  result = fs.cli('experiments.export_hf', f'--workdir={workdir}', f'--out={out}')
  assert result.returncode == 1
  fs.the_line(
    result.stderr, re.escape(f'error: --out {out}: inside checkpoints/ of the run in ') + '.*'
  )
  assert not os.path.exists(out)


@pytest.mark.slow
def test_a_step_being_read_outlives_the_runs_rotation(trained, tmp_path):
  """An export holding step 2 while the run resumes with keep_checkpoints=1: step 2 stays."""
  workdir = fs.copy_workdir(trained, tmp_path / 'run')
  reader = checkpointing.Checkpointer(workdir, keep=1, writer=False)
  try:
    with reader.reading(2):
      code, out, err = fs.run(
        workdir, **dict(fs.TRAINED, train__num_train_steps=8, train__keep_checkpoints=1)
      )
  finally:
    reader.close()
  assert code == 0, out + err
  assert fs.committed_steps(workdir) == [2, 8]  # 4 and 6 rotated away, 2 spared


@pytest.mark.slow
def test_a_resume_says_what_it_replaced_and_that_batches_changed(trained, tmp_path):
  """An edited config.json and a swapped tokenizer.model are put back by the resume (training
  is right), each said in one note; another batch size and masking too."""
  workdir = fs.copy_workdir(trained, tmp_path / 'run')
  config_path = os.path.join(workdir, 'config.json')
  edited = fs.read_json(config_path)
  edited['train']['log_every_steps'] = 7
  with open(config_path, 'w') as f:
    json.dump(edited, f)
  tokenizer_path = os.path.join(workdir, 'tokenizer.model')
  with open(tokenizer_path, 'rb') as f:
    ours = f.read()
  with open(tokenizer_path, 'wb') as f:
    f.write(b'another tokenizer')
  reference = os.path.join(workdir, 'loss_reference.json')
  with open(reference, 'w') as f:
    f.write('{"loss": 8.')  # damaged
  code, out, err = fs.run(
    workdir,
    **dict(fs.TRAINED, train__num_train_steps=6),
    train__global_batch_size=4,
    data__max_predictions=3,
  )
  assert code == 0, out + err
  notes = [line for line in out.splitlines() if line.startswith('note:')]
  assert (
    'note: the resumed steps train on other batches (train.global_batch_size 8 -> 4, '
    'data.max_predictions 5 -> 3) than checkpoint step 4 was trained with: from step 4 on, '
    'each step sees that many sequences and masked tokens; the loss curve may step there'
  ) in notes
  assert (
    f'note: {config_path} is not the config checkpoint step 4 records (train.log_every_steps 1 '
    "-> 7; recorded -> as found): replaced by this run's; it trains with the recorded config "
    'and the flags given'
  ) in notes
  assert (
    f"note: {reference} is damaged (JSONDecodeError): the explosion rule judges by this run's "
    "first loss instead of the run's step-1 loss, recorded there again with its step"
  ) in notes
  assert fs.read_json(reference)['step'] == 5  # rebuilt from the resumed run's first step
  swapped = [n for n in notes if n.startswith(f'note: {tokenizer_path} is not the run')]
  assert len(swapped) == 1 and swapped[0].endswith("replaced by the run's own"), notes
  with open(tokenizer_path, 'rb') as f:
    assert f.read() == ours
  assert fs.read_json(config_path)['train']['log_every_steps'] == 1

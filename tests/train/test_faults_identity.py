"""Fault injection, issue 41 without a trained model (fast): what a resume, an export, a save,
a fine-tuning starting point and experiments.translate check before they touch anything.

- a missing or truncated config.json beside checkpoints refuses the resume in one line (the
  model's dtype, dropout or LN placement are in no checkpoint);
- a truncated config.json read by export_hf or finetune.init is one line;
- export_hf --out that is the workdir, a run's directory, a file, under a file or unwritable;
- a save whose step directory cannot be made (read-only, no inodes) fails at once in one line;
- the explosion rule (divergence.py) and where its dead end is;
- a fine-tuning run resumed from another starting point than it started from;
- experiments.translate: positional arguments, and a result or workdir of another config.
"""

import errno
import json
import os
import subprocess
import sys

import pytest
from train_fixtures import REPO, tiny_config

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.finetune import starting_point
from realformer_jax.interop import hf_export
from realformer_jax.train import checkpointing, divergence, pretrained, resume_checks, run_identity
from realformer_jax.train.errors import CheckpointError, DivergenceError

_MODEL = ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64)


def _run_dir(tmp_path, config_text=None):
  """A workdir with a committed checkpoint (its files are not read here) and config.json."""
  workdir = tmp_path / 'run'
  (workdir / 'checkpoints' / '8').mkdir(parents=True)
  (workdir / 'checkpoints' / '8' / 'commit_success.txt').write_text('')
  if config_text is not None:
    (workdir / 'config.json').write_text(config_text)
  return str(workdir)


# --- a resume's model check (issue 41 item 7) ------------------------------------------------


def test_checkpoints_without_config_json_refuse_the_resume_in_one_line(tmp_path):
  workdir = _run_dir(tmp_path)
  with pytest.raises(ConfigError) as raised:
    resume_checks.check_resumable(_MODEL, workdir, latest_step=8)
  message = str(raised.value)
  # No advice to restore it "from a copy": steps without a record (saved before records) cannot
  # tell the run's own config.json from a sibling run's.
  assert message == (
    f'{workdir} holds checkpoints (latest step 8, saved before steps recorded their model) but '
    'no config.json, so the model they were trained with cannot be compared with this config: '
    "put back the run's own config.json, or use a new --workdir; the checkpoints are untouched"
  )
  assert '\n' not in message
  resume_checks.check_resumable(
    _MODEL, str(tmp_path / 'new'), latest_step=None
  )  # a new run: nothing


@pytest.mark.parametrize('text', ['{"model": {"dtype": "float', '[]', '{"train": {}}'])
def test_a_truncated_or_foreign_config_json_refuses_the_resume_in_one_line(tmp_path, text):
  workdir = _run_dir(tmp_path, text)
  with pytest.raises(ConfigError, match=r'config\.json is unreadable \(\w+: truncated or damaged'):
    resume_checks.check_resumable(_MODEL, workdir, latest_step=8)


def test_an_empty_uncommitted_step_is_not_the_resume_step(tmp_path):
  workdir = _run_dir(tmp_path)
  os.mkdir(os.path.join(workdir, 'checkpoints', '100'))  # no commit marker, no files
  checkpointer = checkpointing.Checkpointer(workdir, keep=3, writer=False)
  try:
    assert checkpointer.all_steps() == [8, 100]  # orbax lists it
    assert checkpointer.latest_committed_step() == 8  # what a resume starts from
  finally:
    checkpointer.close()


@pytest.mark.parametrize('text', ['{"model": {"dtype": "flo', '[1, 2]'])
def test_a_truncated_config_json_read_by_export_or_finetune_init_is_one_line(tmp_path, text):
  workdir = _run_dir(tmp_path, text)
  with pytest.raises(ConfigError, match=r'config\.json: (unreadable|not a config)') as raised:
    pretrained.read_config(workdir)
  assert '\n' not in str(raised.value)
  if text.startswith('{'):  # issue 59: not "a copy", which a sibling run's would be
    assert str(raised.value).endswith(
      "put back the run's own copy (not a sibling run's: its model could differ)"
    )
  config = tiny_config()
  config.finetune = {'init': workdir, 'init_step': -1, 'hf_config': ''}
  with pytest.raises(ConfigError, match=r'config\.json: (unreadable|not a config)'):
    starting_point.StartingPoint.from_config(config.finetune)


# --- export_hf --out (issue 41 item 3 and the Ugly list) ------------------------------------


def test_export_out_that_holds_a_run_is_refused(tmp_path):
  workdir = _run_dir(tmp_path, json.dumps({'model': {}, 'train': {}}))
  with pytest.raises(hf_export.ExportError, match=r'that is the workdir'):
    hf_export.check_out_dir(workdir, workdir)
  with pytest.raises(hf_export.ExportError, match=r'that is the workdir'):
    hf_export.check_out_dir(workdir + '/../run/', workdir)
  other = tmp_path / 'other'
  os.makedirs(other / 'checkpoints')
  with pytest.raises(
    hf_export.ExportError, match=r'holds the files of a training run \(checkpoints\)'
  ):
    hf_export.check_out_dir(str(other), workdir)
  (tmp_path / 'copy').mkdir()  # a copy of a run's config.json is a run's file too
  (tmp_path / 'copy' / 'config.json').write_text('{"model": {}, "train": {}}')
  with pytest.raises(hf_export.ExportError, match=r'training run \(config\.json\)'):
    hf_export.check_out_dir(str(tmp_path / 'copy'), workdir)
  # An export's own config.json (transformers') is replaced by the next export.
  (tmp_path / 'hf').mkdir()
  (tmp_path / 'hf' / 'config.json').write_text('{"model_type": "bert"}')
  hf_export.check_out_dir(str(tmp_path / 'hf'), workdir)


def test_export_out_a_file_under_a_file_or_unwritable_is_one_line(tmp_path, monkeypatch):
  (tmp_path / 'f').write_text('x')
  with pytest.raises(hf_export.ExportError, match=r'^--out \S+/f: a file, not a directory$'):
    hf_export.check_out_dir(str(tmp_path / 'f'), 'w')
  with pytest.raises(hf_export.ExportError, match=r'^--out \S+/f/hf: \S+/f is a file, not a'):
    hf_export.check_out_dir(str(tmp_path / 'f' / 'hf'), 'w')
  monkeypatch.setattr(hf_export.os, 'access', lambda path, mode: False)  # root passes chmod
  with pytest.raises(hf_export.ExportError, match=r'is not writable \(read-only or permissions\)'):
    hf_export.check_out_dir(str(tmp_path / 'new' / 'hf'), 'w')


# --- a save that cannot make its step directory (the Ugly list) -----------------------------


@pytest.mark.parametrize(
  'code, cause',
  [
    (errno.EROFS, r'permission denied writing to \S+/checkpoints; no checkpoint was committed '),
    (errno.ENOSPC, r'no space left on the device of \S+/checkpoints \(.+ free\); no checkpoint'),
  ],
)
def test_a_save_that_cannot_make_its_directory_fails_at_once_in_one_line(
  tmp_path, monkeypatch, code, cause
):
  checkpointer = checkpointing.Checkpointer(str(tmp_path), keep=2)
  real_mkdir = os.mkdir

  def mkdir(path, *args, **kwargs):  # what a read-only checkpoints/ or a full inode table does
    if os.path.basename(str(path)).startswith('.probe-'):
      raise OSError(code, os.strerror(code), str(path))
    return real_mkdir(path, *args, **kwargs)

  monkeypatch.setattr(checkpointing.os, 'mkdir', mkdir)
  # Never reaches orbax (whose barrier would wait 300 s): the state is not even looked at.
  with pytest.raises(CheckpointError, match=rf'^saving the checkpoint at step 5 failed: {cause}'):
    checkpointer.save(None, None, None, step=5)
  assert os.listdir(checkpointer.directory) == []


def test_no_free_inodes_is_named(tmp_path, monkeypatch):
  checkpointer = checkpointing.Checkpointer(str(tmp_path), keep=2)
  monkeypatch.setattr(checkpointing, '_no_free_inodes', lambda directory: True)
  monkeypatch.setattr(
    checkpointing.os,
    'mkdir',
    lambda path, *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, 'No space left on device')),
  )
  with pytest.raises(CheckpointError, match=r'no free inodes left on the device of \S+ \('):
    checkpointer.save(None, None, None, step=5)


# --- the explosion rule (issue 41 item 5) ---------------------------------------------------


class _Reference(divergence.LossReference):
  def __init__(self, loss=None):
    self.path, self.loss = '/nonexistent/' + divergence.REFERENCE_FILE, loss


_OK = {'grads_finite': True, 'state_finite': True}


def test_a_finite_explosion_right_after_a_checkpoint_names_it_as_the_dead_end():
  reference = _Reference()
  divergence.check_finite(1, 8.3, _OK, None, reference)  # step 1 sets the reference
  assert reference.loss == 8.3
  divergence.check_finite(2, 8.3 * divergence.EXPLOSION_FACTOR, _OK, 1, reference)  # at the limit
  with pytest.raises(DivergenceError) as raised:
    divergence.check_finite(3, 3.3e12, _OK, 2, reference)
  assert raised.value.dead_end == 2 and raised.value.step == 3
  assert str(raised.value).startswith(
    "exploded loss 3.3e+12 (above 83: 10x the run's first loss 8.3, loss_reference.json) at "
    'step 3, right after the checkpoint at step 2'
  )
  # Checkpoints older than the step before were judged by the steps after them: kept.
  with pytest.raises(DivergenceError, match=r'last good checkpoint: step 1\)$') as raised:
    divergence.check_finite(3, 3.3e12, _OK, 1, reference)
  assert raised.value.dead_end is None


def test_the_reference_is_read_back_and_floored(tmp_path):
  reference = divergence.LossReference(str(tmp_path))
  assert reference.loss is None
  assert reference.threshold(1, 0.01) == divergence.EXPLOSION_FACTOR * divergence.EXPLOSION_FLOOR
  assert json.load(open(tmp_path / divergence.REFERENCE_FILE))['loss'] == 0.01
  assert divergence.LossReference(str(tmp_path)).loss == 0.01  # a resumed run judges the same
  resumed = divergence.LossReference(str(tmp_path / 'old'))  # no file, resumed at step 40
  resumed.threshold(41, 5.0)
  assert not os.path.exists(tmp_path / 'old' / divergence.REFERENCE_FILE)


# --- a fine-tuning run's starting point (issue 41 "artifact identity") ----------------------


def test_a_resumed_finetuning_run_refuses_another_starting_point(tmp_path):
  workdir = str(tmp_path / 'ft')
  first = {'workdir': '/p', 'step': 8, 'checksums': 'verified', 'config_digest': 'a', 'corpus': 'c'}
  assert starting_point.record_or_check(workdir, first, init_step=-1) == first
  os.makedirs(os.path.join(workdir, 'checkpoints', '10'))
  # The pretraining run saved newer steps since: with init_step=-1 the same source.
  assert starting_point.record_or_check(workdir, dict(first, step=12), init_step=-1) == first
  with pytest.raises(ConfigError, match=r'fine-tunes from another starting point .*step 8 -> 12'):
    starting_point.record_or_check(workdir, dict(first, step=12), init_step=12)
  with pytest.raises(ConfigError, match=r"config_digest 'a' -> 'b'"):
    starting_point.record_or_check(workdir, dict(first, config_digest='b'), init_step=-1)


def test_config_differences_name_each_changed_field():
  a = {'model': {'hidden_size': 32, 'dtype': 'float32'}, 'train': {'learning_rate': 0.001}}
  b = {'model': {'hidden_size': 32, 'dtype': 'bfloat16'}, 'train': {'learning_rate': 0.002}}
  assert run_identity.config_differences(a, b) == [
    "model.dtype 'float32' -> 'bfloat16'",
    'train.learning_rate 0.001 -> 0.002',
  ]
  assert run_identity.config_digest(a) != run_identity.config_digest(b)
  assert run_identity.config_digest(a) == run_identity.config_digest(json.loads(json.dumps(a)))


# --- experiments.translate (issue 41 item 6 and the Ugly list) ------------------------------


@pytest.mark.slow  # a subprocess that imports the whole stack (~10 s, minutes when loaded)
def test_translate_refuses_positional_arguments_in_one_line():
  result = subprocess.run(
    [sys.executable, '-m', 'experiments.translate', 'configs/translate.py:gpu'],
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 1
  assert result.stderr.strip() == (
    "error: unexpected arguments ['configs/translate.py:gpu']: every argument is a flag "
    '(--config=FILE[:arg], ...)'
  )


def test_translate_refuses_a_result_or_workdir_of_another_config(tmp_path):
  from realformer_jax.commands import translate  # pylint: disable=import-outside-toplevel
  from realformer_jax.configs import translate as translate_config  # pylint: disable=import-outside-toplevel

  config = translate_config.get_config('cpu')
  study = translate.validate_study(config)
  runs = translate.grid(study)
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  os.makedirs(os.path.join(out, 'runs'))
  for run in runs:  # a finished grid, as Grid writes it
    with open(os.path.join(out, 'runs', f'{run.name}.json'), 'w') as f:
      json.dump({**translate.run_record(study, run), 'test_bleu_beam': 1.0}, f)
  translate.check_finished_runs(study, out, workdirs, runs)  # the same config: done

  config.train.learning_rate = 2 * config.train.learning_rate
  changed = translate.validate_study(config)
  with pytest.raises(
    ConfigError,
    match=r'^--out \S+: \S+/runs/standard-s0\.json is the result of another config '
    r'\(train\.learning_rate 0\.003 -> 0\.006\); use another --out',
  ):
    translate.check_finished_runs(changed, out, workdirs, translate.grid(changed))
  config.train.learning_rate /= 2
  config.model.num_layers = 2  # a changed model
  with pytest.raises(ConfigError, match=r'model\.num_layers 3 -> 2'):
    translate.check_finished_runs(
      translate.validate_study(config), out, workdirs, translate.grid(changed)
    )

  # A workdir of another config (no result yet): never resumed or evaluated as this one.
  config.model.num_layers = 3
  os.makedirs(os.path.join(workdirs, 'standard-s0'))
  saved = dict(translate.run_record(changed, runs[0])['spec'])
  with open(os.path.join(workdirs, 'standard-s0', 'config.json'), 'w') as f:
    json.dump(saved, f)
  os.remove(os.path.join(out, 'runs', 'standard-s0.json'))
  with pytest.raises(ConfigError, match=r'^--workdirs \S+: \S+standard-s0 holds run standard-s0 '):
    translate.check_finished_runs(study, out, workdirs, runs)

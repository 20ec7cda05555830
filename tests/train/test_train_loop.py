"""The training loop end to end on the real pipeline (embedded corpus, tiny model): loss falls,
TensorBoard files read back, resume replays the straight run exactly, a non-finite loss stops
training without touching the last good checkpoint (as does a non-finite state), and a workdir
refuses to resume another model, or a schedule that ends before its checkpoints, before anything
is compiled."""

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_fixtures import shared_compiles, tiny_config  # noqa: F401  (a fixture)

from realformer_jax import data, train
from realformer_jax.config import ConfigError
from realformer_jax.train import loop, resume_checks

pytestmark = pytest.mark.usefixtures('shared_compiles')  # the runs repeat tiny_config's steps


def _saved_params(workdir, step):
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  return ocp.StandardCheckpointer().restore(path)['params']


def _trained_to_step_2(workdir):
  """The parameters a run stopped at step 2 saved there (its only checkpoint)."""
  train.train_and_evaluate(
    tiny_config(train__stop_at_step=2, train__checkpoint_every_steps=2), workdir
  )
  return _saved_params(workdir, 2)


def _data_position(workdir, step):
  return data.saved_train_state(os.path.join(workdir, 'checkpoints', str(step), 'data'))


@pytest.fixture
def recorded_batches(monkeypatch):
  """input_ids of every batch the compiled train step receives, in order."""
  batches = []
  real_compile = loop.build.compile_train_step

  def compile_and_record(setup):
    compiled = real_compile(setup)

    def step(state, batch, rng):
      batches.append(np.asarray(batch['input_ids']))
      return compiled(state, batch, rng)

    return step

  monkeypatch.setattr(loop.build, 'compile_train_step', compile_and_record)
  return batches


@pytest.mark.slow
def test_trains_on_the_real_pipeline_and_writes_tensorboard(tmp_path, capsys):
  workdir = str(tmp_path)
  result = train.train_and_evaluate(
    tiny_config(
      train__num_train_steps=24,
      train__warmup_steps=4,
      train__log_every_steps=4,
      train__eval_every_steps=12,
      train__checkpoint_every_steps=8,
      train__keep_checkpoints=2,
    ),
    workdir,
  )

  scalars = train.read_scalars(workdir)
  losses = [value for _, value in scalars['train/loss']]
  assert [step for step, _ in scalars['train/loss']] == [1, 4, 8, 12, 16, 20, 24]  # and the 1st
  assert losses[-1] < losses[0] - 0.3, losses
  assert [step for step, _ in scalars['eval/mlm_accuracy']] == [12, 24]
  assert scalars['eval/loss'][-1][1] == pytest.approx(result['eval/loss'], rel=1e-6)
  assert scalars['eval/baseline_mlm_accuracy'][0][1] == pytest.approx(result['baseline'])
  assert scalars['eval/loss'][-1][1] < np.log(8000)  # below the uniform-prediction loss
  for tag in ('train/learning_rate', 'train/grad_norm', 'train/tokens_per_sec'):
    # Step 1 applied the warmup's first learning rate, 0.
    assert all(np.isfinite(v) and v > 0 for step, v in scalars[tag] if step > 1), tag
  assert scalars['train/learning_rate'][0] == (1, 0.0)

  out = capsys.readouterr().out
  assert 'step 24/24 | loss' in out and 'tok/s | ETA' in out
  assert 'training steps 1-24: the first step is running' in out
  assert (
    f'final eval MLM accuracy {result["eval/mlm_accuracy"]:.4f} vs most-frequent-token '
    f'baseline {result["baseline"]:.4f}'
  ) in out
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['16', '24']  # last 2
  assert json.load(open(os.path.join(workdir, 'config.json')))['train']['num_train_steps'] == 24


@pytest.mark.slow
def test_resume_replays_the_straight_run(tmp_path, recorded_batches):
  # Dropout on: identical params also need the restored PRNG key and the data position.
  config = tiny_config(train__num_train_steps=8)
  straight = train.train_and_evaluate(config, str(tmp_path / 'straight'))
  straight_batches = list(recorded_batches)
  recorded_batches.clear()

  split_dir = str(tmp_path / 'split')
  first = train.train_and_evaluate(
    tiny_config(train__num_train_steps=8, train__stop_at_step=4), split_dir
  )
  assert first['step'] == 4
  resumed = train.train_and_evaluate(config, split_dir)
  assert resumed['step'] == 8

  assert len(straight_batches) == len(recorded_batches) == 8
  for a, b in zip(straight_batches, recorded_batches):
    np.testing.assert_array_equal(a, b)
  jax.tree.map(
    np.testing.assert_array_equal,
    _saved_params(str(tmp_path / 'straight'), 8),
    _saved_params(split_dir, 8),
  )
  assert _data_position(str(tmp_path / 'straight'), 8) == _data_position(split_dir, 8)
  assert resumed['eval/mlm_accuracy'] == straight['eval/mlm_accuracy']
  assert resumed['eval/loss'] == straight['eval/loss']


@pytest.mark.slow
def test_non_finite_loss_or_state_stops_and_keeps_the_last_good_checkpoint(
  tmp_path, monkeypatch, capsys
):
  workdir = str(tmp_path)
  good = _trained_to_step_2(workdir)
  # Resumed with an absurd learning rate: step 3's update explodes (its state is finite, so it
  # is saved), step 4's loss is not finite. Every resume from step 3 would replay step 4, so
  # step 3 is set aside and a rerun resumes from step 2.
  with pytest.raises(
    train.DivergenceError,
    match=r'^non-finite loss nan at step 4, right after the checkpoint at step 3, which every '
    r"resume would replay exactly \(a step's loss and gradients depend only on the state, "
    r'batch and key it restores\); stopped without saving; moved that checkpoint aside to '
    r'3\.diverged: a rerun resumes from step 2$',
  ) as raised:
    train.train_and_evaluate(
      tiny_config(
        train__learning_rate=1e30, train__checkpoint_every_steps=1, train__keep_checkpoints=2
      ),
      workdir,
    )
  assert raised.value.step == 4  # as data: a study records it (realformer_jax/studies/study.py)
  assert isinstance(raised.value, train.TrainingError)  # the CLIs' one-line error
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '3.diverged']
  jax.tree.map(np.testing.assert_array_equal, good, _saved_params(workdir, 2))

  # learning_rate=1e39 is inf in float32: validation refuses it (test_train_errors.py); let it
  # through to reach the guard behind that. Step 3's loss and gradients come from step 2's
  # parameters, so they are finite; the parameters step 3 writes are not.
  monkeypatch.setattr(loop.train_config, 'check_optimizer_dtypes', lambda *args: None)
  with pytest.raises(
    train.DivergenceError,
    match=r'^non-finite parameters or optimizer state after the update at step 3; stopped '
    r'without saving \(last good checkpoint: step 2\)$',
  ):
    train.train_and_evaluate(
      tiny_config(
        train__learning_rate=1e39, train__checkpoint_every_steps=1, train__keep_checkpoints=1
      ),
      workdir,
    )
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '3.diverged']
  jax.tree.map(np.testing.assert_array_equal, good, _saved_params(workdir, 2))
  # Compared with the schedule step 2 was saved with (its run_record.json), not with the
  # config.json that the last run (learning_rate=1e30) wrote.
  assert (
    'note: the resumed schedule changed (train.learning_rate 0.003 -> 1e+39): it now ends at '
    'step 8 (was 8); learning rate at the restored step 2: 3.00e-03 -> inf'
  ) in capsys.readouterr().out
  # A corrected config resumes from the last good checkpoint.
  assert train.train_and_evaluate(tiny_config(train__stop_at_step=3), workdir)['step'] == 3
  assert 'resumed from the checkpoint at step 2' in capsys.readouterr().out
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(_saved_params(workdir, 3)))


@pytest.mark.slow
def test_resuming_another_model_is_a_config_error_that_keeps_the_checkpoint(
  tmp_path, monkeypatch, capsys
):
  workdir = str(tmp_path)
  good = _trained_to_step_2(workdir)
  monkeypatch.setattr(
    loop.build, 'resolve', lambda *a, **k: pytest.fail('compiled before checking the workdir')
  )
  config = tiny_config()
  config.model.hidden_size *= 2
  with pytest.raises(
    ConfigError,
    match=(
      r'holds checkpoints \(latest step 2\) of another model: model.hidden_size=\d+ '
      r'\(checkpoint step 2 has \d+\); use a new --workdir'
    ),
  ):
    train.train_and_evaluate(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2']
  jax.tree.map(np.testing.assert_array_equal, good, _saved_params(workdir, 2))
  assert json.load(open(os.path.join(workdir, 'config.json')))['model'] == json.loads(
    tiny_config().model.to_json_best_effort()
  )

  # Nor a schedule that ends before the checkpoints (it would only evaluate them and exit).
  with pytest.raises(
    ConfigError,
    match=r'^train\.num_train_steps=1: below step 2, where the checkpoints in .+ end; set it '
    r'to 2 or more to resume them, or use a new --workdir$',
  ):
    train.train_and_evaluate(tiny_config(train__num_train_steps=1, train__warmup_steps=1), workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2']
  # A longer schedule resumes, and says what changed at the restored step (the loop prints it).
  same, longer = (
    train.validate_config(tiny_config(train__stop_at_step=2, **overrides)).train
    for overrides in ({}, dict(train__num_train_steps=16, train__warmup_steps=4))
  )
  assert resume_checks.check_schedule(same, workdir, 2) is None
  assert resume_checks.check_schedule(longer, workdir, 2) == (
    'note: the resumed schedule changed (train.num_train_steps 8 -> 16, train.warmup_steps '
    '2 -> 4): it now ends at step 16 (was 8); learning rate at the restored step 2: '
    '3.00e-03 -> 1.50e-03'
  )
  # How the model is computed may change: the run resumes, and says what changed.
  monkeypatch.undo()
  capsys.readouterr()
  resumed = tiny_config(train__stop_at_step=3, model__remat_policy='full')
  assert train.train_and_evaluate(resumed, workdir)['step'] == 3
  out = capsys.readouterr().out
  assert "note: the resumed model is computed differently (model.remat_policy 'none' -> " in out
  assert 'resumed from the checkpoint at step 2' in out


def test_a_resume_may_change_how_the_model_is_computed_but_not_which_model(tmp_path):
  """The execution concern (config.py) may change on resume, with a note; a field that
  changes the parameters' tree (LAYOUT_FIELDS) or the function (here dropout) may not."""
  saved = tiny_config()
  (tmp_path / 'config.json').write_text(saved.to_json_best_effort())
  model = train.validate_config(saved).model
  workdir = str(tmp_path)
  assert resume_checks.check_resumable(model, workdir, latest_step=4) is None
  note = resume_checks.check_resumable(
    model.replace(dtype='bfloat16', remat_policy='dots'), workdir, latest_step=4
  )
  assert note == (
    "note: the resumed model is computed differently (model.dtype 'float32' -> 'bfloat16', "
    "model.remat_policy 'none' -> 'dots'); the model is the same"
  )
  for changed in (
    dict(scan_layers=False),
    dict(dropout_rate=0.3),
    dict(dropout_generator='philox'),
  ):
    (name,) = changed
    with pytest.raises(ConfigError, match=f'of another model: model.{name}='):
      resume_checks.check_resumable(model.replace(**changed), workdir, latest_step=4)


def test_a_workdir_from_before_the_dropout_generator_field_resumes_only_with_threefry(tmp_path):
  # config.SAVED_FIELD_ADDED: a config.json written before model.dropout_generator existed was
  # trained with threefry masks (the only ones then).
  saved = json.loads(tiny_config().to_json_best_effort())
  del saved['model']['dropout_generator']
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  model = train.validate_config(tiny_config()).model
  assert resume_checks.check_resumable(model, str(tmp_path), latest_step=4) is None
  with pytest.raises(
    ConfigError, match="model.dropout_generator='philox' \\(the checkpoint has 'threefry'\\)"
  ):
    resume_checks.check_resumable(
      model.replace(dropout_generator='philox'), str(tmp_path), latest_step=4
    )

"""Translation trains on the generic loop (train/loop.py): a SIGTERM saves and a rerun resumes
mid-run from that checkpoint and its data position, replaying the uninterrupted run; a diverging
run ends in one `error:` line. Subprocess runs share the fault suite's compilation cache."""

import json
import re
import subprocess
import sys
import textwrap

import fault_support as fs
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from data_fixtures import bible_config
from toy_flags import TRANSLATE_TOY_FLAGS
from train_fixtures import REPO

from realformer_jax import Seq2Seq
from realformer_jax.model.params import unbox
from realformer_jax.seq2seq import config as translation_config
from realformer_jax.seq2seq import task as translation_task
from realformer_jax.seq2seq import trainer

# A toy run with two buckets, dropout on (so the resume also needs the PRNG key) and no
# checkpoint before the end unless SIGTERM asks for one.
_SCRIPT = textwrap.dedent(
  """
  import json, sys
  from realformer_jax.seq2seq import config as c, task, trainer
  from realformer_jax.train import preemption
  cfg = c.default_translation_config()
  m, d, t = cfg.model, cfg.data, cfg.train
  m.hidden_size, m.mlp_dim, m.max_len, m.num_layers, m.num_decoder_layers = 32, 64, 48, 2, 2
  d.vocab_size, d.bucket_lengths, d.tokens_per_batch, d.max_pairs = 300, (16, 32), 256, 64
  d.data_dir = sys.argv[2]
  t.num_train_steps, t.warmup_steps, t.log_every_steps = 60, 2, 1
  t.eval_every_steps = t.checkpoint_every_steps = 1000
  losses = []
  with preemption.return_on_preemption():
    trained = trainer.train(
      task.validate(cfg), sys.argv[1], on_log=lambda s, n, x: losses.append((s, x['train/loss']))
    )
  print('RESULT', json.dumps({'losses': losses, 'stopped_at': trained.stopped_at}))
  """
)


def _start(workdir):
  return subprocess.Popen(
    [sys.executable, '-c', _SCRIPT, str(workdir), bible_config().data_dir],
    cwd=REPO,
    env=fs.env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _result(out: str) -> dict:
  return json.loads(next(line for line in out.splitlines() if line.startswith('RESULT '))[7:])


@pytest.mark.slow
def test_sigterm_saves_and_a_rerun_resumes_mid_run(tmp_path):
  proc = _start(tmp_path / 'resumed')
  seen = []
  fs.wait_for_line(proc.stdout, r'^step +3/60', seen)
  out, err = fs.terminate(proc)
  out = ''.join(seen) + out
  stopped = _result(out)['stopped_at']
  assert proc.returncode == 0 and stopped is not None and 3 <= stopped < 60, (out, err)
  assert f'SIGTERM: saved a checkpoint at step {stopped}' in out
  assert not fs.unexpected_stderr(err), err

  rerun = _start(tmp_path / 'resumed')
  out, err = rerun.communicate(timeout=600)
  assert rerun.returncode == 0, err
  assert f'resumed from the checkpoint at step {stopped}' in out
  resumed = dict(_result(out)['losses'])
  assert min(resumed) == stopped + 1 and max(resumed) == 60

  straight = _start(tmp_path / 'straight')
  out, err = straight.communicate(timeout=600)
  assert straight.returncode == 0, err
  reference = dict(_result(out)['losses'])
  # Same batches (the data position was saved), same dropout keys: the same numbers.
  for step, loss in resumed.items():
    assert loss == pytest.approx(reference[step], rel=1e-6), step

  # A finished workdir is restored (its last checkpoint and history.json), not trained again.
  again = _start(tmp_path / 'resumed')
  out, err = again.communicate(timeout=600)
  assert again.returncode == 0, err
  assert 'training steps' not in out and _result(out) == {'losses': [], 'stopped_at': None}


def test_the_spec_round_trips_through_config_json():
  # config.json is RunSpec.to_dict(): read back, it validates into the same spec.
  config = translation_config.default_translation_config()
  config.train.seed, config.data.bucket_lengths = 3, (16, 48)
  spec = translation_task.validate(config)
  as_json = lambda spec: json.loads(json.dumps(spec.to_dict()))
  saved = as_json(spec)
  assert as_json(translation_task.validate(ml_collections.ConfigDict(saved))) == saved
  assert saved['train']['label_smoothing'] == 0.1 and saved['decode']['beam_size'] == 4


@pytest.mark.slow
def test_a_diverging_translation_run_is_one_error_line(tmp_path):
  flags = dict(TRANSLATE_TOY_FLAGS, **{'data.data_dir': bible_config().data_dir})
  flags.update({'train.learning_rate': 1e30, 'train.num_train_steps': 4})
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.translate',
      '--config=configs/translate.py',
      f'--out={tmp_path / "out"}',
      f'--workdirs={tmp_path / "runs"}',
      *[f'--config.{key}={value}' for key, value in flags.items()],
    ],
    cwd=REPO,
    env=fs.env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 1
  match = fs.the_line(
    proc.stderr,
    r'error: non-finite (loss \S+|gradients) at step (\d+); stopped without saving '
    r'\(last good checkpoint: none\)',
  )
  assert int(match.group(2)) <= 4
  assert not re.search(r'Traceback|FloatingPointError', proc.stderr + proc.stdout)


@pytest.mark.slow
def test_a_workdir_of_the_older_trainer_is_restored_not_trained(tmp_path):
  # The trainer before the loop saved only the final parameters (<workdir>/params, orbax) and
  # history.json; such a finished run is evaluated, not trained again.
  config = translation_config.default_translation_config()
  m, d = config.model, config.data
  m.hidden_size, m.mlp_dim, m.max_len, m.num_layers, m.num_decoder_layers = 32, 64, 48, 2, 2
  d.vocab_size, d.bucket_lengths, d.tokens_per_batch, d.max_pairs = 300, (16, 32), 256, 64
  d.data_dir = bible_config().data_dir
  spec = translation_task.validate(config)
  ids = jnp.zeros((1, 32), jnp.int32)
  params = unbox(Seq2Seq(spec.model).init(jax.random.key(7), ids, ids, ids)['params'])
  saver = ocp.StandardCheckpointer()
  saver.save(str(tmp_path / 'params'), params)
  saver.wait_until_finished()
  (tmp_path / 'history.json').write_text(json.dumps({'dev': [{'step': 2000, 'dev/nll': 3.0}]}))
  trained = trainer.train(spec, str(tmp_path))
  assert trained.history['dev'][-1]['dev/nll'] == 3.0
  assert not (tmp_path / 'checkpoints').exists()  # nothing trained
  for got, want in zip(jax.tree.leaves(trained.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(got, want)

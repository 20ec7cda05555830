"""Pretrain tiny -> fine-tune on the embedded task: the README's command at toy size, the
encoder starts from exactly the checkpoint, the model follows the checkpoint's config, and a
mismatch is one line naming both values."""

import json
import os
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest
from finetune_fixtures import REPO, cli_flags, labelled_rows, run_cli, toy_config, write_table
from train_fixtures import tiny_config

from realformer_jax import finetune, train
from realformer_jax.config import ConfigError
from realformer_jax.train import build

# slow: every test shares a pretraining run (26 s CPU to build, 2026-11-26).
pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def pretrained_workdir(tmp_path_factory):
  """A tiny Post-LN pretraining run (the fine-tuned model must follow its LN placement)."""
  workdir = str(tmp_path_factory.mktemp('pretrained'))
  train.train_and_evaluate(
    tiny_config(
      train__num_train_steps=2,
      train__checkpoint_every_steps=2,
      model__ln_placement='post',
      model__max_len=64,
    ),
    workdir,
  )
  return workdir


def test_encoder_starts_from_the_checkpoint_and_follows_its_config(pretrained_workdir):
  config = toy_config(
    'bible_sections', model=False, finetune__init=pretrained_workdir, data__vocab_file=''
  )
  config.model.dropout_rate = 0.0  # a fine-tuning field: may differ from the checkpoint
  task = finetune.make_task(config)
  spec = train.validate_config(config, task=task)
  model_config = spec.model
  assert model_config.ln_placement == 'post' and model_config.hidden_size == 32
  assert model_config.dropout_rate == 0.0
  setup = build.make_setup(spec)
  state = setup.init_state(jax.random.key(0))
  params = jax.device_get(task.initial_params(state.params, setup))
  saved = jax.device_get(train.load_workdir(pretrained_workdir).params)
  jax.tree.map(np.testing.assert_array_equal, params['encoder'], saved['encoder'])
  assert set(params) == {'encoder', 'pooler', 'classifier'}  # heads: fresh
  # The tokenizer is the run's copy in its workdir.
  assert task.tokenizer(spec.data).source == os.path.join(pretrained_workdir, 'tokenizer.model')


def test_a_model_field_that_differs_from_the_checkpoint_is_one_line(pretrained_workdir, tmp_path):
  config = toy_config('bible_sections', model=False, finetune__init=pretrained_workdir)
  config.model.hidden_size = 64
  with pytest.raises(
    ConfigError,
    match=r'model.hidden_size=64: the starting checkpoint '
    r'.* has model.hidden_size=32 \(leave model.hidden_size unset',
  ):
    finetune.run(config, str(tmp_path))
  config = toy_config('bible_sections', model=False, finetune__init=pretrained_workdir)
  config.model.ln_placement = 'realformer'
  with pytest.raises(
    ConfigError, match="model.ln_placement='realformer': .* has model.ln_placement='post'"
  ):
    finetune.make_task(config).model_config(config.model)


def test_how_the_model_runs_may_differ_from_the_checkpoint(pretrained_workdir):
  # The checkpoint was trained with attention_impl='auto'; fine-tuning on the einsum path, with
  # another remat policy and without the kernels' self-check changes no weight.
  config = toy_config('bible_sections', model=False, finetune__init=pretrained_workdir)
  config.model.attention_impl = 'xla'
  config.model.remat_policy = 'full'
  config.model.attention_check = False
  model_config = finetune.make_task(config).model_config(config.model)
  assert (model_config.attention_impl, model_config.remat_policy) == ('xla', 'full')
  assert model_config.attention_check is False and model_config.hidden_size == 32


def test_readme_fine_tuning_command_runs(pretrained_workdir, tmp_path):
  # README: python -m experiments.finetune --config=configs/finetune/bible_sections.py:init=
  # /tmp/realformer_tiny --workdir=DIR (here from a toy pretraining run, at toy size).
  result = run_cli(
    'experiments.finetune',
    f'--config=configs/finetune/bible_sections.py:init={pretrained_workdir}',
    f'--workdir={tmp_path}',
    *cli_flags(**{'train.stop_at_step': 2}),
  )
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  assert 'final eval accuracy' in output and 'test  accuracy' in output
  saved = json.loads((tmp_path / 'results.json').read_text())
  assert saved['step'] == 2 and 0 <= saved['test/accuracy'] <= 1
  assert saved['best_step'] == 2


def _readme_command(prefix: str) -> list[str]:
  """The README's command that starts with `prefix`, as argv."""
  with open(os.path.join(REPO, 'README.md')) as f:
    lines = [line.strip() for line in f if line.strip().startswith(prefix)]
  assert len(lines) == 1, lines
  return shlex.split(lines[0])


def test_readme_own_data_command_runs_as_written(pretrained_workdir, tmp_path):
  # README: realformer-finetune --train_file=train.csv ... --config=configs/finetune/files.py:
  # init=/tmp/realformer_tiny --workdir=/tmp/my_classifier, run where the files are, as the
  # console script runs it (from a toy pretraining run, at toy size).
  command = _readme_command('realformer-finetune --train_file=')
  for name, count in (('train', 16), ('dev', 8), ('test', 6)):
    write_table(tmp_path / f'{name}.csv', labelled_rows(count))
  workdir = tmp_path / 'my_classifier'
  args = [
    a.replace('/tmp/realformer_tiny', pretrained_workdir).replace(
      '/tmp/my_classifier', str(workdir)
    )
    for a in command[1:]
  ]
  result = subprocess.run(
    [sys.executable, '-c', 'from realformer_jax.commands import scripts; scripts.finetune()', *args]
    + cli_flags(**{'train.stop_at_step': 2}),
    cwd=tmp_path,
    env=dict(os.environ, PYTHONPATH=REPO, JAX_DISABLE_MOST_OPTIMIZATIONS='true'),
    capture_output=True,
    text=True,
    timeout=600,
  )
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  assert 'final eval accuracy' in output and 'test  accuracy' in output
  saved = json.loads((workdir / 'results.json').read_text())
  assert saved['labels'] == ['land', 'sky'] and 0 <= saved['test/accuracy'] <= 1
  assert saved['starting_point']['workdir'] == pretrained_workdir

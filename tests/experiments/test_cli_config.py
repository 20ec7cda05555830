"""--print_config, --help and "did you mean" on the training, fine-tuning and translation CLIs;
field meanings come from one place, the comments beside the fields in their dataclasses. A
config file that raises at import is that error through the commands."""

import os
import subprocess
import sys

import pytest
import repo_paths

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.config_docs import did_you_mean, field_meanings
from realformer_jax.data import DataConfig
from realformer_jax.finetune.config import FinetuneConfig, FinetuneDataConfig
from realformer_jax.seq2seq.config import DecodeConfig, TranslationTrainConfig
from realformer_jax.seq2seq.data import TranslationDataConfig
from realformer_jax.train import config as train_config

REPO = repo_paths.REPO
SCHEMAS = (
  ModelConfig,
  DataConfig,
  train_config.TrainConfig,
  train_config.MeshConfig,
  train_config.DistributedConfig,
  FinetuneConfig,
  FinetuneDataConfig,
  TranslationTrainConfig,
  DecodeConfig,
  TranslationDataConfig,
)


def _cli(module, *args):
  return subprocess.run(
    [sys.executable, '-m', module, *args],
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    timeout=300,
  )


@pytest.mark.parametrize('schema', SCHEMAS, ids=lambda c: c.__name__)
def test_every_field_has_a_one_line_meaning(schema):
  import dataclasses  # pylint: disable=import-outside-toplevel

  meanings = field_meanings(schema)
  assert list(meanings) == [f.name for f in dataclasses.fields(schema)]
  assert all(meanings.values()), [name for name, text in meanings.items() if not text]
  assert not any('\n' in text for text in meanings.values())


def test_meanings_are_the_dataclass_comments():
  meanings = field_meanings(ModelConfig)
  assert meanings['hidden_size'] == 'd_model'  # a trailing comment
  # A comment block above the field, joined into one line.
  assert meanings['position_embedding'].startswith("'learned' (BERT's absolute table, added")
  assert meanings['position_embedding'].endswith("any length; rotary.py) | 'none'")


def test_unknown_fields_get_the_closest_name():
  assert did_you_mean('ln_placment', ['ln_placement', 'norm']) == " (did you mean 'ln_placement'?)"
  assert did_you_mean('zzz', ['ln_placement']) == ''
  with pytest.raises(
    ConfigError, match=r"^model.ln_placment: .* \(did you mean 'ln_placement'\?\)$"
  ):
    ModelConfig.from_mapping({'ln_placment': 'pre'})


@pytest.mark.slow
def test_train_prints_its_resolved_config_and_exits(tmp_path):
  result = _cli(
    'experiments.train', '--config=configs/tiny.py', '--config.model.num_layers=3', '--print_config'
  )
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert 'model.num_layers = 3  # encoder layers (the scan length)' in lines
  assert any(line.startswith('train.learning_rate = ') and '# peak AdamW' in line for line in lines)
  assert any(line.startswith('logical_axis_rules = ') for line in lines)
  assert not (tmp_path / 'run').exists()  # printed, nothing run


@pytest.mark.slow
def test_finetune_help_and_print_config():
  help_text = _cli('experiments.finetune', '--help').stdout
  assert '--print_config' in help_text and 'realformer_jax/finetune/config.py' in help_text
  result = _cli(
    'experiments.finetune', '--config=configs/finetune/bible_sections.py', '--print_config'
  )
  assert result.returncode == 0, result.stderr
  assert "finetune.init = ''  # Starting point: '' = random init;" in result.stdout


@pytest.mark.slow
def test_translate_print_config_and_did_you_mean():
  result = _cli('experiments.translate', '--config=configs/translate.py', '--print_config')
  assert result.returncode == 0, result.stderr
  assert 'decode.beam_size = 4  # hypotheses kept per source in beam search' in result.stdout
  result = _cli('experiments.translate', '--config=configs/translate.py', '--config.decode.beam=3')
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
    "error: --config.decode.beam: unknown config field ('beam') (did you mean 'beam_size'?)"
  )


@pytest.mark.slow
@pytest.mark.parametrize('module', ['experiments.train', 'experiments.prepare_data'])
def test_a_config_file_that_raises_at_import_is_that_error_through_the_command(tmp_path, module):
  """Issue 59: a config file that raises while it is imported, before any get_config() is
  defined (here under a star import), is that error in one line, not "defines no
  get_config()"; nothing is written."""
  path = tmp_path / 'mine.py'
  path.write_text(
    'from realformer_jax.configs.tiny import *\nraise RuntimeError("set DATA first")\n'
  )
  workdir = tmp_path / 'run'
  more = [f'--workdir={workdir}'] if module == 'experiments.train' else []
  result = _cli(module, f'--config={path}', *more)
  assert result.returncode == 1, result.stdout + result.stderr
  assert result.stderr.strip().splitlines() == [
    f'error: --config {path}: raised while it ran: line 2: RuntimeError: set DATA first'
  ]
  assert 'get_config' not in result.stderr
  assert sorted(os.listdir(tmp_path)) == ['mine.py']

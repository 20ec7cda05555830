"""Fine-tuning on your own labelled files (issue 69): CSV, TSV, JSON Lines and SQuAD-format JSON
through the command as its console script runs it, each run exported and matched in
transformers, and one line for each file the run cannot read. (The README's command as written:
test_finetune_pretrained.py.)"""

import json
import os
import subprocess
import sys

import pytest
from data_fixtures import bible_config
from finetune_fixtures import (
  REPO,
  TOY,
  TOY_MODEL,
  assert_export_matches,
  files_toy_flags,
  labelled_rows,
  run_cli,
  tokenizer_file,
  write_squad,
  write_table,
)

from realformer_jax import data
from realformer_jax.data import DataError
from realformer_jax.finetune import config as finetune_config
from realformer_jax.finetune import datasets


def _data(**fields) -> finetune_config.FinetuneDataConfig:
  return finetune_config.FinetuneDataConfig(dataset='files', **fields)


def test_classes_are_the_train_files_labels(tmp_path):
  train = write_table(tmp_path / 'train.jsonl', [{'text': 'a', 'label': v} for v in (10, 9, 2)])
  dev = write_table(tmp_path / 'dev.csv', [{'text': 'b', 'label': '9'}])
  data = _data(train_file=train, validation_file=dev)
  spec = datasets.spec_of(data)
  assert spec.labels == ('2', '9', '10') and spec.num_classes == 3  # numeric order
  assert datasets.labelled_texts(data, 'validation')['labels'].tolist() == [1]  # JSON 9 == '9'


def test_a_squad_file_is_span_extraction(tmp_path):
  train = write_squad(tmp_path / 'train.json', 3)
  dev = write_squad(tmp_path / 'dev.json', 2)
  spec = datasets.spec_of(_data(train_file=train, validation_file=dev))
  assert spec.kind == datasets.SPAN and not spec.unanswerable
  record = datasets.read_records(_data(train_file=train, validation_file=dev), 'train')[0]
  assert record['context'][record['answers']['answer_start'][0] :].startswith('light')


def test_files_it_cannot_read_are_one_line(tmp_path):
  train = write_table(tmp_path / 'train.csv', labelled_rows(4))
  dev = write_table(tmp_path / 'dev.csv', [{'text': 'x', 'label': 'sea'}])
  nolabel = write_table(tmp_path / 'nolabel.csv', [{'text': 'x', 'category': 'sky'}])
  (tmp_path / 'empty.tsv').write_text('text\tlabel\n')
  (tmp_path / 'train.xlsx').write_text('')
  cases = [
    (dict(train_file=train, validation_file=nolabel), r"nolabel.csv: line 2 has no column 'label'"),
    (
      dict(train_file=train, validation_file=dev, label_column='category'),
      r"train.csv: line 2 has no column 'category' \(data.label_column; the line has: text, label",
    ),
    (dict(train_file=train, validation_file=dev, text_pair_column='b'), "no column 'b'"),
    (dict(train_file=str(tmp_path / 'empty.tsv'), validation_file=dev), 'holds no examples'),
    (
      dict(train_file=str(tmp_path / 'train.xlsx'), validation_file=dev),
      r"unknown extension '.xlsx' \(read: .csv, .tsv, .jsonl, .json\)",
    ),
    (dict(train_file=str(tmp_path / 'gone.csv'), validation_file=dev), 'gone.csv: cannot read'),
    (dict(train_file=train), 'needs a validation file'),
    (dict(validation_file=dev), 'needs data.train_file'),
  ]
  for fields, message in cases:
    with pytest.raises(DataError, match=message) as raised:
      datasets.labelled_texts(_data(**fields), 'validation')
    assert '\n' not in str(raised.value)
  unseen = _data(train_file=train, validation_file=dev)
  with pytest.raises(DataError, match=r"dev.csv: example 1 has label 'sea', which .* land, sky"):
    datasets.labelled_texts(unseen, 'validation')
  with pytest.raises(DataError, match=r"data.dataset='files'"):
    finetune_config.FinetuneDataConfig(train_file=train, validation_file=dev)


def _console_script(*args, cwd):
  """The installed realformer-finetune as its entry point runs it
  (realformer_jax/commands/scripts.py),
  from `cwd`, on this checkout."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_DISABLE_MOST_OPTIMIZATIONS='true')
  command = [
    sys.executable,
    '-c',
    'from realformer_jax.commands import scripts; scripts.finetune()',
    *args,
  ]
  return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a toy fine-tuning run through the command (~20 s CPU)
def test_csv_files_named_where_they_are_train_a_classifier_that_exports_as_bert(tmp_path):
  # Relative file names, run from their directory (random init, a Post-LN toy model).
  write_table(tmp_path / 'train.csv', labelled_rows(16))
  write_table(tmp_path / 'dev.csv', labelled_rows(8))
  write_table(tmp_path / 'test.csv', labelled_rows(6))
  result = _console_script(
    '--train_file=train.csv',
    '--validation_file=dev.csv',
    '--test_file=test.csv',
    f'--workdir={tmp_path / "run"}',
    *files_toy_flags(),
    cwd=tmp_path,
  )
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  assert 'final eval accuracy' in output and 'test  accuracy' in output
  saved = json.loads((tmp_path / 'run' / 'results.json').read_text())
  assert saved['labels'] == ['land', 'sky']
  assert 0 <= saved['test/accuracy'] <= 1 and 0 <= saved['eval/f1'] <= 1
  assert 'starting_point' in saved and saved['starting_point'] is None  # random init
  # The run records its files by absolute path: a resume from anywhere finds them.
  recorded = json.loads((tmp_path / 'run' / 'config.json').read_text())['data']
  assert recorded['train_file'] == str(tmp_path / 'train.csv')
  # Exported like a pretrained run: transformers computes what the best checkpoint computes.
  exported = run_cli(
    'experiments.export_hf', f'--workdir={tmp_path / "run"}', f'--out={tmp_path / "hf"}'
  )
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert 'BertForSequenceClassification from the best checkpoint' in exported.stdout
  config = assert_export_matches(tmp_path / 'run', tmp_path / 'hf', ['light day', 'gold king'])
  assert config.id2label == {0: 'land', 1: 'sky'}


@pytest.mark.slow  # a toy fine-tuning run a format (~20 s CPU each)
@pytest.mark.parametrize('extension', ['tsv', 'jsonl'])
def test_text_pairs_in_tsv_and_jsonl_export_with_the_shipped_module(tmp_path, extension):
  train = write_table(tmp_path / f'train.{extension}', labelled_rows(16, pair=True))
  dev = write_table(tmp_path / f'dev.{extension}', labelled_rows(8, pair=True))
  result = _console_script(
    f'--train_file={train}',
    f'--validation_file={dev}',
    '--text_pair_column=second',
    f'--workdir={tmp_path / "run"}',
    *files_toy_flags('realformer'),
    cwd=tmp_path,
  )
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  saved = json.loads((tmp_path / 'run' / 'results.json').read_text())
  assert saved['labels'] == ['land', 'sky'] and 0 <= saved['eval/accuracy'] <= 1
  assert 'test/accuracy' not in saved  # no --test_file
  exported = run_cli(
    'experiments.export_hf', f'--workdir={tmp_path / "run"}', f'--out={tmp_path / "hf"}'
  )
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert 'RealFormerForSequenceClassification' in exported.stdout
  assert_export_matches(tmp_path / 'run', tmp_path / 'hf', ['day light'], ['light day'])


@pytest.mark.slow  # a toy fine-tuning run (~25 s CPU)
def test_squad_format_file_reports_exact_match_and_f1(tmp_path):
  train = write_squad(tmp_path / 'train.json', 16)
  dev = write_squad(tmp_path / 'dev.json', 4)
  result = _console_script(
    f'--train_file={train}',
    f'--validation_file={dev}',
    f'--test_file={dev}',
    f'--workdir={tmp_path / "run"}',
    *files_toy_flags(),
    '--config.data.max_query_len=8',
    '--config.data.doc_stride=16',
    cwd=tmp_path,
  )
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  saved = json.loads((tmp_path / 'run' / 'results.json').read_text())
  for split in ('eval', 'test'):
    assert 0 <= saved[f'{split}/exact_match'] <= 100 and 0 <= saved[f'{split}/f1'] <= 100
  assert 'labels' not in saved
  exported = run_cli(
    'experiments.export_hf', f'--workdir={tmp_path / "run"}', f'--out={tmp_path / "hf"}'
  )
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert 'BertForQuestionAnswering' in exported.stdout
  assert_export_matches(
    tmp_path / 'run', tmp_path / 'hf', ['what did the king see'], ['the king saw the light']
  )


@pytest.mark.slow  # the command's start-up (~8 s CPU)
def test_an_unseen_label_is_one_error_line_before_compiling(tmp_path):
  train = write_table(tmp_path / 'train.csv', labelled_rows(4))
  dev = write_table(tmp_path / 'dev.csv', [{'text': 'x', 'label': 'sea'}])
  result = run_cli(
    'experiments.finetune',
    f'--train_file={train}',
    f'--validation_file={dev}',
    f'--workdir={tmp_path / "run"}',
    *files_toy_flags(),
  )
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('error: data.validation_file=') and "label 'sea'" in lines[-1]
  assert not (tmp_path / 'run' / 'checkpoints').exists()


def test_an_unfinished_finetuning_run_is_not_exported(tmp_path):
  from realformer_jax.config import ConfigError  # pylint: disable=import-outside-toplevel
  from realformer_jax.finetune import export  # pylint: disable=import-outside-toplevel

  (tmp_path / 'config.json').write_text(json.dumps({'model': {}, 'finetune': {'init': ''}}))
  assert export.is_finetuning_run(str(tmp_path))
  with pytest.raises(ConfigError, match='results.json: missing .* has not finished'):
    export.load_best(str(tmp_path))
  (tmp_path / 'config.json').write_text(json.dumps({'model': {}, 'train': {}}))
  assert not export.is_finetuning_run(str(tmp_path))  # a pretraining run's

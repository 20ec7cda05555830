"""Issue 68's fault pass over fine-tuning on your own files (finetune/files.py): each file that
used to train silently on the wrong thing, or end in a traceback, is one `error:` line naming the
file (and its line) before anything is compiled, through the real command; the files that
merely read awkwardly (a byte-order mark, a null value, a key twice in a JSON line) in process.
"""

import json
import re

import pytest
from finetune_fixtures import files_toy_flags, labelled_rows, run_cli, write_squad, write_table

from realformer_jax.data import DataError
from realformer_jax.finetune import config as finetune_config
from realformer_jax.finetune import datasets

_CSV = ''.join(f'{row["text"]},{row["label"]}\n' for row in labelled_rows(8))


def _write(path, text: str, encoding: str = 'utf-8') -> str:
  with open(path, 'w', encoding=encoding, newline='') as f:
    f.write(text)
  return str(path)


def _squad_answer_moved(path, start: int) -> str:
  """write_squad's file with question 3's answer_start set to `start` (its text unchanged)."""
  squad = json.loads(open(write_squad(path, 4)).read())
  squad['data'][0]['paragraphs'][2]['qas'][0]['answers'][0]['answer_start'] = start
  return _write(path, json.dumps(squad))


# name -> (train file, validation file, the error line) for files in tmp_path; each trained on
# the wrong thing with rc 0, or ended in a traceback, before (issue 68's fault pass).
_REFUSED = {
  # csv kept the last 'text' column's values: trained on 'other' everywhere
  'a column named twice': (
    lambda d: _write(d / 't.csv', 'text,text,label\n' + _CSV.replace(',', ',other,')),
    lambda d: write_table(d / 'v.csv', labelled_rows(4)),
    r"error: data\.train_file=\S+t\.csv: line 1 names column 'text' 2 times: .*",
  ),
  # an empty label was a third class ''
  'an empty label': (
    lambda d: _write(d / 't.csv', 'text,label\n' + _CSV + 'some text,\n'),
    lambda d: write_table(d / 'v.csv', labelled_rows(4)),
    r"error: data\.train_file=\S+t\.csv: line 10: label '' \(column 'label'\) is no class name.*",
  ),
  # a JSON list was the class "['sky']"
  'a JSON list as a label': (
    lambda d: _write(
      d / 't.jsonl',
      ''.join(json.dumps(r) + '\n' for r in labelled_rows(8)) + '{"text": "x", "label": ["sky"]}',
    ),
    lambda d: write_table(d / 'v.csv', labelled_rows(4)),
    r"error: data\.train_file=\S+t\.jsonl: line 9: label \['sky'\] .* is no class name.*",
  ),
  # a UnicodeDecodeError traceback
  'a file that is not UTF-8': (
    lambda d: _write(d / 't.csv', 'text,label\n' + _CSV + 'caf\xe9 au lait,sky\n', 'latin-1'),
    lambda d: write_table(d / 'v.csv', labelled_rows(4)),
    r'error: data\.train_file=\S+t\.csv: line 10 is not UTF-8 text \(byte 0xe9\): save .*',
  ),
  # validated on the examples trained on
  'the train file as validation file': (
    lambda d: write_table(d / 't.csv', labelled_rows(8)),
    lambda d: str(d / 't.csv'),
    r'error: data\.validation_file=\S+t\.csv is the same file as data\.train_file=.*',
  ),
  'a copy of the train file as validation file': (
    lambda d: write_table(d / 't.csv', labelled_rows(8)),
    lambda d: write_table(d / 'v.csv', labelled_rows(8)),
    r'error: data\.validation_file=\S+v\.csv is a copy of data\.train_file=\S+t\.csv: .*',
  ),
  # trained on the wrong span
  'a SQuAD answer not at its answer_start': (
    lambda d: _squad_answer_moved(d / 't.json', 3),
    lambda d: write_squad(d / 'v.json', 2),
    r"error: data\.train_file=\S+t\.json: question 3 \('what did the king see'\): answer "
    r"'night' is not at answer_start=3 of its context \(there: ' king'; the context has 44 "
    r'characters\): fix answer_start',
  ),
  # trained as unanswerable
  'a SQuAD answer_start past its context': (
    lambda d: _squad_answer_moved(d / 't.json', 999),
    lambda d: write_squad(d / 'v.json', 2),
    r'error: data\.train_file=\S+: question 3 .* is not at answer_start=999 of its context '
    r"\(there: ''; the context has 44 characters\): fix answer_start",
  ),
}


@pytest.mark.slow  # the fine-tuning command's start-up (~10 s CPU) a case
@pytest.mark.parametrize('case', sorted(_REFUSED))
def test_a_file_that_would_train_on_the_wrong_thing_is_one_line(tmp_path, case):
  train, validation, line = _REFUSED[case]
  result = run_cli(
    'experiments.finetune',
    f'--train_file={train(tmp_path)}',
    f'--validation_file={validation(tmp_path)}',
    f'--workdir={tmp_path / "run"}',
    *files_toy_flags(),
    '--config.data.max_query_len=8',
    '--config.data.doc_stride=16',
  )
  assert result.returncode == 1, result.stdout + result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert 'Traceback' not in result.stderr
  assert re.fullmatch(line, lines[-1]), lines[-1]
  assert not (tmp_path / 'run' / 'checkpoints').exists()


def _data(**fields) -> finetune_config.FinetuneDataConfig:
  return finetune_config.FinetuneDataConfig(dataset='files', **fields)


def test_a_byte_order_mark_is_skipped(tmp_path):
  """Spreadsheets save CSV as UTF-8 with a BOM: its header's first column was '\\ufefftext'."""
  train = _write(tmp_path / 't.csv', '\ufefftext,label\n' + _CSV)
  jsonl = _write(
    tmp_path / 't.jsonl', '\ufeff' + ''.join(json.dumps(r) + '\n' for r in labelled_rows(8))
  )
  dev = write_table(tmp_path / 'v.csv', labelled_rows(4)[1:])
  for path in (train, jsonl):
    texts = datasets.labelled_texts(_data(train_file=path, validation_file=dev), 'train')
    assert texts['texts_a'][0] == labelled_rows(1)[0]['text']


def test_missing_values_and_keys_twice_are_named(tmp_path):
  null = _write(tmp_path / 'null.jsonl', '{"text": null, "label": "sky"}\n')
  short = _write(tmp_path / 'short.csv', 'text,label\n' + _CSV + 'only text\n')
  twice = _write(tmp_path / 'twice.jsonl', '{"text": "a", "text": "b", "label": "sky"}\n')
  cases = [
    (null, r"null\.jsonl: line 1 has no value in column 'text' \(data\.text_column: null, or"),
    (short, r"short\.csv: line 10 has no value in column 'label'"),
    (twice, r"twice\.jsonl: line 1 is not JSON: key 'text' appears 2 times in one object"),
  ]
  dev = write_table(tmp_path / 'v.csv', labelled_rows(4)[1:])
  for path, message in cases:
    with pytest.raises(DataError, match=message):
      datasets.labelled_texts(_data(train_file=path, validation_file=dev), 'train')


def test_one_number_written_two_ways_is_refused(tmp_path):
  """JSON's 1 and 1.0 (or CSV's '1' and '1.0') in one train file were two classes of one label."""
  rows = [{'text': f'example {i}', 'label': [0, 1, 1.0][i % 3]} for i in range(9)]
  train = _write(tmp_path / 't.jsonl', ''.join(json.dumps(r) + '\n' for r in rows))
  dev = write_table(tmp_path / 'v.csv', labelled_rows(4)[1:])
  with pytest.raises(
    DataError, match=r"t\.jsonl: labels '1' and '1\.0' \(column 'label'\) are one"
  ):
    datasets.labelled_texts(_data(train_file=train, validation_file=dev), 'train')
  # one way of writing each number still reads, in numeric order
  plain = _write(tmp_path / 'p.jsonl', ''.join(json.dumps(r) + '\n' for r in rows[:2] * 3))
  texts = datasets.labelled_texts(_data(train_file=plain, validation_file=dev), 'train')
  assert texts['labels'].tolist() == [0, 1] * 3

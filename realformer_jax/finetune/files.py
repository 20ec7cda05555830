"""Your own labelled files as a fine-tuning dataset (data.dataset='files'), as Hugging Face's
run_glue / run_qa take them:

    realformer-finetune --train_file=train.csv --validation_file=dev.csv [--test_file=test.csv]

  .csv .tsv .jsonl   classification: a text column (data.text_column, default 'text'), an
                     optional second text (data.text_pair_column) and a label column
                     (data.label_column, default 'label'); the classes are the train file's
                     labels, sorted (numerically where every label is a number)
  .json              span extraction in SQuAD's format ({"data": [{"paragraphs": [{"context",
                     "qas": [{"question", "answers": [{"text", "answer_start"}],
                     "is_impossible"}]}]}]}); unanswerable questions (SQuAD v2.0) when the train
                     file has any

A missing file or column, an empty file, an unknown extension, a label the train file does
not have, a column named twice, a value that is missing (null, a short row) or a label that is
no class name (empty, a JSON list or object), text that is not UTF-8 (a byte-order mark is
skipped), a SQuAD answer that is not where its answer_start says, and a validation or test file
that is the train file (or a copy of it) are each one DataError naming the file (and its line).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
from typing import Any

import numpy as np

from realformer_jax.data.errors import DataError

NAME = 'files'  # data.dataset of your own files
TABLE_FORMATS = {'.csv': ',', '.tsv': '\t', '.jsonl': None}  # delimiter; None: JSON Lines
SQUAD_FORMAT = '.json'
EXTENSIONS = tuple(TABLE_FORMATS) + (SQUAD_FORMAT,)
# data.<which>_split of the files dataset -> the field naming its file.
SPLIT_FILES = {'train': 'train_file', 'validation': 'validation_file', 'test': 'test_file'}


def is_span(data: Any) -> bool:
  return _extension(data, 'train_file') == SQUAD_FORMAT


def check(data: Any) -> None:
  """One DataError for a files config that cannot be read (before anything is encoded)."""
  if not data.train_file:
    raise DataError("data.dataset='files' needs data.train_file (--train_file=PATH).")
  if not data.validation_file:
    raise DataError(
      'data.validation_file is empty: your own data needs a validation file (--validation_file='
      'PATH), evaluated each epoch to pick the best checkpoint.'
    )
  kinds = {which: _extension(data, which) == SQUAD_FORMAT for which in SPLIT_FILES.values()}
  given = {which: kind for which, kind in kinds.items() if getattr(data, which)}
  if len(set(given.values())) > 1:
    raise DataError(
      'data.train_file, validation_file and test_file must be all SQuAD-format .json (span '
      'extraction) or all tables (.csv / .tsv / .jsonl): got '
      + ', '.join(f'{which}={getattr(data, which)}' for which in given)
    )
  _check_held_out(data)


def _check_held_out(data: Any) -> None:
  """A validation or test file that is the train file (the same file, or the same bytes) would
  measure the model on the examples it was trained on: refused, as pretraining refuses eval
  files that are train files."""
  train = _identity(data, 'train_file')
  for which in ('validation_file', 'test_file'):
    if not getattr(data, which):
      continue
    other = _identity(data, which)
    if os.path.samefile(train[1], other[1]):
      relation = 'the same file as'
    elif train[3] == other[3] and _sha256(train) == _sha256(other):
      relation = 'a copy of'
    else:
      continue
    raise DataError(
      f'data.{which}={other[1]} is {relation} data.train_file={train[1]}: its metrics would '
      'be measured on the examples trained on (and the best checkpoint picked by them); give '
      'it held-out examples.'
    )


@functools.lru_cache(maxsize=16)
def _sha256(identity) -> str:
  with open(identity[1], 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def label_names(data: Any) -> tuple[str, ...]:
  """The classes: the train file's labels, sorted (numerically if every one is a number)."""
  labels = sorted(set(_table(data, 'train_file')[2]), key=_label_order)
  if len(labels) < 2:
    raise DataError(
      f'data.train_file={data.train_file}: every example has label {labels[0]!r} '
      f"(column '{data.label_column}'); a classifier needs at least two classes."
    )
  _refuse_one_number_written_twice(data, labels)
  return tuple(labels)


def _refuse_one_number_written_twice(data: Any, labels: list[str]) -> None:
  """'1' and '1.0' (or JSON's 1 and 1.0) would be two classes of one label: refused, since
  which the writer meant cannot be told from the file."""
  by_number: dict[float, list[str]] = {}
  for name in labels:
    number = _label_order(name)
    if number[0] == 0:
      by_number.setdefault(number[1], []).append(name)
  for names in by_number.values():
    if len(names) > 1:
      raise DataError(
        f'data.train_file={data.train_file}: labels {" and ".join(map(repr, names))} '
        f"(column '{data.label_column}') are one number written {len(names)} ways, which "
        'would make them different classes: write each label one way.'
      )


def has_unanswerable(data: Any) -> bool:
  """The train file holds questions without an answer (SQuAD v2.0's format)."""
  return any(bool(r['is_impossible']) for r in squad_records(data, 'train'))


def labelled_texts(data: Any, split: str) -> dict:
  """{'texts_a', 'texts_b' (None: one text), 'labels' (int32 class ids)} of a table split."""
  which = _file_field(split)
  texts_a, texts_b, labels = _table(data, which)
  names = label_names(data)
  ids = {name: i for i, name in enumerate(names)}
  for line, label in enumerate(labels, 1):
    if label not in ids:
      raise DataError(
        f'data.{which}={getattr(data, which)}: example {line} has label {label!r}, which '
        f'data.train_file does not have (its labels: {", ".join(names)}).'
      )
  count = len(labels) if data.max_examples < 0 else min(len(labels), data.max_examples)
  return {
    'texts_a': texts_a[:count],
    'texts_b': None if texts_b is None else texts_b[:count],
    'labels': np.asarray([ids[label] for label in labels[:count]], np.int32),
  }


def squad_records(data: Any, split: str) -> list[dict]:
  """The questions of a SQuAD-format file as the records squad.examples_from_records reads
  (TFDS squad's: question, context, answers {text, answer_start}, is_impossible)."""
  records = _squad(_identity(data, _file_field(split)))
  return records if data.max_examples < 0 else records[: data.max_examples]


def _file_field(split: str) -> str:
  if split not in SPLIT_FILES:
    raise DataError(
      f"split '{split}': your own files' splits are {', '.join(SPLIT_FILES)} (data.train_file, "
      'validation_file, test_file); leave data.*_split empty.'
    )
  return SPLIT_FILES[split]


def _extension(data: Any, which: str) -> str:
  path = getattr(data, which)
  extension = os.path.splitext(path)[1].lower()
  if path and extension not in EXTENSIONS:
    raise DataError(
      f'data.{which}={path}: unknown extension {extension or "(none)"!r} '
      f'(read: {", ".join(EXTENSIONS)})'
    )
  return extension


def _identity(data: Any, which: str) -> tuple[str, str, int, int]:
  """(field, path, mtime, size): a file's cache key (a file rewritten is read again)."""
  path = os.path.expanduser(getattr(data, which))
  try:
    status = os.stat(path)
  except OSError as e:
    raise DataError(f'data.{which}={path}: cannot read it: {e.strerror}') from None
  if not os.path.isfile(path):
    raise DataError(f'data.{which}={path}: not a file')
  return which, path, status.st_mtime_ns, status.st_size


def _table(data: Any, which: str) -> tuple[list[str], Any, list[str]]:
  """(texts, second texts or None, labels as strings) of a CSV / TSV / JSONL file."""
  return _read_table(
    _identity(data, which), data.text_column, data.text_pair_column, data.label_column
  )


@functools.lru_cache(maxsize=16)
def _read_table(identity, text_column: str, pair_column: str, label_column: str):
  which, path, _, _ = identity
  delimiter = TABLE_FORMATS[os.path.splitext(path)[1].lower()]
  columns = [(text_column, 'text_column'), (label_column, 'label_column')]
  if pair_column:
    columns.append((pair_column, 'text_pair_column'))
  if delimiter is None:
    rows = _json_lines(which, path)
  else:
    rows = _csv_rows(which, path, delimiter, [c for c, _ in columns])
  if not rows:
    raise DataError(f'data.{which}={path}: the file holds no examples.')
  for line, row in rows:
    for column, field in columns:
      if column not in row:
        raise DataError(
          f"data.{which}={path}: line {line} has no column '{column}' (data.{field}; the "
          f'line has: {", ".join(map(str, row)) or "nothing"})'
        )
      if row[column] is None:  # JSON null, or a CSV row shorter than its header
        raise DataError(
          f"data.{which}={path}: line {line} has no value in column '{column}' (data.{field}: "
          'null, or a row with fewer fields than the header)'
        )
    label = row[label_column]
    if isinstance(label, (list, dict)) or not _label(label):
      raise DataError(
        f"data.{which}={path}: line {line}: label {label!r} (column '{label_column}') is no "
        'class name: an empty value, or a JSON list or object'
      )
  texts = [str(row[text_column]) for _, row in rows]
  pairs = [str(row[pair_column]) for _, row in rows] if pair_column else None
  return texts, pairs, [_label(row[label_column]) for _, row in rows]


def _csv_rows(which: str, path: str, delimiter: str, columns: list[str]) -> list[tuple[int, dict]]:
  """The rows of a CSV / TSV file; DataError where its header names a column read (`columns`)
  twice (csv would keep the last one's values without a word)."""
  reader = csv.DictReader(_text(which, path), delimiter=delimiter)
  try:
    rows = [(reader.line_num, row) for row in reader]
  except csv.Error as e:
    raise DataError(f'data.{which}={path}: line {reader.line_num}: {e}') from None
  header = reader.fieldnames or []
  twice = [c for c in dict.fromkeys(header) if c in columns and header.count(c) > 1]
  if twice:
    raise DataError(
      f"data.{which}={path}: line 1 names column '{twice[0]}' {header.count(twice[0])} times: "
      'which one is meant cannot be told; rename the others'
    )
  return rows


def _json_lines(which: str, path: str) -> list[tuple[int, dict]]:
  rows = []
  for line, text in enumerate(_text(which, path), 1):
    if not text.strip():
      continue
    try:
      row = json.loads(text, object_pairs_hook=_no_key_twice)
    except ValueError as e:
      raise DataError(f'data.{which}={path}: line {line} is not JSON: {e}') from None
    if not isinstance(row, dict):
      raise DataError(f'data.{which}={path}: line {line} is not a JSON object.')
    rows.append((line, row))
  return rows


def _no_key_twice(pairs: list) -> dict:
  """A JSON object, refused (ValueError) where it names a key twice (json keeps the last)."""
  keys = [k for k, _ in pairs]
  for key in keys:
    if keys.count(key) > 1:
      raise ValueError(f'key {key!r} appears {keys.count(key)} times in one object')
  return dict(pairs)


@functools.lru_cache(maxsize=8)
def _squad(identity) -> list[dict]:
  which, path, _, _ = identity
  try:
    articles = json.load(_text(which, path)).get('data')
  except (ValueError, AttributeError) as e:
    raise DataError(f'data.{which}={path}: not SQuAD-format JSON ({e})') from None
  if not isinstance(articles, list):
    raise DataError(f'data.{which}={path}: not SQuAD-format JSON (no "data" list).')
  records = []
  try:
    for article in articles:
      for paragraph in article['paragraphs']:
        for qa in paragraph['qas']:
          answers = qa.get('answers', [])
          records.append(
            {
              'question': qa['question'],
              'context': paragraph['context'],
              'answers': {
                'text': [a['text'] for a in answers],
                'answer_start': [int(a['answer_start']) for a in answers],
              },
              'is_impossible': bool(qa.get('is_impossible', False)) or not answers,
            }
          )
  except (KeyError, TypeError) as e:
    raise DataError(
      f'data.{which}={path}: question {len(records) + 1} is not in SQuAD format (missing {e})'
    ) from None
  if not records:
    raise DataError(f'data.{which}={path}: the file holds no questions.')
  for number, record in enumerate(records, 1):
    _check_answers(which, path, number, record)
  return records


def _check_answers(which: str, path: str, number: int, record: dict) -> None:
  """DataError where an answer is not the context's text at its answer_start: the span
  trained on (or scored against) would be other text, or none at all past the context."""
  context, answers = record['context'], record['answers']
  for text, start in zip(answers['text'], answers['answer_start']):
    found = context[start : start + len(text)] if 0 <= start else ''
    if found != text:
      raise DataError(
        f'data.{which}={path}: question {number} ({record["question"][:40]!r}): answer '
        f'{text[:40]!r} is not at answer_start={start} of its context (there: '
        f'{found[:40]!r}; the context has {len(context)} characters): fix answer_start'
      )


def _text(which: str, path: str) -> io.StringIO:
  """The file's text as UTF-8 (a byte-order mark, as spreadsheets write it, is skipped), its
  line endings as written (csv reads quoted ones); DataError naming the line of a byte that is
  not UTF-8."""
  try:
    with open(path, 'rb') as f:
      data = f.read()
  except OSError as e:
    raise DataError(f'data.{which}={path}: cannot read it: {e.strerror}') from None
  try:
    return io.StringIO(data.decode('utf-8-sig'), newline='')
  except UnicodeDecodeError as e:
    line = data[: e.start].count(b'\n') + 1
    raise DataError(
      f'data.{which}={path}: line {line} is not UTF-8 text (byte {data[e.start]:#04x}): save '
      'the file as UTF-8'
    ) from None


def _label(value: Any) -> str:
  """A label as its name: JSON's 1 and CSV's '1' are one class."""
  return str(value).strip()


def _label_order(name: str):
  try:
    return (0, float(name), name)
  except ValueError:
    return (1, 0.0, name)

"""The fine-tuning datasets: what each one is (inputs, label kind, metrics) and how it is read.

    spec('glue/mrpc')          # DatasetSpec: text features, classes, metric, default splits
    read_records(data, split)  # the split's records as dicts (TFDS array_record data source)

GLUE and SQuAD come from the TFDS catalog, prepared as array_record under `data.data_dir`
(`tfds build glue/mrpc --file_format=array_record`), read with `builder.as_data_source` (no
TensorFlow); with `data.download=False` (the default) a dataset that is not prepared fails in
one line, without touching the network. The embedded Bible tasks (bible.py) need neither,
nor do your own labelled files (data.dataset='files', files.py: CSV / TSV / JSON Lines /
SQuAD-format JSON), whose spec (classes, kind) is read from the train file: `spec_of(data)`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from realformer_jax.data.errors import DataError
from realformer_jax.finetune import bible, files

CLASSIFICATION, REGRESSION, SPAN = 'classification', 'regression', 'span'


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  name: str
  kind: str  # classification | regression | span
  text_features: tuple[str, ...] = ()  # one text, or a pair (classification / regression)
  num_classes: int = 1  # classification: label count; regression / span: 1
  metric: str = 'accuracy'  # the main eval metric: picks the best checkpoint
  train_split: str = 'train'
  eval_split: str = 'validation'
  test_split: str = ''  # labelled held-out split evaluated once with the best checkpoint
  embedded: bool = False
  unanswerable: bool = False  # span: questions may have no answer (SQuAD v2.0)
  labels: tuple[str, ...] = ()  # classification: the class names, if the dataset has them

  def __post_init__(self):
    if self.kind not in (CLASSIFICATION, REGRESSION, SPAN):
      raise DataError(
        f'dataset {self.name}: kind={self.kind!r}; expected one of '
        f'{CLASSIFICATION!r}, {REGRESSION!r}, {SPAN!r}'
      )
    if (self.num_classes >= 2) != (self.kind == CLASSIFICATION):
      outputs = 'at least 2' if self.kind == CLASSIFICATION else '1'
      raise DataError(
        f'dataset {self.name}: num_classes={self.num_classes} for a {self.kind} task; '
        f'expected {outputs} (the model has one output a class, a single one otherwise)'
      )


def _glue(name, features, classes, metric, eval_split='validation'):
  kind = REGRESSION if classes == 1 else CLASSIFICATION
  return DatasetSpec(f'glue/{name}', kind, features, classes, metric, eval_split=eval_split)


_SPECS = {
  spec.name: spec
  for spec in (
    DatasetSpec(
      'bible_sections',
      CLASSIFICATION,
      ('text',),
      len(bible.SECTIONS),
      'accuracy',
      test_split='test',
      embedded=True,
    ),
    DatasetSpec(
      'bible_pairs',
      CLASSIFICATION,
      ('text', 'next_text'),
      2,
      'accuracy',
      test_split='test',
      embedded=True,
    ),
    _glue('cola', ('sentence',), 2, 'matthews_corrcoef'),
    _glue('sst2', ('sentence',), 2, 'accuracy'),
    _glue('mrpc', ('sentence1', 'sentence2'), 2, 'f1'),
    _glue('qqp', ('question1', 'question2'), 2, 'f1'),
    _glue('stsb', ('sentence1', 'sentence2'), 1, 'pearson'),
    _glue('mnli', ('premise', 'hypothesis'), 3, 'accuracy', 'validation_matched'),
    _glue('qnli', ('question', 'sentence'), 2, 'accuracy'),
    _glue('rte', ('sentence1', 'sentence2'), 2, 'accuracy'),
    _glue('wnli', ('sentence1', 'sentence2'), 2, 'accuracy'),
    DatasetSpec('squad/v1.1', SPAN, metric='f1'),
    DatasetSpec('squad/v2.0', SPAN, metric='f1', unanswerable=True),
  )
}
DATASETS = tuple(_SPECS) + (files.NAME,)


def spec(name: str) -> DatasetSpec:
  """The spec of a named dataset (your own files' depends on them: `spec_of`)."""
  base = name.split(':')[0]  # 'glue/mrpc:2.0.0' -> 'glue/mrpc'
  if base == files.NAME:
    raise DataError(f"data.dataset='{name}': its spec is read from data.train_file (spec_of).")
  if base not in _SPECS:
    raise DataError(
      f"data.dataset='{name}': not a fine-tuning dataset (available: {', '.join(DATASETS)}; "
      f"'{files.NAME}': your own data.train_file, --train_file=PATH)."
    )
  return _SPECS[base]


def spec_of(data: Any) -> DatasetSpec:
  """The spec of the data section's dataset: a named one, or your own files (their kind by
  the train file's extension, their classes its labels, a test split if test_file is set)."""
  if data.dataset != files.NAME:
    if data.train_file:
      raise DataError(
        f"data.train_file={data.train_file}: read only with data.dataset='{files.NAME}' "
        f'(data.dataset={data.dataset!r}; --train_file sets both).'
      )
    return spec(data.dataset)
  files.check(data)
  test = 'test' if data.test_file else ''
  if files.is_span(data):
    return DatasetSpec(
      files.NAME, SPAN, metric='f1', test_split=test, unanswerable=files.has_unanswerable(data)
    )
  labels = files.label_names(data)
  features = ('text', 'text_pair') if data.text_pair_column else ('text',)
  return DatasetSpec(
    files.NAME, CLASSIFICATION, features, len(labels), test_split=test, labels=labels
  )


def split_name(data: Any, which: str) -> str:
  """The configured split ('train' / 'eval' / 'test'), or the dataset's default for ''."""
  configured = getattr(data, f'{which}_split')
  return configured or getattr(spec_of(data), f'{which}_split')


def _register_catalog_builders() -> None:
  # tensorflow_datasets' text and question-answering packages import TensorFlow in some of
  # their modules; importing only these two registers GLUE and SQuAD without it (imported for
  # that side effect).
  import tensorflow_datasets.question_answering.squad  # noqa: F401
  import tensorflow_datasets.text.glue  # noqa: F401


def open_builder(data: Any):
  """The TFDS builder of a catalog dataset (prepared first when data.download is on)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  _register_catalog_builders()
  data_dir = os.path.abspath(os.path.expanduser(data.data_dir))
  try:
    builder = tfds.builder(data.dataset, data_dir=data_dir)
  except (tfds.core.registered.DatasetNotFoundError, ValueError, KeyError) as e:
    raise DataError(
      f"Dataset '{data.dataset}' cannot be opened from data_dir {data_dir}: "
      f'{str(e).strip().splitlines()[0]}'
    ) from None
  if data.download and not builder.is_prepared():
    builder.download_and_prepare(file_format='array_record')
  return builder


def read_records(data: Any, split: str) -> list[dict]:
  """Every record of a catalog dataset's split, or of your own SQuAD-format file (the first
  data.max_examples if > 0)."""
  if data.dataset == files.NAME:
    return files.squad_records(data, split)
  builder = open_builder(data)
  try:
    # Never downloads: an unprepared (or tfrecord) dataset has no random-access source.
    source = builder.as_data_source(split)
  except NotImplementedError:
    raise DataError(
      f"Dataset '{data.dataset}' is not prepared as array_record under data_dir "
      f'{os.path.abspath(os.path.expanduser(data.data_dir))} and '
      f'data.download=False: tfds build {data.dataset} '
      '--file_format=array_record, or set data.download=True.'
    ) from None
  except (ValueError, KeyError) as e:
    raise DataError(
      f"Dataset '{data.dataset}' has no split '{split}': {str(e).strip().splitlines()[0]}"
    ) from None
  count = len(source) if data.max_examples < 0 else min(len(source), data.max_examples)
  if count == 0:
    raise DataError(f"Dataset '{data.dataset}' split '{split}' has zero records.")
  return [source[i] for i in range(count)]


def text(record: dict, feature: str) -> str:
  value = record[feature]
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def labelled_texts(data: Any, split: str) -> dict:
  """{'texts_a', 'texts_b' (or None), 'labels'} of a classification / regression split;
  DataError for a split without labels (GLUE's test splits have label -1)."""
  dataset = spec_of(data)
  if dataset.name == files.NAME:
    loaded = files.labelled_texts(data, split)
  elif dataset.embedded:
    loaded = bible.load(dataset.name, split)
    if 0 < data.max_examples < len(loaded['labels']):
      # Evenly spaced, not the first N: verses come in canonical (so label) order.
      keep = np.linspace(0, len(loaded['labels']) - 1, data.max_examples).round().astype(int)
      loaded = {
        k: None if v is None else [v[i] for i in keep] if isinstance(v, list) else v[keep]
        for k, v in loaded.items()
      }
  else:
    records = read_records(data, split)
    missing = [f for f in dataset.text_features + ('label',) if f not in records[0]]
    if missing:
      raise DataError(
        f"Dataset '{data.dataset}' split '{split}' has no feature(s) {missing} "
        f'(has {sorted(records[0])}).'
      )
    first, second = (dataset.text_features + (None,))[:2]
    dtype = np.float32 if dataset.kind == REGRESSION else np.int32
    loaded = {
      'texts_a': [text(r, first) for r in records],
      'texts_b': [text(r, second) for r in records] if second else None,
      'labels': np.asarray([r['label'] for r in records], dtype),
    }
  if (
    dataset.kind == CLASSIFICATION
    and len(loaded['labels'])
    and (loaded['labels'].min() < 0 or loaded['labels'].max() >= dataset.num_classes)
  ):
    raise DataError(
      f"Dataset '{data.dataset}' split '{split}' has labels outside "
      f'[0, {dataset.num_classes}) (min {loaded["labels"].min()}): an unlabelled '
      f'(test) split cannot be trained or evaluated on.'
    )
  return loaded

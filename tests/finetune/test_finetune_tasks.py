"""GLUE and SQuAD paths end to end on tfds.testing.mock_data; SQuAD windows and span
post-processing by hand; the embedded task's splits; one-line errors before compilation."""

import numpy as np
import pytest
import tensorflow_datasets as tfds
from data_fixtures import bible_tokenizer  # noqa: F401  (fixture)
from finetune_fixtures import toy_config

from realformer_jax import finetune
from realformer_jax.config import ConfigError
from realformer_jax.data import DataError, corpus
from realformer_jax.finetune import bible, squad

CONTEXT = (
  'In the beginning God created the heavens and the earth. And the earth was waste '
  'and void; and darkness was upon the face of the deep.'
)
ANSWER = 'the heavens and the earth'


def _features(tokenizer, max_len=20, stride=3):
  examples = squad.Examples(
    questions=['What did God create?'],
    contexts=[CONTEXT],
    gold_answers=[[ANSWER]],
    answer_starts=[CONTEXT.index(ANSWER)],
  )
  return examples, squad.make_features(examples, tokenizer, max_len, stride, max_query_len=6)


def test_squad_windows_cover_the_context_and_target_the_answer(bible_tokenizer):  # noqa: F811
  tokenizer = bible_tokenizer
  examples, features = _features(tokenizer)
  ids, starts, _ = tokenizer.encode_with_offsets(CONTEXT)
  assert len(features.example_index) > 3  # the context needs several windows
  owner = np.zeros(len(ids), int)  # windows where each context token has its max context
  answer_windows = 0
  for f in range(len(features.example_index)):
    row = features.arrays['input_ids'][f]
    context = features.token_starts[f] >= 0
    assert (
      row[0] == tokenizer.cls_id
      and row[np.flatnonzero(features.arrays['input_mask'][f])[-1]] == tokenizer.sep_id
    )
    assert np.all(features.arrays['segment_ids'][f][context] == 1)
    # The window's context tokens are a contiguous run of the context's tokens.
    first = int(np.searchsorted(starts, features.token_starts[f][context][0]))
    np.testing.assert_array_equal(row[context], ids[first : first + context.sum()])
    owner[first : first + context.sum()] += features.max_context[f][context]
    s, e = features.arrays['start_positions'][f], features.arrays['end_positions'][f]
    if s:
      answer_windows += 1
      assert CONTEXT[features.token_starts[f, s] : features.token_ends[f, e]] == ANSWER
    else:
      assert e == 0  # [CLS]: the window does not hold the whole answer
  np.testing.assert_array_equal(owner, 1)  # each token's best window is exactly one
  assert answer_windows >= 1


def test_squad_prediction_picks_the_best_valid_span(bible_tokenizer):  # noqa: F811
  examples, features = _features(bible_tokenizer)
  num, length = features.arrays['input_ids'].shape
  start_logits, end_logits = np.zeros((num, length)), np.zeros((num, length))
  f = int(np.flatnonzero(features.arrays['start_positions'])[0])
  s, e = features.arrays['start_positions'][f], features.arrays['end_positions'][f]
  start_logits[f, s], end_logits[f, e] = 5.0, 5.0
  start_logits[:, -1] = end_logits[:, -1] = 9.0  # padding / [SEP]: never a valid span
  end_logits[f, s - 1] = 8.0  # an end before the start: invalid
  prediction = squad.predict(examples, features, start_logits, end_logits, version_2=False)
  assert prediction == [ANSWER]
  assert squad.score(examples, prediction) == {'exact_match': 100.0, 'f1': 100.0}
  # v2.0: a no-answer score ([CLS] + [CLS]) above the best span answers ''.
  start_logits[:, 0] = end_logits[:, 0] = 6.0
  assert squad.predict(examples, features, start_logits, end_logits, version_2=True) == ['']
  assert squad.predict(
    examples, features, start_logits, end_logits, version_2=True, null_threshold=3.0
  ) == [ANSWER]


def test_embedded_task_splits_share_no_chapter():
  chapters = {}
  for split, (low, high) in bible.SPLITS.items():
    chapters[split] = {
      (b, c)
      for b, c, _ in bible._verses()  # pylint: disable=protected-access
      if low <= corpus.chapter_bucket(b, c) < high
    }
  assert not chapters['train'] & chapters['validation']
  assert not chapters['train'] & chapters['test']
  assert not chapters['validation'] & chapters['test']
  # Every chapter the pretraining corpus holds out is a test chapter.
  assert all(
    split == 'test'
    for split in chapters
    for b, c in chapters[split]
    if corpus.is_validation_chapter(b, c)
  )
  sections = bible.load('bible_sections', 'test')
  assert len(sections['texts_a']) == len(sections['labels']) > 3000
  assert set(sections['labels']) == set(range(len(bible.SECTIONS)))
  assert bible.section_of(1) == 0 and bible.section_of(40) == 5 and bible.section_of(66) == 6
  pairs = bible.load('bible_pairs', 'validation')
  assert 0.4 < pairs['labels'].mean() < 0.6


@pytest.mark.slow
@pytest.mark.parametrize('dataset, metric', [('glue/stsb', 'pearson'), ('squad/v2.0', 'f1')])
def test_glue_and_squad_end_to_end_on_mock_data(tmp_path, dataset, metric):
  config = toy_config(dataset, data__max_len=48, data__max_query_len=8, data__doc_stride=16)
  with tfds.testing.mock_data(num_examples=16):
    result = finetune.run(config, str(tmp_path))
  assert result['step'] >= 2  # 16 examples (SQuAD: at least 16 windows) at batch 8
  for name in ('eval/loss', f'eval/{metric}', f'baseline/{metric}'):
    assert np.isfinite(result[name]), name
  assert (tmp_path / 'best').is_dir() and (tmp_path / 'results.json').exists()


def test_bad_fine_tuning_configs_fail_in_one_line(tmp_path):
  cases = [
    (DataError, "data.dataset='glue/nope': not a fine-tuning dataset", toy_config('glue/nope')),
    (DataError, "Dataset 'glue/rte' is not prepared as array_record", toy_config('glue/rte')),
    (
      ConfigError,
      'finetune.init=.*missing.safetensors: no such file',
      toy_config('bible_sections', finetune__init=str(tmp_path / 'missing.safetensors')),
    ),
    (
      ConfigError,
      "finetune.best_metric='f1': bible_sections reports accuracy, matthews_corrcoef",
      toy_config('bible_sections', finetune__best_metric='f1'),
    ),
    (DataError, 'max_query_len=40 is invalid', toy_config('squad/v1.1', data__max_query_len=40)),
    (
      ConfigError,
      'data.max_len=96: sequence longer than the position table model.max_len=64',
      toy_config('bible_sections', data__max_len=96),
    ),
  ]
  for error, message, config in cases:
    with pytest.raises(error, match=message) as raised:
      finetune.run(config, str(tmp_path / 'run'))
    assert '\n' not in str(raised.value)
  assert not (tmp_path / 'run').exists()  # nothing was compiled or written


def test_a_dataset_names_the_head_width_its_kind_has():
  """The classifier's width is DatasetSpec.num_classes for every kind (a regression's one
  output too), so a spec whose kind and width disagree is one line at definition."""
  from realformer_jax.finetune import datasets  # pylint: disable=import-outside-toplevel

  assert datasets.spec('glue/stsb').num_classes == 1
  cases = [
    (dict(kind=datasets.REGRESSION, num_classes=2), 'num_classes=2 for a regression task'),
    (dict(kind=datasets.CLASSIFICATION, num_classes=1), 'expected at least 2'),
    (dict(kind='ranking'), "kind='ranking'"),
  ]
  for fields, message in cases:
    with pytest.raises(DataError, match=message):
      datasets.DatasetSpec('mine', **fields)

"""Every user-fixable data problem is a quick one-line DataError naming what is wrong."""

import time

import numpy as np
import pytest
import tensorflow_datasets as tfds
from data_fixtures import (
  bible_config,
  bible_tokenizer,  # noqa: F401  (pytest fixture)
  files_config,
)

from realformer_jax import data

_WORDS = 'the quick brown fox jumps over a lazy dog while seven wise owls watch'.split()


class RealformerTestTexts(tfds.core.GeneratorBasedBuilder):
  """A local TFDS dataset: exercises the generic (non-embedded) path without any network."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict({'text': tfds.features.Text(), 'label': np.int32}),
    )

  def _split_generators(self, dl_manager):
    rng = np.random.default_rng(0)
    sentences = [' '.join(rng.choice(_WORDS, 12)) + '.' for _ in range(200)]
    return {
      'train': self._generate_examples(sentences),
      'blank': self._generate_examples([' ', '', '\n']),
    }

  def _generate_examples(self, texts):
    for i, text in enumerate(texts):
      yield i, {'text': text, 'label': i % 2}


def _local_config(data_dir, **overrides):
  """The files tests' small BPE config, reading the TFDS dataset above from `data_dir`."""
  local = dict(dataset='realformer_test_texts', data_dir=str(data_dir), eval_split='train')
  return files_config(data_dir, **{**local, **overrides})


def _raises_quickly(match, fn, *args, **kwargs):
  start = time.monotonic()
  with pytest.raises(data.DataError, match=match) as error:
    fn(*args, **kwargs)
  assert time.monotonic() - start < 10, 'a DataError must not wait on the network'
  assert '\n' not in str(error.value)
  return error.value


def test_unknown_dataset_fails_fast(tmp_path):
  config = bible_config(dataset='no_such_dataset_xyz', data_dir=str(tmp_path))
  _raises_quickly(r"Unknown dataset 'no_such_dataset_xyz'.*" + str(tmp_path), data.prepare, config)
  # Community datasets are looked up online, so they are refused while downloads are off.
  _raises_quickly(
    r"'huggingface:no_such_xyz' is a community .*download=True",
    data.prepare,
    bible_config(dataset='huggingface:no_such_xyz', data_dir=str(tmp_path)),
  )


def test_unprepared_catalog_dataset_without_download_fails_fast(tmp_path):
  config = bible_config(dataset='tiny_shakespeare', data_dir=str(tmp_path))
  _raises_quickly(
    r"'tiny_shakespeare' is not prepared under data_dir .*download=False", data.prepare, config
  )
  assert not any(tmp_path.rglob('*.array_record*'))  # Nothing was downloaded or written.


def test_local_dataset_prepares_only_when_download_is_allowed(tmp_path):
  _raises_quickly("'realformer_test_texts' is not prepared", data.prepare, _local_config(tmp_path))
  config = _local_config(tmp_path, download=True)
  tokenizer = data.prepare(config)
  assert tokenizer.vocab_size == 60
  batch = next(data.make_train_iterator(config, 4, seed=0))
  assert batch['input_ids'].shape == (4, 16) and batch['masked_ids'].shape == (4, 4)


def test_empty_split_and_token_free_split(tmp_path, bible_tokenizer):
  _raises_quickly(
    r"'bible_web/1.0.0' split 'train\[:0\]' has zero records",
    data.prepare,
    bible_config(eval_split='train[:0]', vocab_file=bible_tokenizer.source),
  )
  RealformerTestTexts(data_dir=str(tmp_path), file_format='array_record').download_and_prepare()
  _raises_quickly(
    r"split 'blank' feature 'text' has zero tokens",
    data.prepare,
    _local_config(tmp_path, train_split='blank'),
  )
  _raises_quickly(
    r"split 'blank' feature 'text' has zero tokens",
    data.prepare,
    _local_config(tmp_path, eval_split='blank'),
  )


def test_unknown_split_and_missing_or_non_text_feature(bible_tokenizer):
  path = bible_tokenizer.source
  _raises_quickly(
    r"'bible_web/1.0.0' has no split 'test'",
    data.prepare,
    bible_config(eval_split='test', vocab_file=path),
  )
  _raises_quickly(
    r"'bible_web/1.0.0' has no text feature 'body'",
    data.prepare,
    bible_config(text_feature='body', vocab_file=path),
  )
  _raises_quickly(
    r"Feature 'chapter' of dataset 'bible_web/1.0.0' is Tensor, not Text",
    data.prepare,
    bible_config(text_feature='chapter', vocab_file=path),
  )


def test_batch_must_divide_across_processes(bible_tokenizer):
  config = bible_config()
  _raises_quickly(
    r'global_batch_size=6 is not a positive multiple of process_count=4',
    data.make_train_iterator,
    config,
    6,
    0,
    process_index=1,
    process_count=4,
  )
  _raises_quickly(
    r'global_batch_size=6 .* process_count=4',
    data.make_eval_iterator,
    config,
    6,
    process_index=1,
    process_count=4,
  )
  _raises_quickly(
    r'process_index=2 is not in \[0, process_count=2\)',
    data.make_train_iterator,
    config,
    4,
    0,
    process_index=2,
    process_count=2,
  )


def test_bad_config_values_and_tokenizer_files(tmp_path):
  _raises_quickly(r'mask_rate=0.0 is invalid', data.prepare, bible_config(mask_rate=0.0))
  _raises_quickly(
    r'max_predictions=200 is invalid', data.prepare, bible_config(max_predictions=200)
  )
  _raises_quickly(
    r"tokenizer_model_type='word' is invalid",
    data.prepare,
    bible_config(tokenizer_model_type='word'),
  )
  missing = tmp_path / 'missing.model'
  _raises_quickly(
    f'Tokenizer file {missing} does not exist', data.prepare, bible_config(vocab_file=str(missing))
  )
  garbage = tmp_path / 'garbage.model'
  garbage.write_bytes(b'not a model')
  _raises_quickly(
    f'Tokenizer file {garbage} is not a SentencePiece model',
    data.prepare,
    bible_config(vocab_file=str(garbage)),
  )


def test_vocab_too_large_for_the_corpus_names_dataset_and_setting(tmp_path):
  RealformerTestTexts(data_dir=str(tmp_path), file_format='array_record').download_and_prepare()
  _raises_quickly(
    r"vocab_size=5000 on dataset 'realformer_test_texts/1.0.0' split 'train'.*"
    r'Vocabulary size too high',
    data.prepare,
    _local_config(tmp_path, vocab_size=5000, fit_vocab_to_corpus=False),
  )


def test_vocab_too_large_for_the_corpus_fits_to_it_with_a_note(tmp_path, caplog):
  RealformerTestTexts(data_dir=str(tmp_path), file_format='array_record').download_and_prepare()
  tokenizer = data.prepare(_local_config(tmp_path, vocab_size=5000))
  assert 5 < tokenizer.vocab_size < 5000
  assert (
    f'supports at most {tokenizer.vocab_size} bpe pieces, fewer than data.vocab_size=5000'
    in caplog.text
  )
  # The capped tokenizer is cached under the requested size; refusing the cap still refuses it.
  _raises_quickly(
    r'supports at most \d+ pieces.*data.fit_vocab_to_corpus',
    data.prepare,
    _local_config(tmp_path, vocab_size=5000, fit_vocab_to_corpus=False),
  )

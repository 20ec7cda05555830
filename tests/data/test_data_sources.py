"""Data sources behind one interface (realformer_jax/data/sources): 'auto' picks the built-in
source a config names, a source's module is imported only when it is opened, the packed
store's key names the source without renaming a store packed before sources were registered
(a run that recorded that store's name resumes), and a new source is one module and one
registration (tests/toy_source.py, the one docs/extending.md shows) that trains end to end."""

import os
import types

import pytest
from data_fixtures import bible_config, bible_tokenizer  # noqa: F401  (a fixture)

from realformer_jax import data
from realformer_jax.data import preparation, sources
from realformer_jax.data.errors import DataError
from realformer_jax.data.store import packed_store


def test_auto_picks_the_source_a_config_names():
  config = data.DataConfig()
  assert sources.for_config(config).name == 'embedded'
  assert sources.for_config(config.replace(dataset='wikipedia/20230601.en')).name == 'tfds'
  assert sources.for_config(config.replace(train_files='/corpus/*.txt')).name == 'files'
  assert sources.for_config(config.replace(source='tfds')).name == 'tfds'
  with pytest.raises(DataError, match=r"source='nope' is invalid: 'auto' or a registered"):
    data.DataConfig(source='nope')
  with pytest.raises(ValueError, match='already registered'):
    sources.register(sources.Source('tfds', 'x'))


def test_a_source_that_is_not_asked_for_says_what_it_reads(tmp_path):
  with pytest.raises(DataError, match='data.source=embedded reads data.dataset'):
    sources.get('embedded').open(data.DataConfig(source='embedded', dataset='wiki'), None)
  with pytest.raises(DataError, match='data.source=files: set data.train_files'):
    sources.get('files').open(data.DataConfig(source='files', data_dir=str(tmp_path)), None)


# Store names the code before the source registry gave these keys (computed with it): a run
# whose checkpoint recorded one of them must find the same store after the change.
_OLD_STORE_NAMES = {
  'tfds': 'packed-L32-de02188d4844.int32',
  'embedded': 'packed-L32-01bf55f4dccf.int32',
  'files': 'packed-L32-00e3ee8d33bb.int32',
}


def test_store_keys_keep_the_names_of_stores_packed_before_sources_had_names():
  config = data.DataConfig(max_len=32, train_split='train[:90%]')
  tokenizer = types.SimpleNamespace(sha256='ab' * 32)
  opened_keys = {  # OpenedSource.key of each built-in source (see the next test)
    'tfds': {'dataset': 'wikipedia/20230601.en', 'split': config.train_split},
    'embedded': {'dataset': 'bible_web/1.0.0', 'split': config.train_split},
    'files': {'dataset': 'files-0123456789abcdef'},
  }
  for name, opened_key in opened_keys.items():
    prepared = types.SimpleNamespace(source=name, source_key=opened_key, tokenizer=tokenizer)
    key = preparation.store_key(config, prepared)
    assert packed_store.store_path('', key) == _OLD_STORE_NAMES[name], name
    assert ('split' in key) == (name != 'files')  # a file corpus is named by content
  files_key = preparation.store_key(
    config, types.SimpleNamespace(source='files', source_key={}, tokenizer=tokenizer)
  )
  assert files_key['source'] == 'files'


def test_the_builtin_sources_give_the_keys_their_stores_have(bible_tokenizer, tmp_path):
  del bible_tokenizer  # the embedded corpus, prepared once per session
  embedded = preparation.prepared_data(bible_config())
  assert embedded.source == 'embedded'
  assert embedded.source_key == {'dataset': 'bible_web/1.0.0', 'split': 'train'}
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'a.txt').write_text(
    ''.join(f'Document {i} says hello to {i + 1}.\n\n' for i in range(40))
  )
  opened = sources.get('files').open(
    data.DataConfig(train_files=str(corpus), data_dir=str(tmp_path / 'cache')), None
  )
  assert opened.key == {'dataset': opened.dataset_name} and opened.dataset_name.startswith('files-')


def test_a_new_source_is_one_module_and_one_registration(tmp_path):
  import toy_source  # pylint: disable=import-outside-toplevel  # registers 'lines'

  try:
    text = tmp_path / 'lines.txt'
    words = 'light water earth heaven day night seed tree fruit sea'.split()
    text.write_text(
      ''.join(
        f'{words[i % 10]} and {words[(3 * i) % 10]} were made on day {i}.\n' for i in range(300)
      )
    )
    config = bible_config(
      source='lines',
      dataset=str(text),
      data_dir=str(tmp_path / 'cache'),
      vocab_size=64,
      max_len=16,
      max_predictions=3,
    )
    tokenizer = data.prepare(config)
    prepared = preparation.prepared_data(data.data_config(config))
    assert prepared.source == 'lines' and prepared.description == f'lines of {text}'
    store = preparation.packed_train_store(data.data_config(config))
    assert os.path.dirname(store.path).startswith(str(tmp_path / 'cache' / 'lines-'))
    assert store.record['source'] == 'lines'  # the sidecar says which source packed it
    batch = next(data.make_train_iterator(config, 4, 0, 0, 1))
    assert batch['input_ids'].shape == (4, 16) and (batch['input_ids'] == tokenizer.cls_id).any()
    with pytest.raises(DataError, match='no such file'):
      data.prepare(bible_config(source='lines', dataset=str(tmp_path / 'none.txt')))
  finally:
    sources.unregister(toy_source.SOURCE.name)

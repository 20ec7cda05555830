"""The cyclic collector is paused while a file corpus is read (its per-file tables made every
full collection slower), and is as it was afterwards, also after an error."""

import gc

import pytest
from data_fixtures import files_config, write_corpus

from realformer_jax import data
from realformer_jax.data import file_corpus, gc_pause


def test_paused_restores_the_collector_as_it_was_even_after_an_error():
  assert gc.isenabled()
  with pytest.raises(ValueError), gc_pause.paused():
    assert not gc.isenabled()
    raise ValueError('a failed read')
  assert gc.isenabled()
  gc.disable()  # a caller that paused it already keeps it paused
  try:
    with gc_pause.paused():
      pass
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_a_corpus_is_read_with_the_collector_paused_and_left_running(tmp_path, monkeypatch):
  write_corpus(tmp_path / 'corpus', train_files=3, docs_per_file=20)
  corpus_dir = tmp_path / 'corpus'
  config = files_config(
    tmp_path, train_files=str(corpus_dir / 'train-*.txt'), eval_files=str(corpus_dir / 'eval.txt')
  )
  seen, write_shard = [], file_corpus._write_shard  # pylint: disable=protected-access

  def recorded(*args):
    seen.append(gc.isenabled())
    return write_shard(*args)

  monkeypatch.setattr(file_corpus, '_write_shard', recorded)
  corpus = file_corpus.open_corpus(data.config.data_config(config), config.data_dir, 1)
  assert seen and not any(seen)  # every shard written with the collector paused
  assert corpus.text_bytes['train'] > 0 and gc.isenabled()

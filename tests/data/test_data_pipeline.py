"""End to end on the embedded bible_web corpus: contract, determinism, checkpoints, eval.

Process-count invariance of the train data and the packed store: test_data_global_order.py.
"""

import json

import numpy as np
import pytest
from data_fixtures import (
  assert_same_batches,
  bible_config,
  bible_tokenizer,  # noqa: F401  (pytest fixture)
  take,
)

from realformer_jax import data
from realformer_jax.data import preparation, sources
from realformer_jax.data import tokenizers as tokenizer_lib

BATCH = 8
CONTRACT = {
  'input_ids': (np.int32, 128),
  'segment_ids': (np.int32, 128),
  'input_mask': (np.int32, 128),
  'masked_positions': (np.int32, 20),
  'masked_ids': (np.int32, 20),
  'masked_weights': (np.float32, 20),
}


def _check_batch(batch, tokenizer, batch_size):
  assert set(batch) == set(CONTRACT)
  for key, (dtype, width) in CONTRACT.items():
    assert batch[key].dtype == dtype and batch[key].shape == (batch_size, width), key
  ids, mask = batch['input_ids'], batch['input_mask']
  assert (ids[mask == 0] == 0).all() and (ids[:, 0][mask[:, 0] == 1] == tokenizer.cls_id).all()
  assert not batch['segment_ids'].any()
  rows = np.arange(batch_size)[:, None]
  used = batch['masked_weights'] > 0
  # Predictions sit on real tokens; the corrupted input differs only there.
  assert (mask[rows, batch['masked_positions']][used] == 1).all()
  assert (batch['masked_ids'][used] >= 5).all()


def test_tokenizer_special_ids_and_round_trip(bible_tokenizer):
  tok = bible_tokenizer
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  # The table batches built without a tokenizer use (realformer_jax/studies/study.py).
  assert [tok.id_to_piece(i) for i in range(5)] == list(tokenizer_lib.TRAINED_SPECIALS)
  assert tok.vocab_size == 8000
  text = 'In the beginning God created the heavens and the earth.'
  assert tok.decode(tok.encode(text)) == text
  # The literal text of a special token is ordinary characters ('[' is [UNK] here: the
  # corpus has no brackets), never the special id.
  ids = set(tok.encode('[MASK] [CLS] [SEP] [PAD]').tolist())
  assert not ids & {tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id}


@pytest.mark.slow
def test_tokenizer_cache_is_reused_and_keyed_by_settings(bible_tokenizer):
  config = bible_config()
  cached = preparation._PREPARED.pop(data.data_config(config))  # Forget the in-process memo only.
  again = data.prepare(config)
  assert again.source == cached.tokenizer.source  # Loaded from the cache file, not retrained.
  bpe = data.prepare(bible_config(tokenizer_model_type='bpe', vocab_size=500))
  assert bpe.source != again.source and bpe.vocab_size == 500
  assert data.prepare(bible_config(vocab_file=bpe.source)).vocab_size == 500


@pytest.mark.slow
def test_train_and_validation_share_no_passage():
  config = bible_config()
  builder = sources.load_builder(config)
  passages = {}
  for split in ('train', 'validation'):
    records = sources.open_split(builder, split, 'text')
    passages[split] = {(int(r['book_number']), int(r['chapter'])) for r in records}
    texts = {r['text'] for r in records}
    passages[split + '_texts'] = texts
  assert len(passages['train']) == 1134 and len(passages['validation']) == 55
  assert not passages['train'] & passages['validation']
  assert not passages['train_texts'] & passages['validation_texts']
  assert len(passages['train'] | passages['validation']) == 1189  # Every chapter, once.


def test_train_batches_follow_the_contract(bible_tokenizer):
  batches = take(data.make_train_iterator(bible_config(), BATCH, seed=0), 3)
  for batch in batches:
    _check_batch(batch, bible_tokenizer, BATCH)
  selected = sum(b['masked_weights'].sum() for b in batches)
  candidates = sum(
    ((b['input_mask'] == 1) & (b['input_ids'] != 2) & (b['input_ids'] != 3)).sum() for b in batches
  )
  assert 0.13 < selected / candidates < 0.17


def test_same_seed_same_batches_different_seed_different():
  config = bible_config()
  a = take(data.make_train_iterator(config, BATCH, seed=1), 3)
  b = take(data.make_train_iterator(config, BATCH, seed=1), 3)
  c = take(data.make_train_iterator(config, BATCH, seed=2), 3)
  assert_same_batches(a, b)
  assert not np.array_equal(a[0]['input_ids'], c[0]['input_ids'])


def test_restored_iterator_yields_the_same_following_batches():
  config = bible_config()
  iterator = data.make_train_iterator(config, BATCH, seed=5)
  take(iterator, 11)
  state = json.loads(json.dumps(iterator.get_state()))  # Must survive JSON (orbax handler).
  following = take(iterator, 4)
  restored = data.make_train_iterator(config, BATCH, seed=5)
  restored.set_state(state)
  assert_same_batches(following, take(restored, 4))


def test_eval_is_finite_reiterable_and_split_evenly_across_processes(bible_tokenizer):
  config = bible_config()
  single = data.make_eval_iterator(config, BATCH)
  batches = list(single)
  assert len(batches) == len(single) > 10 and len(list(single)) == len(batches)
  for batch in batches:
    _check_batch(batch, bible_tokenizer, BATCH)
  halves = [data.make_eval_iterator(config, BATCH, p, 2) for p in (0, 1)]
  assert len(halves[0]) == len(halves[1]) == len(single)

  # Same sequences and masks whatever the process count; padding rows carry no weight.
  def real_rows(batch_lists):
    rows = np.concatenate([b['input_ids'] for bl in batch_lists for b in bl])
    return sorted(map(bytes, rows[rows.any(axis=1)]))

  assert real_rows([batches]) == real_rows([list(h) for h in halves])
  weight = lambda bl: sum(b['masked_weights'].sum() for b in bl)
  assert weight(batches) == weight(halves[0]) + weight(halves[1])

  capped = data.make_eval_iterator(bible_config(eval_batches=2), BATCH)
  assert_same_batches(list(capped), batches[:2])


def test_most_frequent_token_baseline_matches_a_direct_count():
  config = bible_config()
  targets = np.concatenate(
    [b['masked_ids'][b['masked_weights'] > 0] for b in data.make_eval_iterator(config, BATCH)]
  )
  expected = np.bincount(targets).max() / len(targets)
  assert data.most_frequent_token_baseline(config) == pytest.approx(expected)
  assert 0.02 < expected < 0.2

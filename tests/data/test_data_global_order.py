"""Train data as a function of the global position only: the packed store, the same global
batches for any process count, each process reading only its rows, and iterator states that
restore across process counts."""

import json

import numpy as np
import pytest
from data_fixtures import (
  assert_same_batches,
  bible_config,
  bible_tokenizer,  # noqa: F401  (pytest fixture)
)

from realformer_jax import data
from realformer_jax.data import packing, pipeline, preparation, sources
from realformer_jax.data.store import packed_store

G = 8  # Global batch size.


@pytest.fixture
def small_config(bible_tokenizer):
  """20 chapters (~160 packed rows): an epoch is ~20 global batches."""
  return bible_config(max_documents=20, vocab_file=bible_tokenizer.source)


def _original_ids(batch):
  """input_ids with the masked positions restored: the packed rows the batch was made from."""
  ids = batch['input_ids'].copy()
  used = batch['masked_weights'] > 0
  rows = np.broadcast_to(np.arange(len(ids))[:, None], used.shape)
  ids[rows[used], batch['masked_positions'][used]] = batch['masked_ids'][used]
  return ids


def _global_batches(config, seed, process_count, num_batches, global_batch_size=G):
  """Global batches assembled from the per-process batches, in process order."""
  iterators = [
    data.make_train_iterator(config, global_batch_size, seed, p, process_count)
    for p in range(process_count)
  ]
  batches = []
  for _ in range(num_batches):
    parts = [next(iterator) for iterator in iterators]
    for part in parts:
      assert part['input_ids'].shape[0] == global_batch_size // process_count
    batches.append({k: np.concatenate([part[k] for part in parts]) for k in parts[0]})
  return batches


def test_store_is_built_once_and_keeps_every_token(small_config, bible_tokenizer, monkeypatch):
  store = preparation.packed_train_store(small_config)
  preparation._PACKED.pop(data.data_config(small_config))  # Forget the in-process memo only.
  monkeypatch.setattr(packed_store, '_build', lambda *a, **k: pytest.fail('rebuilt'))
  again = preparation.packed_train_store(small_config)
  assert again.path == store.path and len(again) == len(store)
  with open(store.path + '.json') as f:
    assert json.load(f)['rows'] == len(store)

  tok = bible_tokenizer
  records = preparation.prepared_data(small_config).train_records
  documents = [tok.encode(sources.text_of(records[i], 'text')) for i in range(len(records))]
  rows = store.rows(np.arange(len(store)))
  assert rows.shape == (len(store), 128) and 100 < len(store) < 300
  assert np.count_nonzero(rows) == sum(map(len, documents)) + 2 * len(store)
  # The same [CLS] ... [SEP] packing as the eval split, in stored document order.
  expected = [
    s['input_ids']
    for s in packing.pack_documents(
      documents, max_len=128, cls_id=tok.cls_id, sep_id=tok.sep_id, pad_id=tok.pad_id
    )
  ]
  np.testing.assert_array_equal(rows, np.stack(expected))


def test_global_batches_do_not_depend_on_the_process_count(small_config):
  num_rows = len(preparation.packed_train_store(small_config))
  num_batches = num_rows // G + 3  # Past the first epoch boundary.
  reference = _global_batches(small_config, 3, 1, num_batches)
  for process_count in (2, 4):
    assert_same_batches(_global_batches(small_config, 3, process_count, num_batches), reference)

  # Each epoch is every packed row once, in a new order; batches run across the boundary.
  store_rows = preparation.packed_train_store(small_config).rows(np.arange(num_rows))
  stream = np.concatenate([_original_ids(b) for b in reference])
  epochs = [stream[:num_rows], stream[num_rows : 2 * num_rows]]
  assert sorted(map(bytes, epochs[0])) == sorted(map(bytes, store_rows))
  assert not np.array_equal(epochs[0][: len(epochs[1])], epochs[1])
  masked = np.concatenate([b['masked_weights'] for b in reference])
  assert (masked.sum(axis=1) >= 1).all()


def test_one_sequence_a_step_is_the_same_stream(small_config):
  """global_batch_size=1 (a million-token sequence a step): the rows of batch 0 of 8, in order
  (grain once sized its endless stream of 1-row batches at 2^63 and could not slice it)."""
  one_row = _global_batches(small_config, 3, 1, G, global_batch_size=1)
  assert_same_batches(
    [{k: np.concatenate([b[k] for b in one_row]) for k in one_row[0]}],
    _global_batches(small_config, 3, 1, 1),
  )


class _RecordingStore(packed_store.PackedStore):
  """Remembers every row it is asked for."""

  def __init__(self, path, max_len):
    super().__init__(path, max_len)
    self.read = []

  def rows(self, indices):
    self.read.extend(int(i) for i in indices)
    return super().rows(indices)


def test_each_process_reads_only_its_own_rows(small_config):
  store = preparation.packed_train_store(small_config)

  def rows_read(process_index, process_count, num_batches=3):
    recording = _RecordingStore(store.path, store.max_len)
    batches = pipeline.train_batches(
      small_config, G, 7, process_index, process_count, store=recording
    )
    for b in range(num_batches):
      batches[b]  # pylint: disable=pointless-statement
    return recording.read

  everything = rows_read(0, 1)  # 3 global batches of the first epoch: 24 distinct rows.
  assert len(set(everything)) == 3 * G
  shares = [rows_read(p, 4) for p in range(4)]
  for share in shares:
    assert len(share) == 3 * G // 4
  assert sorted(sum(shares, [])) == sorted(everything)  # Disjoint, and together: all of it.


def test_state_saved_with_two_processes_restores_with_any_process_count(small_config, tmp_path):
  iterators = [data.make_train_iterator(small_config, G, 5, p, 2) for p in (0, 1)]
  for _ in range(3):
    for iterator in iterators:
      next(iterator)
  states = [json.loads(json.dumps(iterator.get_state())) for iterator in iterators]
  assert states[0] == states[1] and states[0]['next_position'] == 3 * G
  following = []
  for _ in range(2):
    parts = [next(iterator) for iterator in iterators]
    following.append({k: np.concatenate([part[k] for part in parts]) for k in parts[0]})

  # grain's orbax handler writes one file per process; any of them restores any layout.
  for p in (0, 1):
    (tmp_path / f'process_{p}-of-2.json').write_text(json.dumps(states[p]))
  state = data.saved_train_state(tmp_path)
  one = data.make_train_iterator(small_config, G, 5)
  one.set_state(state)
  assert_same_batches([next(one), next(one)], following)
  quarters = [data.make_train_iterator(small_config, G, 5, p, 4) for p in range(4)]
  for quarter in quarters:
    quarter.set_state(state)
  parts = [next(quarter) for quarter in quarters]
  assert_same_batches([{k: np.concatenate([p[k] for p in parts]) for k in parts[0]}], following[:1])
  # The position is in sequences: a smaller global batch that divides it resumes there too.
  half = data.make_train_iterator(small_config, G // 2, 5)
  half.set_state(state)
  halves = [next(half), next(half)]
  assert_same_batches(
    [{k: np.concatenate([h[k] for h in halves]) for k in halves[0]}], following[:1]
  )

  with pytest.raises(data.DataError, match='not a multiple of global_batch_size=16'):
    data.make_train_iterator(small_config, 2 * G, 5).set_state(state)
  with pytest.raises(data.DataError, match='seed=5'):
    data.make_train_iterator(small_config, G, 6).set_state(state)
  with pytest.raises(data.DataError, match='store='):
    data.make_train_iterator(bible_config(), G, 5).set_state(state)

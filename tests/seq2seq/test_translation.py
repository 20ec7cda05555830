"""WEB -> BBE translation: verse alignment, cached data, batches, the seq2seq loss, config errors,
and the experiment's table and verdicts (realformer_jax/commands/translate.py). The experiment's
commands themselves run at toy size in tests/experiments/test_configs.py."""

import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest
import repo_paths
from data_fixtures import bible_config

from realformer_jax.config import ConfigError
from realformer_jax.data import DataError
from realformer_jax.seq2seq import bible_pairs
from realformer_jax.seq2seq import config as translation_config
from realformer_jax.seq2seq import data as data_lib
from realformer_jax.seq2seq import task as translation_task


def _data_dir() -> str:
  return bible_config().data_dir  # the data tests' session directory; ours is a subfolder


def _data_config(**overrides) -> data_lib.TranslationDataConfig:
  values = dict(
    data_dir=_data_dir(),
    vocab_size=300,
    max_pairs=80,
    bucket_lengths=(16, 32, 48),
    tokens_per_batch=192,
  )
  return data_lib.TranslationDataConfig(**{**values, **overrides})


@pytest.mark.slow
def test_bbe_verses_follow_the_kjv_references_of_the_edition():
  bbe, web = bible_pairs.bbe_verses(), bible_pairs.web_verses()
  # Genesis 42:39 of the BBE numbering is Genesis 43:1 (the edition says \43:1\).
  assert bbe[1043001] == 'Now the land was in bitter need of food.'
  assert bbe[1043002].startswith('And when the grain which they had got in Egypt')
  # Psalm 3: the BBE's verse 1 is the title (dropped); its verse 2 is KJV 3:1.
  assert bbe[19003001].startswith('Lord, how greatly are they increased')
  assert web[19003001].startswith('Yahweh, how my adversaries have increased!')
  # Malachi 4:1 exists under its KJV number; no markup is left in any verse.
  assert bbe[39004001].startswith('For see, the day is coming')
  assert not any(c in text for text in bbe.values() for c in '*[]\\<>')
  pairs = bible_pairs.verse_pairs()
  assert len(pairs) > 31_000
  # Aligned verses have similar lengths: a shifted alignment would not.
  ratios = np.asarray([len(b) / len(w) for _, w, b in pairs])
  assert np.mean((ratios > 0.5) & (ratios < 2.0)) > 0.995


def test_splits_hold_out_whole_books():
  by_split = {}
  for verse_id, _, _ in bible_pairs.verse_pairs():
    by_split.setdefault(bible_pairs.split_of(verse_id), set()).add(verse_id // 1_000_000)
  assert by_split['test'] == set(bible_pairs.TEST_BOOKS)
  assert by_split['validation'] == set(bible_pairs.DEV_BOOKS)
  assert not by_split['train'] & (by_split['test'] | by_split['validation'])


def test_prepare_encodes_every_split_and_reuses_its_cache(tmp_path):
  # A cache of its own: other tests share the session data dir with other configs.
  config = _data_config(data_dir=str(tmp_path))
  data = data_lib.prepare(config)
  cache = os.path.join(str(tmp_path), data_lib.DATASET)
  files = {
    name: os.path.getmtime(os.path.join(cache, name))
    for name in os.listdir(cache)
    if name.endswith('.npz')
  }
  assert len(files) == 1
  for name in bible_pairs.SPLITS:
    split = data.splits[name]
    assert 0 < len(split) <= 80
    decoded = data.tokenizer.decode(split.targets[0])
    assert decoded.split()[:3] == split.references[0].split()[:3]
  data_lib._PREPARED.clear()  # a new process: reads the files, writes nothing
  again = data_lib.prepare(config)
  assert again.tokenizer.sha256 == data.tokenizer.sha256
  assert {n: os.path.getmtime(os.path.join(cache, n)) for n in files} == files
  np.testing.assert_array_equal(
    np.concatenate(again.splits['test'].sources), np.concatenate(data.splits['test'].sources)
  )


def test_train_batches_cover_the_split_once_in_buckets():
  config = _data_config()
  data = data_lib.prepare(config)
  train = data.splits['train']
  batches = list(data_lib.train_batches(data, config, seed=3, epoch=0))
  assert len(batches) == data_lib.batches_per_epoch(data, config)
  seen = []
  for batch in batches:
    rows, length = batch['source'].shape
    assert length in config.bucket_lengths and rows == config.tokens_per_batch // length
    real = batch['target_mask'].sum(1) > 0
    # target_in is [CLS] + target, target_out is target + [SEP]: shifted by one.
    inner = batch['target_mask'][real, 1:]  # positions followed by another target token
    np.testing.assert_array_equal(
      batch['target_in'][real, 1:] * inner, batch['target_out'][real, :-1] * inner
    )
    assert np.all(batch['target_in'][real, 0] == data.bos_id)
    for row in np.flatnonzero(real):
      n = int(batch['target_mask'][row].sum())
      assert batch['target_out'][row, n - 1] == data.eos_id
      seen.append(tuple(batch['target_out'][row, : n - 1]))
  assert sorted(seen) == sorted(tuple(t) for t in train.targets)
  again = [b['source'] for b in data_lib.train_batches(data, config, seed=3, epoch=0)]
  other = [b['source'] for b in data_lib.train_batches(data, config, seed=3, epoch=1)]
  assert all(np.array_equal(a, b['source']) for a, b in zip(again, batches))
  assert not all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(other, again))


def test_eval_batches_have_one_shape_and_every_pair():
  config = _data_config()
  data = data_lib.prepare(config)
  indices = []
  for batch, rows in data_lib.eval_batches(data, 'test', config, batch_size=16):
    assert batch['source'].shape == (16, config.bucket_lengths[-1])
    for row, index in enumerate(rows):
      n = int(batch['source_mask'][row].sum())
      np.testing.assert_array_equal(
        batch['source'][row, : n - 1], data.splits['test'].sources[index][: n - 1]
      )
    assert not batch['source'][len(rows) :].any()
    indices += list(rows)
  assert sorted(indices) == list(range(len(data.splits['test'])))


@pytest.mark.parametrize(
  'overrides, field',
  [
    (dict(bucket_lengths=(32, 16)), 'bucket_lengths'),
    (dict(tokens_per_batch=8), 'tokens_per_batch'),
    (dict(test_books=(8, 31)), 'test_books'),
    (dict(dev_books=(70,)), 'dev_books'),
  ],
)
def test_bad_data_config_is_one_line_naming_the_field(overrides, field):
  with pytest.raises(DataError, match=f'data config: {field}='):
    _data_config(**overrides)


@pytest.mark.parametrize(
  'section, name, value, message',
  [
    ('train', 'warmup_steps', 5000, 'train.warmup_steps=5000'),
    ('train', 'label_smoothing', 1.0, 'train.label_smoothing=1.0'),
    ('decode', 'beam_size', 0, 'decode.beam_size=0'),
    ('model', 'max_len', 32, 'model.max_len=32'),
    ('model', 'decoder_attention', 'fused', "model.decoder_attention='fused'"),
  ],
)
def test_bad_translation_config_is_one_line_naming_the_field(section, name, value, message):
  config = translation_config.default_translation_config()
  config[section][name] = value
  with pytest.raises(ConfigError, match=message.replace('.', r'\.').replace('(', r'\(')):
    translation_task.validate(config)


@pytest.mark.slow
def test_label_smoothed_loss_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7)) * 3
  targets = rng.integers(0, 7, (2, 3))
  weights = np.array([[1, 1, 0], [1, 0, 0]])
  loss, sums = translation_task.label_smoothed_loss(
    jnp.asarray(logits, jnp.float32), jnp.asarray(targets), jnp.asarray(weights), 0.1
  )
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  per_token = 0.9 * nll + 0.1 * -log_p.mean(-1)
  np.testing.assert_allclose(loss, (per_token * weights).sum() / 3, rtol=1e-5)
  np.testing.assert_allclose(sums['nll_sum'], (nll * weights).sum(), rtol=1e-5)
  assert float(sums['tokens']) == 3.0
  correct = (logits.argmax(-1) == targets) * weights
  assert float(sums['correct_sum']) == correct.sum()


def _fake_results(config, bleu, speed_ratio):
  """Per-run results and per-seed speeds as the grid and the benchmark write them."""
  seeds = config.experiment.seeds
  results, speed = {}, {}
  for i, seed in enumerate(seeds):
    for kind, shift in (('standard', 0.0), ('merged', bleu)):
      results[f'{kind}-s{seed}'] = {
        'test_bleu_greedy': 20.0 + i + shift,
        'test_bleu_beam': 21.0 + i + shift,
        'test_beam_signature': 'sig',
        'final_dev_nll': 3.0 + 0.1 * i,
        'num_params': 1000,
        'history': {'train_seconds': 60.0 + i},
      }
    speed[seed] = {
      search: {
        measure: {'standard': 100.0 + i, 'merged': (100.0 + i) * speed_ratio * (1 + 0.01 * i)}
        for measure in ('to_eos', 'fixed')
      }
      for search in ('greedy', 'beam')
    }
  return results, speed


@pytest.mark.slow
def test_experiment_table_reports_intervals_and_verdicts(tmp_path):
  from realformer_jax.commands import translate  # pylint: disable=import-outside-toplevel
  from realformer_jax.configs import translate as translate_config  # pylint: disable=import-outside-toplevel

  config = translate_config.get_config('cpu')
  results, speed = _fake_results(config, bleu=0.0, speed_ratio=1.5)
  summary = translate.analyse(config, results, speed, copy_source_bleu=5.0)
  # Same BLEU on every seed: a zero difference with zero spread is not "higher" or "lower".
  assert summary['bleu']['greedy']['merged_minus_standard']['mean'] == 0.0
  assert summary['bleu']['greedy']['verdict'] == 'inconclusive'
  ratio = summary['speed']['beam']['fixed']['merged_over_standard']
  assert ratio['values'] == pytest.approx([1.5, 1.515, 1.53])
  assert summary['speed']['beam']['fixed']['verdict'] == 'faster'
  table = translate.results_markdown(config, 'cpu', results, summary)
  assert '| greedy | 21.00 ± 2.48 (20.00, 21.00, 22.00) |' in table
  assert '| beam | fixed |' in table and 'faster' in table
  assert 'Copying the WEB source unchanged scores 5.00 BLEU' in table
  translate.plot(config, results, summary, str(tmp_path / 'plot.png'))
  assert (tmp_path / 'plot.png').stat().st_size > 10_000
  worse, _ = _fake_results(config, bleu=-2.0, speed_ratio=0.9)
  summary = translate.analyse(config, worse, _fake_results(config, 0.0, 0.9)[1], 5.0)
  assert summary['bleu']['beam']['verdict'] == 'lower'
  # The floor rule: a decoder that does not beat copying the source leaves nothing to compare.
  below = translate.analyse(config, worse, _fake_results(config, 0.0, 0.9)[1], 20.5)
  assert below['bleu']['beam']['verdict'] == translate.NOT_TESTABLE
  assert summary['speed']['greedy']['to_eos']['verdict'] == 'slower'
  json.dumps(summary)  # results.json holds it as is
  assert math.isfinite(summary['bleu']['beam']['merged_minus_standard']['ci95_half_width'])


@pytest.mark.slow
def test_readme_seq2seq_example_runs(capsys):
  import pathlib  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel

  page = pathlib.Path(repo_paths.REPO) / 'docs' / 'training.md'
  readme = page.read_text()
  block = next(
    b for b in re.findall(r'```python\n(.*?)```', readme, flags=re.S) if 'beam_search(' in b
  )
  exec(compile(block, str(page), 'exec'), {})  # noqa: S102
  assert '(1, 3, 100) (1, 8)' in capsys.readouterr().out

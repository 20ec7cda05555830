"""`[MASK]` read one way (issue 69): `Tokenizer.encode_masked` gives the ids the exported Hugging
Face tokenizer gives for text with literal `[MASK]`s, and `mlm.fill_mask` ranks the masked LM's
guesses at exactly those positions."""

import jax.numpy as jnp
import numpy as np
import pytest
from finetune_fixtures import tokenizer_file
from model_fixtures import init_params, tiny_config

from realformer_jax import MaskedLM, mlm
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data.tokenizers import wordpiece
from realformer_jax.interop import hf_export

_QUERIES = (
  'In the beginning God [MASK] the heaven',
  'free [MASK]; you',
  '[MASK] said',
  'a[MASK]b',
  'x [MASK] [MASK] y',
  'the end [MASK]',
  'The  [MASK]  light.',
)


def test_encode_keeps_mask_text_ordinary_and_encode_masked_does_not():
  ours = tokenizer_lib.load(tokenizer_file())
  text = 'God [MASK] the heaven'
  assert ours.mask_id not in ours.encode(text)  # corpus text never forges the token
  masked = ours.encode_masked(text)
  assert masked.tolist().count(ours.mask_id) == 1
  assert masked.tolist() == [*ours.encode('God'), ours.mask_id, *ours.encode(' the heaven')]


@pytest.mark.slow  # imports transformers: ~7 s CPU (it pulls torch)
@pytest.mark.parametrize('kind', ['sentencepiece', 'wordpiece'])
def test_encode_masked_gives_the_exported_tokenizers_ids(tmp_path, kind):
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

  if kind == 'sentencepiece':
    ours = tokenizer_lib.load(tokenizer_file())
  else:
    words = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'in', 'the', 'god', 'a', 'b', ';']
    vocab = tmp_path / 'vocab.txt'
    vocab.write_text('\n'.join(words + ['free', 'you', 'said', 'x', 'y', 'end', '.']) + '\n')
    ours = wordpiece.WordPieceTokenizer.from_file(str(vocab))
  (tmp_path / 'hf').mkdir()
  hf_export.write_tokenizer(ours, str(tmp_path / 'hf'))
  theirs = AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
  for text in _QUERIES:
    expected = theirs(text)['input_ids']
    assert [ours.cls_id, *ours.encode_masked(text).tolist(), ours.sep_id] == expected, text


def _small_wordpiece() -> wordpiece.WordPieceTokenizer:
  words = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'in', 'the', 'god', 'heaven', 'light']
  return wordpiece.WordPieceTokenizer('\n'.join(words).encode() + b'\n', lower_case=True)


@pytest.mark.slow  # two applications of a toy model (~17 s CPU on a loaded 2-core machine)
def test_fill_mask_ranks_the_models_probabilities_at_each_mask():
  ours = _small_wordpiece()
  config = tiny_config(vocab_size=16, max_len=32)  # more rows than pieces: never proposed
  ids = jnp.ones((1, 8), jnp.int32)
  params = init_params(config, ids, jnp.ones_like(ids), jnp.zeros_like(ids))
  text = 'In the [MASK] God [MASK] the heaven'
  answers = mlm.fill_mask(config, params, ours, text, top_k=3)
  assert len(answers) == 2 and all(len(a) == 3 for a in answers)
  # The same numbers from the model's logits at every position (no gather).
  full = np.concatenate([[ours.cls_id], ours.encode_masked(text), [ours.sep_id]])
  logits = np.asarray(MaskedLM(config).apply({'params': params}, full[None]))[0]
  for position, answer in zip(np.flatnonzero(full == ours.mask_id), answers):
    pieces = logits[position, : ours.vocab_size]
    row = np.exp(pieces - pieces.max())
    row /= row.sum()
    best = np.argsort(-row)[:3]
    assert [piece for piece, _ in answer] == [ours.id_to_piece(int(i)) for i in best]
    np.testing.assert_allclose([p for _, p in answer], row[best], rtol=1e-4)
  with pytest.raises(ValueError, match='no \\[MASK\\]'):
    mlm.fill_mask(config, params, ours, 'no mask here')

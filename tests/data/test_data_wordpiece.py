"""WordPiece (BERT vocab.txt) against Hugging Face's BertTokenizer / BertTokenizerFast, and
character offsets of both tokenizer kinds."""

import pickle

import numpy as np
import pytest
from data_fixtures import bible_config, bible_tokenizer  # noqa: F401 (fixture)

from realformer_jax import data
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data.tokenizers import WordPieceTokenizer

TEXTS = [
  'In the beginning, God created the heavens and the earth.',
  "Don't   panic!!  (Really) -- it's 3.14 o'clock; naïve Café résumé ÉCOLE",
  'ΟΔΟΣ and οδός; ß straße İstanbul',
  '中文字符 mixed with English and 日本',
  'tab\there\nnewline\r\nzero\u200bwidth control\x07char \ufffd replacement',
  'averyveryveryverylongwordthatnobodyhaseverwrittenbutwhichmightstillbesplitintopiecesbyth'
  'egreedyalgorithmuntilitrunsout and unknownxq wordsq',
  '',
]


def _vocab(tmp_path):
  words = (
    'the in beginning god created heavens and earth don t panic really it s o clock '
    'naive cafe resume ecole and mixed with english long word never written but piece '
    'un ##known ##s ##ed ##ing ##ly ##er ##q x q a b c d e f g h i j k l m n o p r s u v w '
    'y z ##a ##b ##c ##d ##e ##f ##g ##h ##i ##j ##k ##l ##m ##n ##o ##p ##r ##s ##t ##u ##v '
    "##w ##x ##y ##z 3 1 4 . , ; ( ) - ! ' 中 文 字 符 日 本 οδος σ ς ##ς ##σ ss stra ##ße "
    'istanbul ##ss tab here newline zero ##width control char replacement'
  ).split()
  specials = ['[PAD]'] + [f'[unused{i}]' for i in range(99)] + ['[UNK]', '[CLS]', '[SEP]', '[MASK]']
  path = tmp_path / 'vocab.txt'
  path.write_text('\n'.join(specials + sorted(set(words), key=words.index)) + '\n')
  return str(path)


# Importing transformers' tokenizers costs ~6 s CPU (it pulls torch): imported inside the two
# Hugging Face comparisons, which are in the slow tier.
@pytest.mark.slow
@pytest.mark.parametrize('lower_case', [True, False])
def test_ids_match_hugging_face(tmp_path, lower_case):
  from transformers import BertTokenizer  # pylint: disable=import-outside-toplevel

  path = _vocab(tmp_path)
  ours = tokenizer_lib.load(path, lower_case=lower_case)
  slow = BertTokenizer(path, do_lower_case=lower_case)
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (
    0,
    100,
    101,
    102,
    103,
  )
  assert ours.vocab_size == slow.vocab_size
  for text in TEXTS:
    expected = slow.convert_tokens_to_ids(slow.tokenize(text))
    assert ours.encode(text).tolist() == expected, text
  assert [ids.tolist() for ids in ours.encode_batch(TEXTS[:2])] == [
    ours.encode(t).tolist() for t in TEXTS[:2]
  ]


@pytest.mark.slow
def test_offsets_match_hugging_face_fast(tmp_path):
  from transformers import BertTokenizerFast  # pylint: disable=import-outside-toplevel

  path = _vocab(tmp_path)
  ours = tokenizer_lib.load(path)
  fast = BertTokenizerFast(path, do_lower_case=True)
  for text in TEXTS[:4]:
    ids, starts, ends = ours.encode_with_offsets(text)
    encoded = fast(text, add_special_tokens=False, return_offsets_mapping=True)
    assert ids.tolist() == encoded['input_ids'], text
    assert list(zip(starts.tolist(), ends.tolist())) == [
      tuple(o) for o in encoded['offset_mapping']
    ], text


def test_decode_save_pickle_and_errors(tmp_path):
  path = _vocab(tmp_path)
  ours = tokenizer_lib.load(path)
  assert ours.decode(ours.encode('God created unknowns.')) == 'god created unknowns .'
  assert ours.decode([ours.cls_id] + ours.encode('Heavens').tolist()) == 'heavens'
  copy = pickle.loads(pickle.dumps(ours))
  assert copy.encode(TEXTS[1]).tolist() == ours.encode(TEXTS[1]).tolist()
  saved = ours.save(str(tmp_path / 'workdir'))
  assert saved.endswith('workdir/vocab.txt')
  assert tokenizer_lib.load(saved).sha256 == ours.sha256
  assert tokenizer_lib.load(saved, lower_case=False).sha256 != ours.sha256

  no_mask = tmp_path / 'nomask.txt'
  no_mask.write_text('[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n')
  with pytest.raises(data.DataError, match=r'nomask.txt has no \[MASK\] token'):
    tokenizer_lib.load(str(no_mask))
  pad_late = tmp_path / 'padlate.txt'
  pad_late.write_text('[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\n')
  with pytest.raises(data.DataError, match=r'\[PAD\] must have id 0'):
    tokenizer_lib.load(str(pad_late))


def test_sentencepiece_offsets_cover_the_text(bible_tokenizer):
  text = '  In the beginning — God’s “word”,  naïve ﬁsh'
  ids, starts, ends = bible_tokenizer.encode_with_offsets(text)
  assert ids.tolist() == bible_tokenizer.encode(text).tolist()
  assert np.all(starts < ends) and np.all(np.diff(starts) > 0)
  pieces = [text[s:e] for s, e in zip(starts, ends)]
  assert pieces[:3] == ['In', 'the', 'beginning']
  assert ''.join(pieces).replace(' ', '') == text.replace(' ', '')  # nothing lost or repeated


def test_vocab_file_drives_the_pipeline(tmp_path):
  config = bible_config(
    vocab_file=_vocab(tmp_path), vocab_size=200, max_documents=5, max_len=32, max_predictions=4
  )
  tokenizer = data.prepare(config)
  assert isinstance(tokenizer, WordPieceTokenizer) and tokenizer.mask_id == 103
  batch = next(data.make_train_iterator(config, global_batch_size=4, seed=0))
  assert np.all(batch['input_ids'][:, 0] == 101)  # [CLS] from the vocabulary file
  assert np.all(batch['input_ids'] < tokenizer.vocab_size)

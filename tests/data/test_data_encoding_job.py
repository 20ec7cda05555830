"""An encoding job of preparation (encoding.encode): its UTF-8 batch path against encoding one
decoded text at a time, for both tokenizer kinds, and its counts and digests against a direct
computation."""

import hashlib

import numpy as np
import pytest
from data_fixtures import bible_tokenizer  # noqa: F401 (fixture)

from realformer_jax.data import encoding
from realformer_jax.data import tokenizers as tokenizer_lib

# Empty and whitespace-only documents, several lines, accents, other scripts, control
# characters, a non-BMP character and a long one: what a corpus may hold.
TEXTS = [
  'In the beginning, God created the heavens and the earth.',
  '',
  'line one\nline two\n\n  spaced   out  \n',
  '   \t ',
  "Don't   panic!!  naïve Café résumé ÉCOLE — “quoted” ﬁsh",
  'ΟΔΟΣ and οδός; ß straße İstanbul 中文字符 日本 😀',
  'tab\there zero\u200bwidth control\x07char \ufffd replacement\r\nend',
  'the earth ' * 300,
]


def _wordpiece(tmp_path):
  words = 'the in beginning god created heavens and earth line one two ##s ##e t h e a'.split()
  specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
  path = tmp_path / 'vocab.txt'
  path.write_text('\n'.join(specials + words) + '\n')
  return tokenizer_lib.load(str(path))


@pytest.mark.parametrize('kind', ['sentencepiece', 'wordpiece'])
def test_utf8_batch_ids_equal_one_text_at_a_time(tmp_path, bible_tokenizer, kind):
  tokenizer = bible_tokenizer if kind == 'sentencepiece' else _wordpiece(tmp_path)
  expected = np.concatenate([tokenizer.encode(text) for text in TEXTS])
  flat = tokenizer.encode_utf8_flat([text.encode() for text in TEXTS], num_threads=1)
  assert flat.dtype == np.int32 and len(expected) > 100
  np.testing.assert_array_equal(flat, expected)
  empty = tokenizer.encode_utf8_flat([], num_threads=1)
  assert empty.dtype == np.int32 and empty.shape == (0,)


def test_a_job_over_a_shard_gives_its_ids_counts_and_digests(tmp_path, bible_tokenizer):
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  path = str(tmp_path / 'shard.array_record')
  writer = array_record_module.ArrayRecordWriter(path, 'group_size:1,uncompressed')
  for text in TEXTS:
    writer.write(text.encode())
  writer.close()
  # Two segments of one shard, the second skipping its first record: a job's records in order.
  job = encoding.EncodeJob(((path, 0, 3), (path, 4, len(TEXTS))), bible_tokenizer, 'text')
  texts = TEXTS[:3] + TEXTS[4:]
  result = encoding.encode(job)
  np.testing.assert_array_equal(
    result['ids'], np.concatenate([bible_tokenizer.encode(text) for text in texts])
  )
  assert result['documents'] == len(texts)
  assert result['text_bytes'] == sum(len(text.encode()) for text in texts)
  assert result['digests'] == b''.join(hashlib.sha256(text.encode()).digest() for text in texts)

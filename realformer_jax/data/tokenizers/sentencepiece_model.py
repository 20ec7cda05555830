"""SentencePiece tokenizers with BERT's special tokens (the table in tokenizers/__init__.py),
trained on first use and cached, or read from a given `.model` file.

A corpus too small for the requested vocabulary (SentencePiece's trainer caps it by the pieces
the text supports) fails with a DataError naming both sizes, or, with `fit_to_corpus`, trains
the largest vocabulary it supports instead.

The cache entry is one `.model` file plus a `.json` sidecar recording what it was trained
on and the file's size and checksum (a damaged entry is trained again, with a note:
store/cache_integrity.py); its name holds the model type and vocab size and a hash of every training
setting, so configs that differ never share a file. Training writes the model to memory and
publishes it with an atomic rename under a file lock (see store/cache_lock.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import time
from typing import Iterable

import numpy as np

from realformer_jax import extras
from realformer_jax.data.errors import DataError
from realformer_jax.data.progress import say, wait_for
from realformer_jax.data.store import cache_integrity, cache_lock
from realformer_jax.data.tokenizers.base import CLS, MASK, PAD, SEP, UNK, Tokenizer

spm = extras.lazy('sentencepiece')

MODEL_TYPES = ('unigram', 'bpe')
# Every tokenizer trained here gives piece i of this tuple id i (tokenizers/__init__.py's table;
# batches built without a tokenizer, e.g. studies/study.py's synthetic ones, use it too).
TRAINED_SPECIALS = (PAD, UNK, CLS, SEP, MASK)
# Bump when the trainer settings below change, so old cache entries are not reused.
_TRAINER_REVISION = 1
# SentencePiece skips "sentences" longer than this; we split documents well below it.
_MAX_SENTENCE_CHARS = 4096
# The trainer's threads: a setting (data.tokenizer_threads), not os.cpu_count(), because the
# trained model depends on the thread count (measured, unigram and BPE alike) and hosts with
# local data dirs must train identical tokenizers. 4 is what every cache entry before the
# setting existed was trained with, so it stays the default (and out of the cache key).
DEFAULT_THREADS = 4
_log = logging.getLogger('realformer_jax.data.prepare')
# {cache path: seconds} of the tokenizers this process trained (prepare_data's summary).
TRAINED_SECONDS: dict[str, float] = {}
_SENTENCE_END = re.compile(r'(?<=[.!?;:])\s+|\n+')
_NON_SPACE = re.compile(r'\S')


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model with [PAD] at id 0 and [UNK] [CLS] [SEP] [MASK] pieces."""

  file_name = 'tokenizer.model'

  def __init__(self, model_proto: bytes, source: str = '<memory>'):
    self._model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self._sp_no_prefix = None  # built on first use (_encode_after_special)
    self.source = source
    super().__init__(
      source=source,
      vocab_size=self._sp.get_piece_size(),
      pad_id=self._sp.pad_id(),
      unk_id=self._sp.unk_id(),
      cls_id=self._special_id(CLS),
      sep_id=self._special_id(SEP),
      mask_id=self._special_id(MASK),
    )

  def _special_id(self, piece: str) -> int:
    piece_id = self._sp.piece_to_id(piece)
    if piece_id == self._sp.unk_id() and piece != UNK:
      raise DataError(
        f'Tokenizer {self.source} has no {piece} piece; '
        f'train one with this module or add it as a control symbol.'
      )
    return piece_id

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text, out_type=int), np.int32)

  def _encode_after_special(self, text: str) -> np.ndarray:
    # The exported tokenizer (Metaspace, prepend_scheme 'first') starts a word ('▁') after a
    # special token only where a space follows it: 'a[MASK]b' -> '▁a', '[MASK]', 'b'.
    if text[:1].isspace():
      return self.encode(text)
    if self._sp_no_prefix is None:
      from sentencepiece import sentencepiece_model_pb2  # pylint: disable=import-outside-toplevel

      proto = sentencepiece_model_pb2.ModelProto()
      proto.ParseFromString(self._model_proto)
      proto.normalizer_spec.add_dummy_prefix = False
      self._sp_no_prefix = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    return np.asarray(self._sp_no_prefix.encode(text, out_type=int), np.int32)

  def encode_batch(self, texts: list[str], num_threads: int = -1) -> list[np.ndarray]:
    # SentencePiece spreads a batch over `num_threads` threads (-1: all cores).
    encoded = self._sp.encode(texts, out_type=int, num_threads=num_threads)
    return [np.asarray(ids, np.int32) for ids in encoded]

  def encode_utf8_flat(self, documents: list[bytes], num_threads: int = -1) -> np.ndarray:
    # SentencePiece reads str as its UTF-8 bytes, so bytes give the same ids without decoding;
    # 'numpy' hands back each document's ids as a buffer, not a list of Python ints.
    if not documents:
      return np.zeros(0, np.int32)
    encoded = self._sp.encode(documents, out_type='numpy', num_threads=num_threads)
    return np.concatenate(encoded).astype(np.int32, copy=False)

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pieces = self._sp.encode(text, return_type='proto').pieces
    # SentencePiece reports UTF-8 byte offsets into the input; map them to characters.
    char_of_byte = np.repeat(np.arange(len(text) + 1), [len(c.encode()) for c in text] + [1])
    ids, starts, ends = [], [], []
    for piece in pieces:
      start, end = int(char_of_byte[piece.begin]), int(char_of_byte[piece.end])
      while start < end - 1 and text[start].isspace():  # '▁word' also covers the space
        start += 1
      ids.append(piece.id)
      starts.append(start)
      ends.append(end)
    return tuple(np.asarray(values, np.int32) for values in (ids, starts, ends))

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  def id_to_piece(self, token_id: int) -> str:
    return self._sp.id_to_piece(int(token_id))

  def file_bytes(self) -> bytes:
    return self._model_proto

  def __getstate__(self):
    return {'model_proto': self._model_proto, 'source': self.source}

  def __setstate__(self, state):
    self.__init__(state['model_proto'], state['source'])


def read_model(path: str) -> SentencePieceTokenizer:
  """The SentencePiece model in the file `path` (a cache entry, or `data.vocab_file`)."""
  with open(path, 'rb') as f:
    model_proto = f.read()
  try:
    return SentencePieceTokenizer(model_proto, source=path)
  except RuntimeError as e:  # SentencePiece's parse error.
    raise DataError(
      f'Tokenizer file {path} is not a SentencePiece model (a BERT WordPiece '
      f'vocabulary must end in .txt): {e}'
    ) from None


def cache_path(
  cache_dir: str, *, model_type: str, vocab_size: int, key: dict, num_threads: int = DEFAULT_THREADS
) -> str:
  """Where a tokenizer trained with these settings lives; `key` holds every other setting."""
  key = dict(key, model_type=model_type, vocab_size=vocab_size, revision=_TRAINER_REVISION)
  if num_threads != DEFAULT_THREADS:
    key['threads'] = num_threads
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
  return os.path.join(cache_dir, f'spm-{model_type}-{vocab_size}-{digest}.model')


def load_or_train(
  path: str,
  texts: Iterable[str],
  *,
  model_type: str,
  vocab_size: int,
  description: dict,
  what: str,
  fit_to_corpus: bool = False,
  num_threads: int = DEFAULT_THREADS,
) -> Tokenizer:
  """Loads `path`, or trains on `texts` and publishes it there atomically.

  Args:
    path: the cache file, from `cache_path`.
    texts: documents to train on (only consumed when training).
    model_type: 'unigram' or 'bpe'.
    vocab_size: pieces including the five special ones.
    description: written to the `.json` sidecar, for humans.
    what: names the data in error messages, e.g. "dataset 'x' split 'train' feature 'text'".
    fit_to_corpus: see `train`.
    num_threads: the trainer's threads (part of what the model is: see DEFAULT_THREADS).
  """
  tokenizer, _ = _cached(path)
  if tokenizer is not None:
    return tokenizer
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  with cache_lock.exclusive_lock(directory, os.path.basename(path)):
    tokenizer, reason = _cached(path)
    if tokenizer is not None:  # Another process trained it while we waited.
      return tokenizer
    if os.path.exists(path):  # Derived data: damaged means train it again.
      cache_integrity.note_rebuild(path, reason, 'training the tokenizer again')
    cache_integrity.remove_stale_temporaries(path)
    start = time.monotonic()
    model_proto = train(
      texts,
      model_type=model_type,
      vocab_size=vocab_size,
      what=what,
      fit_to_corpus=fit_to_corpus,
      num_threads=num_threads,
    )
    seconds = TRAINED_SECONDS[path] = time.monotonic() - start
    record = dict(description, threads=num_threads, train_seconds=round(seconds, 1))
    cache_integrity.publish_bytes(path, model_proto, record)
  return SentencePieceTokenizer(model_proto, source=path)


def _cached(path: str):
  """(the tokenizer cached in `path`, None), or (None, why it cannot be used)."""
  reason = cache_integrity.problem(path)
  if reason is None:
    try:
      return read_model(path), None
    except DataError:  # its record matches, its bytes are no model: changed in place
      reason = 'its size and time are as recorded, but its bytes are not a SentencePiece model'
  return None, reason


_VOCAB_TOO_HIGH = re.compile(
  r'Vocabulary size too high \((\d+)\)\. Please set it to a value <= '
  r'(\d+)'
)


def train(
  texts: Iterable[str],
  *,
  model_type: str,
  vocab_size: int,
  what: str,
  fit_to_corpus: bool = False,
  num_threads: int = DEFAULT_THREADS,
) -> bytes:
  """Trains a SentencePiece model in memory and returns its serialized proto.

  `texts` is streamed to the trainer (never gathered into one Python list) when it can be
  iterated again (a list, or an object whose __iter__ starts over, as preparation's sample);
  a one-shot iterator is gathered first, since a retry (below) reads the text twice. A progress
  line is logged every few seconds while the trainer runs. With `fit_to_corpus`, a
  `vocab_size` larger than the corpus supports trains the largest size it does support (the
  caller sees the smaller `vocab_size` of the result).
  """
  if model_type not in MODEL_TYPES:
    raise DataError(f'tokenizer_model_type must be one of {MODEL_TYPES}, got {model_type!r}.')
  if iter(texts) is texts:
    texts = list(texts)
  settings = dict(model_type=model_type, what=what, num_threads=num_threads)
  try:
    return _train_sentences(texts, vocab_size=vocab_size, **settings)
  except DataError as e:
    supported = _VOCAB_TOO_HIGH.search(str(e))
    if not (fit_to_corpus and supported):
      raise
    return _train_sentences(texts, vocab_size=int(supported[2]), **settings)


class _Fed:
  """Counts the characters the trainer has read (for its progress line)."""

  def __init__(self, texts):
    self.texts, self.chars, self.sentences = texts, 0, 0

  def __iter__(self):
    for sentence in _sentences(self.texts):
      self.chars += len(sentence)
      self.sentences += 1
      yield sentence


def _train_sentences(
  texts, *, model_type: str, vocab_size: int, what: str, num_threads: int
) -> bytes:
  model = io.BytesIO()
  fed = _Fed(texts)
  start = time.monotonic()

  def progress() -> str:
    return (
      f'prepare tokenizer: training {model_type} with {vocab_size} pieces on '
      f'{fed.chars / 1e6:,.1f} M characters of sentences read ({fed.sentences:,} sentences), '
      f'{num_threads} threads, {time.monotonic() - start:.0f} s'
    )

  sentences = iter(fed)
  try:
    first = next(sentences)
  except StopIteration:
    raise DataError(f'No text to train the tokenizer on: {what} has zero tokens.') from None
  say(
    f'prepare tokenizer: training {model_type} with {vocab_size} pieces, {num_threads} threads '
    '(one call that reports nothing: a line every few seconds)'
  )
  try:
    wait_for(
      lambda: spm.SentencePieceTrainer.train(
        sentence_iterator=_chain(first, sentences),
        model_writer=model,
        model_type=model_type,
        vocab_size=vocab_size,
        pad_id=TRAINED_SPECIALS.index(PAD),
        unk_id=TRAINED_SPECIALS.index(UNK),
        bos_id=-1,
        eos_id=-1,  # No BOS/EOS: packing adds [CLS]/[SEP].
        pad_piece=PAD,
        unk_piece=UNK,
        control_symbols=list(TRAINED_SPECIALS[2:]),  # Take the next ids, in this order.
        character_coverage=0.9995,
        max_sentence_length=4 * _MAX_SENTENCE_CHARS,  # Bytes, for multi-byte scripts.
        num_threads=num_threads,
        minloglevel=2,  # Errors only: training logs are thousands of lines.
      ),
      progress,
      interrupted='prepare tokenizer: interrupted: its training is abandoned, nothing '
      'of it is kept (the documents read are); a rerun trains it again.',
    )
  except RuntimeError as e:
    # E.g. "Vocabulary size too high" on a tiny corpus: say which data and setting.
    raise DataError(
      f'Training a {model_type} tokenizer with vocab_size={vocab_size} on '
      f'{what} failed: {str(e).strip().splitlines()[-1]}'
    ) from None
  _log.warning(
    # Characters of the sentences fed (the whitespace between them is not counted): fewer than
    # the sample's bytes (data.tokenizer_sample_chars) for indented or non-ASCII text.
    'prepare tokenizer: done, trained %s with %d pieces on %.1f M characters of sentences (%d '
    'sentences; whitespace between them not counted), %d threads, in %.1f s',
    model_type,
    vocab_size,
    fed.chars / 1e6,
    fed.sentences,
    num_threads,
    time.monotonic() - start,
  )
  return model.getvalue()


def _chain(first: str, rest):
  yield first
  yield from rest


def _sentences(texts: Iterable[str]):
  """Splits documents into sentence-sized pieces that SentencePiece will not skip (a long
  sentence at its last space before the limit). Linear in a sentence's length: the pieces
  are those of cutting the stripped rest again and again, without copying the rest."""
  for text in texts:
    for sentence in _SENTENCE_END.split(text):
      sentence = sentence.strip()
      start = 0  # sentence[start:] is the rest, stripped
      while len(sentence) - start > _MAX_SENTENCE_CHARS:
        cut = sentence.rfind(' ', start, start + _MAX_SENTENCE_CHARS)
        cut = cut if cut > start else start + _MAX_SENTENCE_CHARS
        yield sentence[start:cut]
        rest = _NON_SPACE.search(sentence, cut)
        start = rest.start() if rest else len(sentence)
      if start < len(sentence):
        yield sentence[start:]

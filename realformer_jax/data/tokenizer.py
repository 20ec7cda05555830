"""SentencePiece tokenizer with fixed BERT-style special ids, trained on first use and cached.

Special ids of every tokenizer trained here (the batch contract relies on PAD == 0):

    [PAD] = 0   padding; input_mask is 0 there
    [UNK] = 1   unknown piece
    [CLS] = 2   first token of every packed sequence
    [SEP] = 3   last real token of every packed sequence
    [MASK] = 4  replaces 80% of the tokens chosen for prediction

They are SentencePiece *control* symbols (not user-defined ones), so the literal text "[MASK]"
in a document is tokenized as ordinary characters and can never forge a special token.

A model given by path (`tokenizer_path`) must define the same five pieces with [PAD] at id 0;
the other four may sit at any id.

The cache entry is one `.model` file plus a `.json` sidecar recording what it was trained
on; its name holds the model type and vocab size and a hash of every training setting, so
configs that differ never share a file. Training writes the model to memory and publishes it
with an atomic rename under a file lock (see cache_lock.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from typing import Iterable

import numpy as np
import sentencepiece as spm

from realformer_jax.data import cache_lock
from realformer_jax.data.errors import DataError

PAD, UNK, CLS, SEP, MASK = '[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'
MODEL_TYPES = ('unigram', 'bpe')
# Bump when the trainer settings below change, so old cache entries are not reused.
_TRAINER_REVISION = 1
# SentencePiece skips "sentences" longer than this; we split documents well below it.
_MAX_SENTENCE_CHARS = 4096
# Fixed, not os.cpu_count(): the trained model depends on the thread count (measured), and
# hosts with local data dirs must train identical tokenizers.
_TRAINER_THREADS = 4
_SENTENCE_END = re.compile(r'(?<=[.!?;:])\s+|\n+')


class Tokenizer:
  """A SentencePiece model with the special ids the pipeline needs. Picklable (for workers)."""

  def __init__(self, model_proto: bytes, source: str = '<memory>'):
    self._model_proto = model_proto
    self.source = source  # The file it came from; for messages.
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = self._sp.get_piece_size()
    self.pad_id = self._sp.pad_id()
    self.unk_id = self._sp.unk_id()
    self.cls_id = self._special_id(CLS)
    self.sep_id = self._special_id(SEP)
    self.mask_id = self._special_id(MASK)
    if self.pad_id != 0:
      raise DataError(f'Tokenizer {source}: {PAD} must have id 0 (it has {self.pad_id}).')
    self.special_ids = (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)
    if len(set(self.special_ids)) != 5:
      raise DataError(f'Tokenizer {source}: special ids {self.special_ids} are not distinct.')
    is_special_V = np.zeros(self.vocab_size, bool)
    is_special_V[list(self.special_ids)] = True
    self.is_special_V = is_special_V
    # Random replacements in MLM masking are drawn from these.
    self.regular_ids = np.flatnonzero(~is_special_V).astype(np.int32)

  def _special_id(self, piece: str) -> int:
    piece_id = self._sp.piece_to_id(piece)
    if piece_id == self._sp.unk_id() and piece != UNK:
      raise DataError(f'Tokenizer {self.source} has no {piece} piece; '
                      f'train one with this module or add it as a control symbol.')
    return piece_id

  def encode(self, text: str) -> np.ndarray:
    """Token ids of `text` (no [CLS]/[SEP]), int32."""
    return np.asarray(self._sp.encode(text, out_type=int), np.int32)

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    """Token ids of each text, as `encode`; SentencePiece spreads the batch over all cores."""
    return [np.asarray(ids, np.int32) for ids in self._sp.encode(texts, out_type=int)]

  @property
  def sha256(self) -> str:
    """Hash of the model's bytes: identifies the tokenizer in cache keys."""
    return hashlib.sha256(self._model_proto).hexdigest()

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; special tokens decode to nothing."""
    return self._sp.decode([int(i) for i in ids])

  def id_to_piece(self, token_id: int) -> str:
    return self._sp.id_to_piece(int(token_id))

  def __getstate__(self):
    return {'model_proto': self._model_proto, 'source': self.source}

  def __setstate__(self, state):
    self.__init__(state['model_proto'], state['source'])


def load(path: str) -> Tokenizer:
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise DataError(f'Tokenizer file {path} does not exist (config.tokenizer_path).')
  with open(path, 'rb') as f:
    model_proto = f.read()
  try:
    return Tokenizer(model_proto, source=path)
  except RuntimeError as e:  # SentencePiece's parse error.
    raise DataError(f'Tokenizer file {path} is not a SentencePiece model: {e}') from None


def cache_path(cache_dir: str, *, model_type: str, vocab_size: int, key: dict) -> str:
  """Where a tokenizer trained with these settings lives; `key` holds every other setting."""
  key = dict(key, model_type=model_type, vocab_size=vocab_size, revision=_TRAINER_REVISION)
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
  return os.path.join(cache_dir, f'spm-{model_type}-{vocab_size}-{digest}.model')


def load_or_train(path: str, texts: Iterable[str], *, model_type: str, vocab_size: int,
                  description: dict, what: str) -> Tokenizer:
  """Loads `path`, or trains on `texts` and publishes it there atomically.

  Args:
    path: the cache file, from `cache_path`.
    texts: documents to train on (only consumed when training).
    model_type: 'unigram' or 'bpe'.
    vocab_size: pieces including the five special ones.
    description: written to the `.json` sidecar, for humans.
    what: names the data in error messages, e.g. "dataset 'x' split 'train' feature 'text'".
  """
  if os.path.isfile(path):
    return load(path)
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  with cache_lock.exclusive_lock(directory, os.path.basename(path)):
    if os.path.isfile(path):  # Another process trained it while we waited.
      return load(path)
    model_proto = train(texts, model_type=model_type, vocab_size=vocab_size, what=what)
    cache_lock.atomic_write(path + '.json', json.dumps(description, indent=2, sort_keys=True).encode())
    cache_lock.atomic_write(path, model_proto)
  return Tokenizer(model_proto, source=path)


def train(texts: Iterable[str], *, model_type: str, vocab_size: int, what: str) -> bytes:
  """Trains a SentencePiece model in memory and returns its serialized proto."""
  if model_type not in MODEL_TYPES:
    raise DataError(f'tokenizer_model_type must be one of {MODEL_TYPES}, got {model_type!r}.')
  sentences = list(_sentences(texts))
  if not sentences:
    raise DataError(f'No text to train the tokenizer on: {what} has zero tokens.')
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        model_type=model_type,
        vocab_size=vocab_size,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,  # No BOS/EOS: packing adds [CLS]/[SEP].
        pad_piece=PAD, unk_piece=UNK,
        control_symbols=[CLS, SEP, MASK],  # Get ids 2, 3, 4 in this order.
        character_coverage=0.9995,
        max_sentence_length=4 * _MAX_SENTENCE_CHARS,  # Bytes, for multi-byte scripts.
        num_threads=_TRAINER_THREADS,
        minloglevel=2,  # Errors only: training logs are thousands of lines.
    )
  except RuntimeError as e:
    # E.g. "Vocabulary size too high" on a tiny corpus: say which data and setting.
    raise DataError(f'Training a {model_type} tokenizer with vocab_size={vocab_size} on '
                    f'{what} failed: {str(e).strip().splitlines()[-1]}') from None
  return model.getvalue()


def _sentences(texts: Iterable[str]):
  """Splits documents into sentence-sized pieces that SentencePiece will not skip."""
  for text in texts:
    for sentence in _SENTENCE_END.split(text):
      sentence = sentence.strip()
      while len(sentence) > _MAX_SENTENCE_CHARS:
        cut = sentence.rfind(' ', 0, _MAX_SENTENCE_CHARS)
        cut = cut if cut > 0 else _MAX_SENTENCE_CHARS
        yield sentence[:cut]
        sentence = sentence[cut:].strip()
      if sentence:
        yield sentence

"""BERT's WordPiece tokenizer over a `vocab.txt` file (one token per line, id = line number).

The same two stages as BERT's reference tokenizer, so our data and a Hugging Face BERT
checkpoint agree on every id:
  1. basic: drop control characters, map whitespace to ' ', put spaces around CJK ideographs,
     split on whitespace; with `lower_case` (uncased BERT) lower-case and strip accents (NFD,
     drop non-spacing marks); split every punctuation character off as its own token;
  2. WordPiece: greedy longest-match-first pieces, continuation pieces prefixed '##'; a word
     with no full segmentation, or longer than 100 characters, becomes [UNK].
Every output character remembers which input character it came from, so `encode_with_offsets`
gives character spans into the original text (SQuAD-style span tasks).

Differences from BERT's reference, on purpose: the literal text "[MASK]" (or any special
token) in a document is tokenized as ordinary characters, never as the special id (the
pipeline's rule: text cannot forge a special token); cased vocabularies see the text as given,
without Hugging Face's extra NFC normalisation.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Iterable

import numpy as np

from realformer_jax.data.errors import DataError
from realformer_jax.data.tokenizers.base import CLS, MASK, PAD, SEP, UNK, Tokenizer

_MAX_WORD_CHARS = 100  # BERT's max_input_chars_per_word
_CONTINUATION = '##'


def _is_whitespace(char: str) -> bool:
  return char in ' \t\n\r' or unicodedata.category(char) == 'Zs'


def _is_control(char: str) -> bool:
  return char not in '\t\n\r' and unicodedata.category(char).startswith('C')


def _is_punctuation(char: str) -> bool:
  cp = ord(char)
  # BERT counts every non-alphanumeric ASCII symbol ('$', '^', '`', ...) as punctuation.
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith('P')


_CJK_RANGES = (
  (0x4E00, 0x9FFF),
  (0x3400, 0x4DBF),
  (0x20000, 0x2A6DF),
  (0x2A700, 0x2B73F),
  (0x2B740, 0x2B81F),
  (0x2B820, 0x2CEAF),
  (0xF900, 0xFAFF),
  (0x2F800, 0x2FA1F),
)


def _is_cjk(char: str) -> bool:
  cp = ord(char)
  return any(low <= cp <= high for low, high in _CJK_RANGES)


def _normalise_word(word: list[tuple[str, int]], lower_case: bool) -> list[tuple[str, int]]:
  """Lower-case and strip accents, keeping each output character's input index."""
  if not lower_case:
    return word
  # Character by character, as Hugging Face's tokenizers do (so 'Σ' -> 'σ' even at a word's
  # end, where str.lower() of the whole word would give the final sigma 'ς').
  chars = [(low, index) for char, index in word for low in char.lower()]
  return [
    (part, index)
    for char, index in chars
    for part in unicodedata.normalize('NFD', char)
    if unicodedata.category(part) != 'Mn'
  ]


def basic_words(text: str, lower_case: bool) -> list[list[tuple[str, int]]]:
  """Stage 1: words as lists of (character, index of the input character it came from)."""
  words: list[list[tuple[str, int]]] = []
  current: list[tuple[str, int]] = []

  def end_word():
    nonlocal current
    if current:
      words.append(current)
      current = []

  for index, char in enumerate(text):
    if ord(char) in (0, 0xFFFD) or _is_control(char):
      continue
    if _is_whitespace(char):
      end_word()
    elif _is_cjk(char):
      end_word()
      words.append([(char, index)])
    else:
      current.append((char, index))
  end_word()
  pieces = []
  for word in words:
    run: list[tuple[str, int]] = []
    for char, index in _normalise_word(word, lower_case):
      if _is_punctuation(char):
        if run:
          pieces.append(run)
          run = []
        pieces.append([(char, index)])
      else:
        run.append((char, index))
    if run:
      pieces.append(run)
  return pieces


class WordPieceTokenizer(Tokenizer):
  """A BERT vocabulary file as a Tokenizer (special tokens found by name)."""

  file_name = 'vocab.txt'

  def __init__(self, vocab_text: bytes, source: str = '<memory>', lower_case: bool = True):
    self._vocab_text = vocab_text
    self.lower_case = lower_case
    try:
      lines = vocab_text.decode('utf-8').split('\n')
    except UnicodeDecodeError as e:
      raise DataError(f'Vocabulary file {source} is not UTF-8 text: {e}') from None
    if lines and lines[-1] == '':
      lines.pop()  # the final newline
    self._tokens = [line.strip() for line in lines]
    self._ids = {}
    for token_id, token in enumerate(self._tokens):
      self._ids[token] = token_id  # a repeated token keeps its last id, as BERT's loader
    missing = [t for t in (PAD, UNK, CLS, SEP, MASK) if t not in self._ids]
    if missing:
      raise DataError(
        f'Vocabulary file {source} has no {", ".join(missing)} token(s); a BERT '
        'vocab.txt has all five.'
      )
    super().__init__(
      source=source,
      vocab_size=len(self._tokens),
      pad_id=self._ids[PAD],
      unk_id=self._ids[UNK],
      cls_id=self._ids[CLS],
      sep_id=self._ids[SEP],
      mask_id=self._ids[MASK],
    )

  @classmethod
  def from_file(cls, path: str, lower_case: bool = True) -> 'WordPieceTokenizer':
    with open(path, 'rb') as f:
      return cls(f.read(), source=path, lower_case=lower_case)

  def _word_pieces(self, word: list[tuple[str, int]]) -> list[tuple[int, int, int]]:
    """Stage 2 for one word: (id, first input index, last input index + 1) per piece."""
    chars = ''.join(char for char, _ in word)
    whole = (self.unk_id, word[0][1], word[-1][1] + 1)
    if len(chars) > _MAX_WORD_CHARS:
      return [whole]
    pieces, start = [], 0
    while start < len(chars):
      end = len(chars)
      while end > start:
        candidate = chars[start:end] if start == 0 else _CONTINUATION + chars[start:end]
        if candidate in self._ids:
          pieces.append((self._ids[candidate], word[start][1], word[end - 1][1] + 1))
          break
        end -= 1
      if end == start:  # no piece fits: the whole word is unknown
        return [whole]
      start = end
    return pieces

  def _pieces(self, text: str) -> list[tuple[int, int, int]]:
    return [
      piece for word in basic_words(text, self.lower_case) for piece in self._word_pieces(word)
    ]

  def encode(self, text: str) -> np.ndarray:
    return np.asarray([token_id for token_id, _, _ in self._pieces(text)], np.int32)

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pieces = self._pieces(text)
    return tuple(np.asarray([piece[i] for piece in pieces], np.int32) for i in range(3))

  def decode(self, ids: Iterable[int]) -> str:
    tokens = [self._tokens[int(i)] for i in ids if int(i) not in self.special_ids]
    return ' '.join(tokens).replace(' ' + _CONTINUATION, '').strip()

  def id_to_piece(self, token_id: int) -> str:
    return self._tokens[int(token_id)]

  def file_bytes(self) -> bytes:
    return self._vocab_text

  @property
  def sha256(self) -> str:
    # The casing changes every id: it is part of the tokenizer's identity.
    return hashlib.sha256(self._vocab_text + bytes([self.lower_case])).hexdigest()

  def __getstate__(self):
    return {'vocab_text': self._vocab_text, 'source': self.source, 'lower_case': self.lower_case}

  def __setstate__(self, state):
    self.__init__(state['vocab_text'], state['source'], state['lower_case'])

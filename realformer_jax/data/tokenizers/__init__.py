"""Tokenizers with BERT's special tokens: SentencePiece models trained on first use and cached
(sentencepiece_model.py), or a given file (`data.vocab_file`): a SentencePiece `.model` or a
BERT WordPiece `vocab.txt` (wordpiece.py), so that data and Hugging Face BERT checkpoints share
one vocabulary. The interface both implement is base.py's `Tokenizer`; `load` picks one by the
file's name.

Special ids of every tokenizer trained here (the batch contract relies on PAD == 0):

    [PAD] = 0   padding; input_mask is 0 there
    [UNK] = 1   unknown piece
    [CLS] = 2   first token of every packed sequence
    [SEP] = 3   last real token of every packed sequence
    [MASK] = 4  replaces 80% of the tokens chosen for prediction

They are SentencePiece *control* symbols (not user-defined ones), so the literal text "[MASK]"
in a document is tokenized as ordinary characters and can never forge a special token.

A tokenizer given by path (`data.vocab_file`) must define the same five tokens with [PAD] at
id 0; the other four may sit at any id (BERT's vocab.txt has [UNK] 100, [CLS] 101, [SEP] 102,
[MASK] 103).
"""

from __future__ import annotations

import os

from realformer_jax.data.errors import DataError
from realformer_jax.data.tokenizers.base import CLS, MASK, PAD, SEP, UNK, Tokenizer
from realformer_jax.data.tokenizers.sentencepiece_model import (
  MODEL_TYPES,
  TRAINED_SECONDS,
  TRAINED_SPECIALS,
  SentencePieceTokenizer,
  cache_path,
  load_or_train,
  read_model,
  train,
)
from realformer_jax.data.tokenizers.wordpiece import WordPieceTokenizer

__all__ = [
  'CLS',
  'FILE_NAMES',
  'MASK',
  'MODEL_TYPES',
  'PAD',
  'SEP',
  'SentencePieceTokenizer',
  'TRAINED_SECONDS',
  'TRAINED_SPECIALS',
  'Tokenizer',
  'UNK',
  'WordPieceTokenizer',
  'cache_path',
  'load',
  'load_or_train',
  'train',
]

# What a run's copy of its tokenizer is called (Tokenizer.save), by kind: `load` reads either.
FILE_NAMES = (SentencePieceTokenizer.file_name, WordPieceTokenizer.file_name)


def load(path: str, lower_case: bool = True) -> Tokenizer:
  """The tokenizer in `path`: a BERT WordPiece vocabulary (`*.txt`, one token per line;
  `lower_case` as BERT's uncased models) or a SentencePiece model (anything else)."""
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise DataError(f'Tokenizer file {path} does not exist (data.vocab_file).')
  if path.endswith('.txt'):
    return WordPieceTokenizer.from_file(path, lower_case=lower_case)
  return read_model(path)

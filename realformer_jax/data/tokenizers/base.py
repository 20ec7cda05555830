"""The tokenizer interface the data pipeline relies on, and BERT's five special tokens.

Implementations: sentencepiece_model.SentencePieceTokenizer (trained here and cached) and
wordpiece.WordPieceTokenizer (BERT `vocab.txt` files); tokenizers.load picks one by file name.
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable

import numpy as np

from realformer_jax import atomic_files
from realformer_jax.data.errors import DataError

PAD, UNK, CLS, SEP, MASK = '[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'


class Tokenizer:
  """Token ids with the special ids the pipeline needs. Subclasses: SentencePieceTokenizer
  (sentencepiece_model.py) and WordPieceTokenizer (wordpiece.py, BERT `vocab.txt` files).

  Picklable (for workers). `file_name` is what the tokenizer's file is called when a run copies
  it into its workdir (`save`), so the workdir alone is enough to tokenize for it later.
  """

  file_name: str = ''

  def __init__(
    self,
    *,
    source: str,
    vocab_size: int,
    pad_id: int,
    unk_id: int,
    cls_id: int,
    sep_id: int,
    mask_id: int,
  ):
    self.source = source  # The file it came from; for messages.
    self.vocab_size = vocab_size
    self.pad_id, self.unk_id = pad_id, unk_id
    self.cls_id, self.sep_id, self.mask_id = cls_id, sep_id, mask_id
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

  def encode(self, text: str) -> np.ndarray:
    """Token ids of `text` (no [CLS]/[SEP]), int32."""
    raise NotImplementedError

  def encode_batch(self, texts: list[str], num_threads: int = -1) -> list[np.ndarray]:
    """Token ids of each text, as `encode`; `num_threads` (-1: all cores) where the
    implementation can spread a batch over threads."""
    del num_threads
    return [self.encode(text) for text in texts]

  def encode_utf8_flat(self, documents: list[bytes], num_threads: int = -1) -> np.ndarray:
    """The token ids of `documents` (UTF-8 bytes) concatenated into one int32 array (what
    packing needs), as `encode_batch` of the decoded texts; implementations may skip the
    decoding and the per-text arrays."""
    ids = self.encode_batch([data.decode('utf-8') for data in documents], num_threads=num_threads)
    return np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, np.int32)

  def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, starts, ends), int32: token i covers text[starts[i]:ends[i]] (character offsets,
    end exclusive, leading whitespace excluded). For span tasks such as SQuAD."""
    raise NotImplementedError

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; special tokens decode to nothing."""
    raise NotImplementedError

  def id_to_piece(self, token_id: int) -> str:
    raise NotImplementedError

  def file_bytes(self) -> bytes:
    """The tokenizer's file, byte for byte."""
    raise NotImplementedError

  @property
  def sha256(self) -> str:
    """Hash of the tokenizer's file: identifies the tokenizer in cache keys."""
    return hashlib.sha256(self.file_bytes()).hexdigest()

  def save(self, directory: str) -> str:
    """Writes the tokenizer's file into `directory` as `file_name`; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, self.file_name)
    atomic_files.write_bytes(path, self.file_bytes())
    return path

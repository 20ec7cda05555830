"""Data config: which text, which tokenizer, how sequences are packed and masked.

The defaults train on the embedded `bible_web` corpus (see corpus.py), prepared on first use
under `data_dir` with no network. For a cluster run on any TFDS text dataset prepared in
array_record format, set e.g.

    --config.data.dataset=wikipedia/20230601.en --config.data.data_dir=/data/tfds
    --config.data.eval_split=train[:1000] --config.data.train_split=train[1000:]

`DataConfig` is the section's schema and checks itself when made: a value the pipeline cannot
use raises DataError naming the field. The functions of this package accept a DataConfig or a
ConfigDict `data` section (`data_config()` converts once at that boundary).
"""

import dataclasses
from typing import Any, Mapping, Union

import ml_collections

from realformer_jax.config import from_section, to_config_dict
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data.errors import DataError
from realformer_jax.data.sources.registry import EMBEDDED_DATASET


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The masked-LM `data` section. Hashable: it keys the per-process preparation caches."""

  # Source.
  # Which source reads the text (data/sources): 'auto' = 'files' if train_files is set, else
  # 'embedded' for bible_web, else 'tfds'; or the name of any registered source.
  source: str = 'auto'
  # TFDS name ('name', 'name/config', 'name:1.2.3'); bible_web = the embedded corpus.
  dataset: str = EMBEDDED_DATASET
  # TFDS data dir; the tokenizer cache lives beside the dataset.
  data_dir: str = '~/tensorflow_datasets'
  text_feature: str = 'text'  # Feature holding a document's text; 'a/b' for nested features.
  # Your own files instead of a TFDS dataset (file_corpus.py, text_files.py): comma-separated
  # globs or directories of .txt (a blank line ends a document), .jsonl/.json (field
  # text_feature) or .parquet (column text_feature) files, optionally .gz or .zst. Set, they
  # replace `dataset` and the splits; their stores are cached under data_dir/files-<digest>/
  # (the digest of their content).
  train_files: str = ''
  eval_files: str = ''  # '' = hold out eval_percent % of the train_files documents.
  eval_percent: float = 1.0  # Percent held out without eval_files (by eval_holdout_by).
  # What is held out without eval_files: 'file' (whole files, by a hash of their first bytes:
  # no file has text in both splits), 'document' (each document by a hash of its text: a
  # file's paragraphs may be on both sides) or 'auto' (file where eval_percent % of the files
  # is 5 or more, else document: a corpus of one or a few files cannot be split by file), or
  # 'field:NAME' (JSON lines files: the documents whose field NAME ('a/b' nested) holds the same
  # value, e.g. 'field:doc' for the paragraphs of one page, by a hash of it: no group in both).
  eval_holdout_by: str = 'auto'
  train_split: str = 'train'  # TFDS split (slicing syntax allowed, e.g. 'train[:99%]').
  eval_split: str = 'validation'  # Held-out split, read in order as one finite pass.
  # Let TFDS download+prepare a missing catalog dataset (never for bible_web: no network).
  download: bool = False
  # Use only the first N records of each split (-1: all); for smoke runs and tests.
  max_documents: int = -1
  # Tokenizer.
  # A SentencePiece .model or a BERT WordPiece vocab.txt; '' = train SentencePiece on
  # train_split on first use and cache it.
  vocab_file: str = ''
  # WordPiece vocab.txt only: lower-case and strip accents first (BERT uncased).
  lower_case: bool = True
  # Pieces to train, including [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4); ignored with vocab_file.
  vocab_size: int = 8000
  # A corpus too small for vocab_size trains the largest size it supports (with a note)
  # instead of failing; the model keeps model.vocab_size rows.
  fit_vocab_to_corpus: bool = True
  tokenizer_model_type: str = 'unigram'  # 'unigram' or 'bpe' (both train in ~1 s on bible_web).
  # Cap on text used to train the tokenizer: 4 KB windows spread evenly over the train text by
  # bytes (seeded offset), so the sample spans every file. 8M: the smallest measured sample
  # within 1% of the largest one's tokens per held-out character, at about half its training
  # time (docs/data.md, "Tokenizer sample size"); the embedded corpus (4M) stays whole.
  tokenizer_sample_chars: int = 8_000_000
  # The trainer's threads. Part of what the tokenizer is (SentencePiece's result depends on
  # it), so fixed rather than the host's cores: 4 trained every tokenizer cached before this
  # field; set the cores of your preparation host (e.g. 16) for a faster first run.
  tokenizer_threads: int = 4
  # Sequences and masking.
  max_len: int = 128  # Tokens per packed sequence, including [CLS] and [SEP].
  max_predictions: int = 20  # P: masked-LM prediction slots per sequence (BERT: 20 at length 128).
  # Fraction of real, non-special tokens chosen for prediction (capped at P).
  mask_rate: float = 0.15
  mask_token_rate: float = 0.8  # Of the chosen tokens, replaced by [MASK].
  # Of the chosen tokens, replaced by a random non-special token (the rest stay unchanged).
  random_token_rate: float = 0.1
  # Order and iteration (train order: a global shuffle of the packed rows per epoch, from the
  # train seed).
  eval_mask_seed: int = 0  # Fixed so every evaluation scores the same masked positions.
  eval_batches: int = -1  # Batches per evaluation; -1 = one full pass over eval_split.
  # Processes masking train batches ahead (grain mp_prefetch); 0 = one in-process thread (CI
  # has 2 cores).
  worker_count: int = 0

  def __post_init__(self):
    def need(ok: bool, field: str, rule: str):
      if not ok:
        raise DataError(f'data config: {field}={getattr(self, field)!r} is invalid: {rule}.')

    from realformer_jax.data import sources  # pylint: disable=import-outside-toplevel
    from realformer_jax.data.file_corpus import HELD_OUT_BY, held_out_field  # pylint: disable=import-outside-toplevel

    need(
      self.source == sources.AUTO or self.source in sources.names(),
      'source',
      f"'auto' or a registered source ({', '.join(sources.names())})",
    )
    need(bool(self.dataset), 'dataset', 'name a TFDS dataset')
    need(bool(self.text_feature), 'text_feature', 'name the text feature')
    need(bool(self.train_split), 'train_split', 'name a split')
    need(bool(self.eval_split), 'eval_split', 'name a split')
    need(
      bool(self.train_files) or not self.eval_files, 'eval_files', 'eval_files needs train_files'
    )
    need(0.0 < self.eval_percent < 100.0, 'eval_percent', 'must be in (0, 100)')
    need(
      self.eval_holdout_by in HELD_OUT_BY or bool(held_out_field(self.eval_holdout_by)),
      'eval_holdout_by',
      f"must be one of {', '.join(map(repr, HELD_OUT_BY))} or 'field:NAME' (a JSON field)",
    )
    need(self.max_len >= 3, 'max_len', 'need room for [CLS], one token and [SEP]')
    need(
      1 <= self.max_predictions <= self.max_len - 2,
      'max_predictions',
      'must be in [1, max_len - 2]',
    )
    need(0.0 < self.mask_rate <= 1.0, 'mask_rate', 'must be in (0, 1]')
    need(
      0.0 <= self.mask_token_rate
      and 0.0 <= self.random_token_rate
      and self.mask_token_rate + self.random_token_rate <= 1.0,
      'mask_token_rate',
      'mask_token_rate and random_token_rate must be >= 0 with a sum <= 1',
    )
    need(
      self.tokenizer_model_type in tokenizer_lib.MODEL_TYPES,
      'tokenizer_model_type',
      f'must be one of {tokenizer_lib.MODEL_TYPES}',
    )
    need(self.vocab_size > 5, 'vocab_size', 'must exceed the 5 special tokens')
    need(self.tokenizer_sample_chars > 0, 'tokenizer_sample_chars', 'must be positive')
    need(self.tokenizer_threads >= 1, 'tokenizer_threads', 'must be >= 1')
    need(self.eval_batches == -1 or self.eval_batches > 0, 'eval_batches', 'must be -1 or > 0')
    need(self.worker_count >= 0, 'worker_count', 'must be >= 0')
    need(self.max_documents == -1 or self.max_documents > 0, 'max_documents', 'must be -1 or > 0')

  def replace(self, **changes) -> 'DataConfig':
    return dataclasses.replace(self, **changes)


def default_data_config() -> ml_collections.ConfigDict:
  """The editable `data` section (configs/ files, --config.data.x=v), from DataConfig."""
  return to_config_dict(DataConfig())


def data_config(config: Union[DataConfig, Mapping[str, Any]]) -> DataConfig:
  """The checked DataConfig of a `data` section; a DataConfig is returned as it is.

  The data package's public functions take either, so a script (or a test) can hand them a
  ConfigDict; the training loop hands them the DataConfig it validated once."""
  return from_section(DataConfig, 'data', config)


def validate_data_config(config: Union[DataConfig, Mapping[str, Any]]) -> DataConfig:
  """Raises DataError naming the first field the pipeline cannot use; else the DataConfig."""
  return data_config(config)

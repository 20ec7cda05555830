"""Data config: which text, which tokenizer, how sequences are packed and masked.

The defaults train on the embedded `bible_web` corpus (see corpus.py), prepared on first use
under `data_dir` with no network. For a cluster run on any TFDS text dataset prepared in
array_record format, set e.g.

    --config.data.dataset=wikipedia/20230601.en --config.data.data_dir=/data/tfds
    --config.data.eval_split=train[:1000] --config.data.train_split=train[1000:]

`validate_data_config` raises DataError naming the field for values the pipeline cannot use.
"""

import ml_collections

from realformer_jax.data import tokenizer as tokenizer_lib
from realformer_jax.data.errors import DataError

EMBEDDED_DATASET = 'bible_web'


def default_data_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Source.
  c.dataset = EMBEDDED_DATASET  # TFDS name ('name', 'name/config', 'name:1.2.3'); bible_web = embedded corpus.
  c.data_dir = '~/tensorflow_datasets'  # TFDS data dir; the tokenizer cache lives beside the dataset.
  c.text_feature = 'text'  # Feature holding a document's text; 'a/b' for nested features.
  c.train_split = 'train'  # TFDS split (slicing syntax allowed, e.g. 'train[:99%]').
  c.eval_split = 'validation'  # Held-out split, read in order as one finite pass.
  c.download = False  # Let TFDS download+prepare a missing catalog dataset (never for bible_web: it needs no network).
  c.max_documents = -1  # Use only the first N records of each split (-1: all); for smoke runs and tests.
  # Tokenizer.
  c.vocab_file = ''  # A SentencePiece .model or a BERT WordPiece vocab.txt; '' = train SentencePiece on train_split on first use and cache.
  c.lower_case = True  # WordPiece vocab.txt only: lower-case and strip accents first (BERT uncased).
  c.vocab_size = 8000  # Pieces to train, including [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4); ignored with vocab_file.
  c.fit_vocab_to_corpus = True  # A corpus too small for vocab_size trains the largest size it supports (with a note) instead of failing; the model keeps model.vocab_size rows.
  c.tokenizer_model_type = 'unigram'  # 'unigram' or 'bpe' (both train in ~1 s on bible_web).
  c.tokenizer_sample_chars = 100_000_000  # Cap on text used to train the tokenizer (evenly spaced records).
  # Sequences and masking.
  c.max_len = 128  # Tokens per packed sequence, including [CLS] and [SEP].
  c.max_predictions = 20  # P: masked-LM prediction slots per sequence (BERT: 20 at length 128).
  c.mask_rate = 0.15  # Fraction of real, non-special tokens chosen for prediction (capped at P).
  c.mask_token_rate = 0.8  # Of the chosen tokens, replaced by [MASK].
  c.random_token_rate = 0.1  # Of the chosen tokens, replaced by a random non-special token (rest unchanged).
  # Order and iteration (train order: a global shuffle of the packed rows per epoch, from the train seed).
  c.eval_mask_seed = 0  # Fixed so every evaluation scores the same masked positions.
  c.eval_batches = -1  # Batches per evaluation; -1 = one full pass over eval_split.
  c.worker_count = 0  # Processes masking train batches ahead (grain mp_prefetch); 0 = one in-process thread (CI has 2 cores).
  return c


def validate_data_config(config: ml_collections.ConfigDict) -> None:
  """Raises DataError naming the first field the pipeline cannot use."""

  def need(ok: bool, field: str, rule: str):
    if not ok:
      raise DataError(f'data config: {field}={config[field]!r} is invalid: {rule}.')

  need(bool(config.dataset), 'dataset', 'name a TFDS dataset')
  need(bool(config.text_feature), 'text_feature', 'name the text feature')
  need(bool(config.train_split), 'train_split', 'name a split')
  need(bool(config.eval_split), 'eval_split', 'name a split')
  need(config.max_len >= 3, 'max_len', 'need room for [CLS], one token and [SEP]')
  need(1 <= config.max_predictions <= config.max_len - 2, 'max_predictions',
       'must be in [1, max_len - 2]')
  need(0.0 < config.mask_rate <= 1.0, 'mask_rate', 'must be in (0, 1]')
  need(0.0 <= config.mask_token_rate and 0.0 <= config.random_token_rate
       and config.mask_token_rate + config.random_token_rate <= 1.0, 'mask_token_rate',
       'mask_token_rate and random_token_rate must be >= 0 with a sum <= 1')
  need(config.tokenizer_model_type in tokenizer_lib.MODEL_TYPES, 'tokenizer_model_type',
       f'must be one of {tokenizer_lib.MODEL_TYPES}')
  need(config.vocab_size > 5, 'vocab_size', 'must exceed the 5 special tokens')
  need(config.tokenizer_sample_chars > 0, 'tokenizer_sample_chars', 'must be positive')
  need(config.eval_batches == -1 or config.eval_batches > 0, 'eval_batches', 'must be -1 or > 0')
  need(config.worker_count >= 0, 'worker_count', 'must be >= 0')
  need(config.max_documents == -1 or config.max_documents > 0, 'max_documents',
       'must be -1 or > 0')

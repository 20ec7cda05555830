"""realformer_jax: RealFormer (residual attention), Post-LN and Pre-LN encoders in Flax, and an
encoder-decoder with average / merged attention (the seq2seq package: Seq2Seq, decoding for
greedy and beam search, the WEB -> BBE translation task)."""

# First, before JAX starts: on a machine with accelerator plugins but no accelerator it chooses
# the CPU, so that importing this package prints no plugin traceback.
from realformer_jax import platform_choice
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.model.attention import ResidualSelfAttention
from realformer_jax.model.block import EncoderLayer, FeedForward
from realformer_jax.model.embeddings import Embeddings
from realformer_jax.model.encoder import Encoder
from realformer_jax.model.heads import ClassificationHead, MaskedLMHead, Pooler, SpanHead
from realformer_jax.model.models import MaskedLM, SequenceClassifier, SpanExtractor
from realformer_jax.seq2seq import (
  AverageAttention,
  Decoder,
  DecoderLayer,
  Seq2Seq,
  Seq2SeqModelConfig,
)

__all__ = [
  'AverageAttention',
  'ClassificationHead',
  'ConfigError',
  'Decoder',
  'DecoderLayer',
  'Embeddings',
  'Encoder',
  'EncoderLayer',
  'FeedForward',
  'MaskedLM',
  'MaskedLMHead',
  'ModelConfig',
  'Pooler',
  'ResidualSelfAttention',
  'Seq2Seq',
  'Seq2SeqModelConfig',
  'SequenceClassifier',
  'SpanExtractor',
  'SpanHead',
]

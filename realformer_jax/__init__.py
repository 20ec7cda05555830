"""realformer_jax: RealFormer (residual attention), Post-LN and Pre-LN encoders in Flax, and an
encoder-decoder with average / merged attention (the seq2seq package: Seq2Seq, decoding for
greedy and beam search, the WEB -> BBE translation task)."""

from typing import TYPE_CHECKING

# Before JAX starts: on a machine with accelerator plugins but no accelerator it chooses the
# CPU, so that importing this package prints no plugin traceback.
from realformer_jax import platform_choice
from realformer_jax.extras import public_names

# Where each public name lives. They are imported on first use (PEP 562), so that a process
# that needs one submodule (a data-preparation worker: realformer_jax.data.workers) does not
# pay for jax, flax and the model.
_PUBLIC = {
  'AverageAttention': 'realformer_jax.seq2seq',
  'ClassificationHead': 'realformer_jax.model.heads',
  'ConfigError': 'realformer_jax.config',
  'Decoder': 'realformer_jax.seq2seq',
  'DecoderLayer': 'realformer_jax.seq2seq',
  'Embeddings': 'realformer_jax.model.embeddings',
  'Encoder': 'realformer_jax.model.encoder',
  'EncoderLayer': 'realformer_jax.model.block',
  'FeedForward': 'realformer_jax.model.block',
  'MaskedLM': 'realformer_jax.model.models',
  'MaskedLMHead': 'realformer_jax.model.heads',
  'ModelConfig': 'realformer_jax.config',
  'Pooler': 'realformer_jax.model.heads',
  'ResidualSelfAttention': 'realformer_jax.model.attention',
  'Seq2Seq': 'realformer_jax.seq2seq',
  'Seq2SeqModelConfig': 'realformer_jax.seq2seq',
  'SequenceClassifier': 'realformer_jax.model.models',
  'SpanExtractor': 'realformer_jax.model.models',
  'SpanHead': 'realformer_jax.model.heads',
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = public_names(globals(), _PUBLIC)


if TYPE_CHECKING:  # what type checkers and IDEs see
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

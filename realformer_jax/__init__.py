"""realformer_jax: RealFormer (residual attention), Post-LN and Pre-LN encoders in Flax, and an
encoder-decoder with average / merged attention (Seq2Seq; decoding.py for greedy and beam)."""

from realformer_jax.attention import ResidualSelfAttention
from realformer_jax.average_attention import AverageAttention
from realformer_jax.block import EncoderLayer, FeedForward
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.decoder import Decoder, DecoderLayer
from realformer_jax.embeddings import Embeddings
from realformer_jax.encoder import Encoder
from realformer_jax.heads import ClassificationHead, MaskedLMHead, Pooler, SpanHead
from realformer_jax.models import MaskedLM, SequenceClassifier, SpanExtractor
from realformer_jax.seq2seq import Seq2Seq

__all__ = [
    'AverageAttention', 'ClassificationHead', 'ConfigError', 'Decoder', 'DecoderLayer',
    'Embeddings', 'Encoder', 'EncoderLayer', 'FeedForward', 'MaskedLM', 'MaskedLMHead',
    'ModelConfig', 'Pooler', 'ResidualSelfAttention', 'Seq2Seq', 'SequenceClassifier',
    'SpanExtractor', 'SpanHead',
]

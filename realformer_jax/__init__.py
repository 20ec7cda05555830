"""realformer_jax: RealFormer (residual attention), Post-LN and Pre-LN encoders in Flax."""

from realformer_jax.attention import ResidualSelfAttention
from realformer_jax.block import EncoderLayer, FeedForward
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.embeddings import Embeddings
from realformer_jax.encoder import Encoder
from realformer_jax.heads import ClassificationHead, MaskedLMHead, Pooler, SpanHead
from realformer_jax.models import MaskedLM, SequenceClassifier, SpanExtractor

__all__ = [
    'ClassificationHead', 'ConfigError', 'Embeddings', 'Encoder', 'EncoderLayer',
    'FeedForward', 'MaskedLM', 'MaskedLMHead', 'ModelConfig', 'Pooler',
    'ResidualSelfAttention', 'SequenceClassifier', 'SpanExtractor', 'SpanHead',
]

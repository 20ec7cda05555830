"""Configuration of a RealFormer / Pre-LN / Post-LN BERT exported by realformer_jax
(experiments.export_hf). BERT's fields, plus the ones that say which variant it is."""

from transformers import PretrainedConfig


class RealFormerConfig(PretrainedConfig):
  model_type = 'realformer_jax'

  def __init__(
    self,
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act='gelu',
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    type_vocab_size=2,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
    ln_placement='realformer',  # 'post' | 'pre' (+ final norm) | 'realformer'
    residual_attention=True,  # add the previous layers' attention scores before the softmax
    running_mean=False,  # softmax sees the running sum / (layer + 1)
    attention_scale='standard',  # 'standard' 1/sqrt(head size) | 't5' (1: folded into init)
    position_embedding='learned',  # 'learned' table | 'rope' (rotary) | 'none'
    rope_base=10000.0,
    pad_token_id=0,
    **kwargs,
  ):
    super().__init__(pad_token_id=pad_token_id, **kwargs)
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_hidden_layers = num_hidden_layers
    self.num_attention_heads = num_attention_heads
    self.intermediate_size = intermediate_size
    self.hidden_act = hidden_act
    self.hidden_dropout_prob = hidden_dropout_prob
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.max_position_embeddings = max_position_embeddings
    self.type_vocab_size = type_vocab_size
    self.initializer_range = initializer_range
    self.layer_norm_eps = layer_norm_eps
    self.ln_placement = ln_placement
    self.residual_attention = residual_attention
    self.running_mean = running_mean
    self.attention_scale = attention_scale
    self.position_embedding = position_embedding
    self.rope_base = rope_base

"""Configuration of a RealFormer / Pre-LN / Post-LN BERT exported by realformer_jax
(experiments.export_hf): transformers' BertConfig (BERT's fields and their defaults), plus the
fields that say which variant it is (BertConfig's position_embedding_type is not read:
`position_embedding` names the table)."""

from transformers import BertConfig


class RealFormerConfig(BertConfig):
  model_type = 'realformer_jax'

  def __init__(
    self,
    ln_placement='realformer',  # 'post' | 'pre' (+ final norm) | 'realformer'
    residual_attention=True,  # add the previous layers' attention scores before the softmax
    running_mean=False,  # softmax sees the running sum / (layer + 1)
    attention_scale='standard',  # 'standard' 1/sqrt(head size) | 't5' (1: folded into init)
    position_embedding='learned',  # 'learned' table | 'rope' (rotary) | 'none'
    rope_base=10000.0,
    **kwargs,  # BertConfig's fields: vocab_size, hidden_size, num_hidden_layers, ...
  ):
    super().__init__(**kwargs)
    self.ln_placement = ln_placement
    self.residual_attention = residual_attention
    self.running_mean = running_mean
    self.attention_scale = attention_scale
    self.position_embedding = position_embedding
    self.rope_base = rope_base

"""A masked-LM encoder exported by realformer_jax (experiments.export_hf), in PyTorch.

BERT's parameter names and layout, so that a reader of BertForMaskedLM recognises everything;
what differs is said by the config:
  ln_placement 'post' / 'realformer':  h = LN(x + Attn(x));   y = LN(h + FFN(h))
               'pre':                  h = x + Attn(LN(x));   y = h + FFN(LN(h));  final LN
  residual_attention (RealFormer): layer l's softmax sees acc_l = acc_{l-1} + s_l, the sum of
      every layer's own scaled scores s_l = scale * Q K^T so far (the padding mask is added
      after the sum, never carried); running_mean divides acc_l by (l + 1) for the softmax only.
  position_embedding 'rope': queries and keys rotated pair by pair (RoFormer), no table.
The MLM decoder is tied to the word embeddings: logits = transform(h) @ E^T + bias.
A fine-tuned model (realformer_jax/finetune) has BERT's heads instead: a sequence classifier
(logits = classifier(tanh(pooler.dense(h[:, 0])))) or a span extractor (start, end logits =
qa_outputs(h)).
"""

import math

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import (
  MaskedLMOutput,
  QuestionAnsweringModelOutput,
  SequenceClassifierOutput,
)

from .configuration_realformer import RealFormerConfig

# E[sigmoid(z)^2] for z ~ N(0, 1) (realformer_jax/model/activations.py).
_SIGMOID_SECOND_MOMENT = 0.293379
ACTIVATIONS = {
  'gelu': nn.functional.gelu,  # exact erf GELU
  'gelu_tanh': lambda x: nn.functional.gelu(x, approximate='tanh'),
  'relu': nn.functional.relu,
  'selu': nn.functional.selu,
  'normalized_sigmoid': lambda x: torch.sigmoid(x) / math.sqrt(_SIGMOID_SECOND_MOMENT),
}


def rotate(x_BxHxLxK: torch.Tensor, base: float) -> torch.Tensor:
  """Rotary positions: feature pairs (2i, 2i+1) at position m turned by m * base^(-2i/K)."""
  length, head_dim = x_BxHxLxK.shape[-2:]
  inverse_frequency = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
  angles = torch.arange(length, dtype=torch.float32)[:, None] * inverse_frequency[None, :]
  cos, sin = torch.cos(angles), torch.sin(angles)
  even, odd = x_BxHxLxK[..., 0::2], x_BxHxLxK[..., 1::2]
  return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


class Embeddings(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.config = config
    self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
    if config.position_embedding == 'learned':
      self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
    self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
    self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def forward(self, input_ids, token_type_ids):
    x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
    if self.config.position_embedding == 'learned':
      x = x + self.position_embeddings.weight[: input_ids.shape[1]][None]
    return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.config = config
    self.heads = config.num_attention_heads
    self.head_dim = config.hidden_size // self.heads
    self.query = nn.Linear(config.hidden_size, config.hidden_size)
    self.key = nn.Linear(config.hidden_size, config.hidden_size)
    self.value = nn.Linear(config.hidden_size, config.hidden_size)
    self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

  def forward(self, x_BxLxD, bias_Bx1x1xL, prev_scores, layer: int):
    split = lambda t: t.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)
    q, k, v = split(self.query(x_BxLxD)), split(self.key(x_BxLxD)), split(self.value(x_BxLxD))
    if self.config.position_embedding == 'rope':
      q, k = rotate(q, self.config.rope_base), rotate(k, self.config.rope_base)
    scale = 1.0 if self.config.attention_scale == 't5' else self.head_dim**-0.5
    scores_BxHxLxL = scale * (q @ k.transpose(-1, -2))
    if self.config.residual_attention:
      if prev_scores is not None:
        scores_BxHxLxL = prev_scores + scores_BxHxLxL
      logits = scores_BxHxLxL / (layer + 1) if self.config.running_mean else scores_BxHxLxL
      carried = scores_BxHxLxL
    else:
      logits, carried = scores_BxHxLxL, None
    probs = self.dropout(torch.softmax(logits + bias_Bx1x1xL, dim=-1))
    return (probs @ v).transpose(1, 2).flatten(-2), carried


class DenseNorm(nn.Module):
  """A dense layer into the hidden size and a LayerNorm, under BERT's names: the attention
  output, the feed-forward output and the MLM head's transform."""

  def __init__(self, config, in_features=None):
    super().__init__()
    self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size)
    self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class Attention(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.self = SelfAttention(config)
    self.output = DenseNorm(config)


class Intermediate(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.intermediate_size)


class Layer(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.post = config.ln_placement in ('post', 'realformer')
    self.activation = ACTIVATIONS[config.hidden_act]
    self.attention = Attention(config)
    self.intermediate = Intermediate(config)
    self.output = DenseNorm(config, config.intermediate_size)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def forward(self, x, bias, prev_scores, layer: int):
    attention_norm, mlp_norm = self.attention.output.LayerNorm, self.output.LayerNorm
    attn, scores = self.attention.self(
      x if self.post else attention_norm(x), bias, prev_scores, layer
    )
    h = x + self.dropout(self.attention.output.dense(attn))
    if self.post:
      h = attention_norm(h)
    mlp = self.output.dense(
      self.activation(self.intermediate.dense(h if self.post else mlp_norm(h)))
    )
    y = h + self.dropout(mlp)
    return (mlp_norm(y) if self.post else y), scores


class Encoder(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.layer = nn.ModuleList([Layer(config) for _ in range(config.num_hidden_layers)])
    if config.ln_placement == 'pre':
      self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

  def forward(self, x, bias):
    scores = None
    for index, layer in enumerate(self.layer):
      x, scores = layer(x, bias, scores, index)
    return self.final_norm(x) if hasattr(self, 'final_norm') else x


class Pooler(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.hidden_size)

  def forward(self, h):
    return torch.tanh(self.dense(h[:, 0]))


class Model(nn.Module):
  def __init__(self, config, pooler=False):
    super().__init__()
    self.embeddings = Embeddings(config)
    self.encoder = Encoder(config)
    if pooler:  # sentence-level heads read the pooled [CLS]
      self.pooler = Pooler(config)

  def forward(self, input_ids, attention_mask=None, token_type_ids=None):
    if attention_mask is None:
      attention_mask = torch.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = torch.zeros_like(input_ids)
    # A large finite negative (not -inf): a row with no real key gets a uniform softmax.
    bias_Bx1x1xL = torch.where(attention_mask[:, None, None, :] > 0, 0.0, -1e9)
    return self.encoder(self.embeddings(input_ids, token_type_ids), bias_Bx1x1xL)


class Predictions(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.transform = DenseNorm(config)
    self.bias = nn.Parameter(torch.zeros(config.vocab_size))


class MLMHead(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.predictions = Predictions(config)


class RealFormerPreTrainedModel(PreTrainedModel):
  config_class = RealFormerConfig
  base_model_prefix = 'bert'

  def _init_weights(self, module):  # BERT's, for a model made from a config alone
    if isinstance(module, (nn.Linear, nn.Embedding)):
      module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
    if isinstance(module, nn.Linear):
      module.bias.data.zero_()

  def get_input_embeddings(self):
    return self.bert.embeddings.word_embeddings


class RealFormerForMaskedLM(RealFormerPreTrainedModel):
  def __init__(self, config):
    super().__init__(config)
    self.activation = ACTIVATIONS[config.hidden_act]
    self.bert = Model(config)
    self.cls = MLMHead(config)
    self.post_init()

  def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
    h = self.bert(input_ids, attention_mask, token_type_ids)
    transform = self.cls.predictions.transform
    h = transform.LayerNorm(self.activation(transform.dense(h)))
    logits = h @ self.bert.embeddings.word_embeddings.weight.T + self.cls.predictions.bias
    loss = None
    if labels is not None:
      loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    return MaskedLMOutput(loss=loss, logits=logits)


class RealFormerForSequenceClassification(RealFormerPreTrainedModel):
  def __init__(self, config):
    super().__init__(config)
    self.bert = Model(config, pooler=True)
    self.classifier = nn.Linear(config.hidden_size, config.num_labels)
    self.post_init()

  def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
    h = self.bert(input_ids, attention_mask, token_type_ids)
    logits = self.classifier(self.bert.pooler(h))
    loss = None
    if labels is not None:
      if self.config.num_labels == 1:  # regression
        loss = nn.functional.mse_loss(logits[:, 0], labels.float())
      else:
        loss = nn.functional.cross_entropy(logits, labels)
    return SequenceClassifierOutput(loss=loss, logits=logits)


class RealFormerForQuestionAnswering(RealFormerPreTrainedModel):
  def __init__(self, config):
    super().__init__(config)
    self.bert = Model(config)
    self.qa_outputs = nn.Linear(config.hidden_size, 2)
    self.post_init()

  def forward(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
    h = self.bert(input_ids, attention_mask, token_type_ids)
    start_logits, end_logits = self.qa_outputs(h).unbind(-1)
    return QuestionAnsweringModelOutput(start_logits=start_logits, end_logits=end_logits)

"""Import Hugging Face BERT weights.

Accepts a mapping of numpy arrays keyed by Hugging Face parameter names, either
  * the PyTorch `BertForMaskedLM.state_dict()` (e.g.
    'bert.encoder.layer.0.attention.self.query.weight', Linear weights stored [out, in]; old
    checkpoints use LayerNorm 'gamma'/'beta'), or
  * the Flax params tree of `FlaxBertForMaskedLM` (nested, or flattened with '.'), kernels
    [in, out].
and returns params for `MaskedLM` (or, from `BertForSequenceClassification`, for
`SequenceClassifier`: encoder + pooler + classifier) with
`ln_placement='post'`, in the scan or loop layout of the given config.
"""

from typing import Any, Mapping

import numpy as np

from realformer_jax.config import ModelConfig
from realformer_jax.model import params as params_lib


def _flatten(tree: Mapping, prefix: str = '') -> dict[str, np.ndarray]:
  flat = {}
  for key, value in tree.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(_flatten(value, name + '.'))
    else:
      flat[name] = np.asarray(value)
  return flat


class _Reader:
  """Looks names up in either naming convention, transposing PyTorch Linear weights."""

  def __init__(self, weights: Mapping[str, Any]):
    flat = _flatten(weights)
    self.torch = any(k.endswith('.weight') for k in flat)
    # Strip the model prefix ('bert.' in *ForMaskedLM, none in BertModel).
    self.flat = {k[len('bert.') :] if k.startswith('bert.') else k: v for k, v in flat.items()}
    self.used: set[str] = set()

  def get(self, *candidates: str) -> np.ndarray:
    for name in candidates:
      if name in self.flat:
        self.used.add(name)
        return self.flat[name]
    raise KeyError(f'Hugging Face weights have none of {candidates}')

  def dense(self, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    if self.torch:
      return self.get(f'{prefix}.weight').T, self.get(f'{prefix}.bias')
    return self.get(f'{prefix}.kernel'), self.get(f'{prefix}.bias')

  def norm(self, prefix: str) -> dict[str, np.ndarray]:
    return {
      'scale': self.get(f'{prefix}.scale', f'{prefix}.weight', f'{prefix}.gamma'),
      'bias': self.get(f'{prefix}.bias', f'{prefix}.beta'),
    }

  def embedding(self, prefix: str) -> np.ndarray:
    return self.get(f'{prefix}.embedding', f'{prefix}.weight')

  def has(self, prefix: str) -> bool:
    return any(k.startswith(prefix) for k in self.flat)


def _layer(reader: _Reader, i: int, cfg: ModelConfig) -> dict:
  heads, head_dim, d_model = cfg.num_heads, cfg.head_dim, cfg.hidden_size
  base = f'encoder.layer.{i}'
  qkv = [reader.dense(f'{base}.attention.self.{n}') for n in ('query', 'key', 'value')]
  out_kernel, out_bias = reader.dense(f'{base}.attention.output.dense')
  wi_kernel, wi_bias = reader.dense(f'{base}.intermediate.dense')
  wo_kernel, wo_bias = reader.dense(f'{base}.output.dense')
  return {
    'attention': {
      'qkv': {
        'kernel': np.stack([k.reshape(d_model, heads, head_dim) for k, _ in qkv], axis=1),
        'bias': np.stack([b.reshape(heads, head_dim) for _, b in qkv], axis=0),
      },
      'out': {'kernel': out_kernel.reshape(heads, head_dim, d_model), 'bias': out_bias},
    },
    'attention_norm': reader.norm(f'{base}.attention.output.LayerNorm'),
    'mlp': {
      'wi': {'kernel': wi_kernel, 'bias': wi_bias},
      'wo': {'kernel': wo_kernel, 'bias': wo_bias},
    },
    'mlp_norm': reader.norm(f'{base}.output.LayerNorm'),
  }


def _dense_params(pair) -> dict:
  return {'kernel': pair[0], 'bias': pair[1]}


def from_hf_bert(weights: Mapping[str, Any], config: ModelConfig) -> dict:
  """Hugging Face BERT weights -> this package's params (without the 'params' wrapper)."""
  if (
    config.ln_placement not in ('post', 'realformer')
    or not config.use_bias
    or config.norm != 'layernorm'
  ):
    raise ValueError(
      'from_hf_bert: BERT weights need ln_placement post/realformer, '
      "norm='layernorm' and use_bias=True"
    )
  if config.position_embedding != 'learned':
    raise ValueError(
      f'from_hf_bert: BERT weights hold a learned position table; '
      f'model.position_embedding={config.position_embedding!r} has none '
      "(use 'learned')"
    )
  reader = _Reader(weights)
  encoder = {
    'embeddings': {
      'word': {'embedding': reader.embedding('embeddings.word_embeddings')},
      'position': {'embedding': reader.embedding('embeddings.position_embeddings')},
      'segment': {'embedding': reader.embedding('embeddings.token_type_embeddings')},
      'norm': reader.norm('embeddings.LayerNorm'),
    }
  }
  for i in range(config.num_layers):
    encoder[f'layers_{i}'] = _layer(reader, i, config)
  tree: dict = {'encoder': encoder}
  if reader.has('cls.predictions'):
    tree['mlm_head'] = {
      'transform': _dense_params(reader.dense('cls.predictions.transform.dense')),
      'norm': reader.norm('cls.predictions.transform.LayerNorm'),
      'output_bias': reader.get('cls.predictions.bias', 'cls.predictions.decoder.bias'),
    }
  if reader.has('pooler.dense'):
    tree['pooler'] = {'dense': _dense_params(reader.dense('pooler.dense'))}
  if reader.has('classifier'):  # BertForSequenceClassification
    tree['classifier'] = {'classifier': _dense_params(reader.dense('classifier'))}
  if config.scan_layers:
    tree = params_lib.stack_layers(tree)
  return tree


def config_from_hf(hf_config: Any, **overrides: Any) -> ModelConfig:
  """ModelConfig matching a transformers `BertConfig` (post layout, no dropout overrides)."""
  act = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh', 'relu': 'relu'}[
    hf_config.hidden_act
  ]
  values = dict(
    vocab_size=hf_config.vocab_size,
    hidden_size=hf_config.hidden_size,
    num_layers=hf_config.num_hidden_layers,
    num_heads=hf_config.num_attention_heads,
    mlp_dim=hf_config.intermediate_size,
    max_len=hf_config.max_position_embeddings,
    type_vocab_size=hf_config.type_vocab_size,
    dropout_rate=hf_config.hidden_dropout_prob,
    attention_dropout_rate=hf_config.attention_probs_dropout_prob,
    norm_epsilon=hf_config.layer_norm_eps,
    activation=act,
    init_std=hf_config.initializer_range,
    ln_placement='post',
  )
  values.update(overrides)
  return ModelConfig(**values)

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

The other direction, `to_hf_bert` (experiments.export_hf), reads the same table (`bert_leaves`):
one list of names, shapes and layouts serves both.
"""

import dataclasses
from typing import Any, Mapping, Optional

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

  def torch_layout(self, leaf) -> np.ndarray:
    """`leaf`'s tensor as PyTorch stores it, whichever naming the weights use."""
    prefix, kind = leaf.hf.rsplit('.', 1)
    if kind == 'bias' and not leaf.transpose and 'LayerNorm' in prefix:
      return self.get(f'{prefix}.bias', f'{prefix}.beta')
    if kind == 'bias':
      return self.get(
        leaf.hf, 'cls.predictions.decoder.bias' if prefix == 'cls.predictions' else leaf.hf
      )
    if leaf.transpose:
      return self.dense(prefix)[0].T
    if 'LayerNorm' in prefix or 'final_norm' in prefix:
      return self.norm(prefix)['scale']
    if prefix.startswith('embeddings.'):
      return self.embedding(prefix)
    return self.get(leaf.hf)

  def has(self, prefix: str) -> bool:
    return any(k.startswith(prefix) for k in self.flat)


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One Hugging Face tensor (PyTorch name and layout) and where it lives in our params.

  Ours = (hf.T if transpose else hf).reshape(shape), placed at `path`, or at index `slot` of
  axis `slot_axis` of the leaf at `path` (query / key / value share one stacked kernel)."""

  hf: str  # PyTorch name without the model prefix ('bert.' or none)
  path: tuple[str, ...]  # in our (loop-layout) params
  shape: tuple[int, ...]  # our shape of this tensor (of the slot, for the qkv kernel)
  hf_shape: tuple[int, ...]
  transpose: bool = False  # a torch.nn.Linear weight, stored [out, in]
  slot: Optional[int] = None
  slot_axis: int = 0

  def to_ours(self, hf_value: np.ndarray) -> np.ndarray:
    value = hf_value.T if self.transpose else hf_value
    return np.asarray(value).reshape(self.shape)

  def to_hf(self, ours: np.ndarray) -> np.ndarray:
    value = np.asarray(ours)
    if self.slot is not None:
      value = np.take(value, self.slot, axis=self.slot_axis)
    if self.transpose:
      return np.ascontiguousarray(value.reshape(self.hf_shape[::-1]).T)
    return value.reshape(self.hf_shape)


def _dense(hf: str, path: tuple, fan_in: tuple, fan_out: tuple, **slot) -> list[Leaf]:
  n_in, n_out = int(np.prod(fan_in)), int(np.prod(fan_out))
  return [
    Leaf(f'{hf}.weight', path + ('kernel',), fan_in + fan_out, (n_out, n_in), True, **slot),
    Leaf(f'{hf}.bias', path + ('bias',), fan_out, (n_out,), **slot),
  ]


def _norm(hf: str, path: tuple, d: int) -> list[Leaf]:
  return [
    Leaf(f'{hf}.weight', path + ('scale',), (d,), (d,)),
    Leaf(f'{hf}.bias', path + ('bias',), (d,), (d,)),
  ]


def bert_leaves(config: ModelConfig, groups=('encoder', 'mlm_head')) -> list[Leaf]:
  """The BERT naming of our parameters, one place for both directions (import: from_hf_bert;
  export: to_hf_bert). groups: 'encoder', 'mlm_head', 'pooler', 'classifier'. Pre-LN's final
  norm has no BERT counterpart: it is 'encoder.final_norm' (the exported module's name)."""
  d, heads, head_dim, mlp = config.hidden_size, config.num_heads, config.head_dim, config.mlp_dim
  leaves: list[Leaf] = []
  if 'encoder' in groups:
    emb = ('encoder', 'embeddings')
    tables = [('word_embeddings', 'word', config.vocab_size)]
    if config.position_embedding == 'learned':
      tables.append(('position_embeddings', 'position', config.max_len))
    tables.append(('token_type_embeddings', 'segment', config.type_vocab_size))
    for hf, ours, rows in tables:
      leaves.append(
        Leaf(f'embeddings.{hf}.weight', emb + (ours, 'embedding'), (rows, d), (rows, d))
      )
    leaves += _norm('embeddings.LayerNorm', emb + ('norm',), d)
    for i in range(config.num_layers):
      hf, ours = f'encoder.layer.{i}', ('encoder', f'layers_{i}')
      for slot, name in enumerate(('query', 'key', 'value')):
        qkv = ours + ('attention', 'qkv')
        leaves += [
          Leaf(
            f'{hf}.attention.self.{name}.weight',
            qkv + ('kernel',),
            (d, heads, head_dim),
            (d, d),
            True,
            slot,
            1,
          ),
          Leaf(
            f'{hf}.attention.self.{name}.bias',
            qkv + ('bias',),
            (heads, head_dim),
            (d,),
            False,
            slot,
            0,
          ),
        ]
      leaves += _dense(
        f'{hf}.attention.output.dense', ours + ('attention', 'out'), (heads, head_dim), (d,)
      )
      leaves += _norm(f'{hf}.attention.output.LayerNorm', ours + ('attention_norm',), d)
      leaves += _dense(f'{hf}.intermediate.dense', ours + ('mlp', 'wi'), (d,), (mlp,))
      leaves += _dense(f'{hf}.output.dense', ours + ('mlp', 'wo'), (mlp,), (d,))
      leaves += _norm(f'{hf}.output.LayerNorm', ours + ('mlp_norm',), d)
    if config.ln_placement == 'pre':
      leaves += _norm('encoder.final_norm', ('encoder', 'final_norm'), d)
  if 'mlm_head' in groups:
    head = ('mlm_head',)
    leaves += _dense('cls.predictions.transform.dense', head + ('transform',), (d,), (d,))
    leaves += _norm('cls.predictions.transform.LayerNorm', head + ('norm',), d)
    leaves.append(
      Leaf(
        'cls.predictions.bias', head + ('output_bias',), (config.vocab_size,), (config.vocab_size,)
      )
    )
  if 'pooler' in groups:
    leaves += _dense('pooler.dense', ('pooler', 'dense'), (d,), (d,))
  return leaves


def _place(tree: dict, leaf: Leaf, value: np.ndarray, stacks: dict) -> None:
  if leaf.slot is not None:  # collected, stacked once all slots are in
    stacks.setdefault(leaf.path, {})[leaf.slot] = (value, leaf.slot_axis)
    return
  node = tree
  for key in leaf.path[:-1]:
    node = node.setdefault(key, {})
  node[leaf.path[-1]] = value


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
  groups = ['encoder']
  groups += [
    g
    for g, prefix in (('mlm_head', 'cls.predictions'), ('pooler', 'pooler.dense'))
    if reader.has(prefix)
  ]
  tree: dict = {}
  stacks: dict = {}
  for leaf in bert_leaves(config, groups):
    _place(tree, leaf, leaf.to_ours(reader.torch_layout(leaf)), stacks)
  for path, slots in stacks.items():
    axis = slots[0][1]
    stacked = np.stack([slots[i][0] for i in sorted(slots)], axis=axis)
    _place(tree, Leaf('', path, (), ()), stacked, {})
  if reader.has('classifier'):  # BertForSequenceClassification
    kernel, bias = reader.dense('classifier')
    tree['classifier'] = {'classifier': {'kernel': kernel, 'bias': bias}}
  if config.scan_layers:
    tree = params_lib.stack_layers(tree)
  return tree


def to_hf_bert(params: Mapping[str, Any], config: ModelConfig) -> dict[str, np.ndarray]:
  """This package's MaskedLM params (scan or loop layout) -> PyTorch BertForMaskedLM names
  ('bert.embeddings...', 'cls.predictions...'), float32 numpy arrays. The MLM decoder is tied
  to the word embeddings, as in BERT, so it is not listed."""
  params = params_lib.unstack_layers(params_lib.unbox(dict(params)))
  groups = [g for g in ('encoder', 'mlm_head', 'pooler') if g in params]
  out = {}
  for leaf in bert_leaves(config, groups):
    value = params
    for key in leaf.path:
      value = value[key]
    prefix = '' if leaf.hf.startswith('cls.') else 'bert.'
    out[prefix + leaf.hf] = leaf.to_hf(np.asarray(value, np.float32))
  # A fine-tuned head (SequenceClassifier, SpanExtractor): BertForSequenceClassification's and
  # BertForQuestionAnswering's names, torch.nn.Linear's [out, in] layout.
  for ours, hf in FINETUNED_HEADS.items():
    if ours in params:
      dense = params[ours][ours]
      out[f'{hf}.weight'] = np.ascontiguousarray(np.asarray(dense['kernel'], np.float32).T)
      out[f'{hf}.bias'] = np.asarray(dense['bias'], np.float32)
  return out


# Our fine-tuned heads' parameter groups -> transformers' names for them.
FINETUNED_HEADS = {'classifier': 'classifier', 'span': 'qa_outputs'}


# ModelConfig field -> BertConfig field: config_from_hf reads them, experiments.export_hf writes.
HF_CONFIG_FIELDS = {
  'vocab_size': 'vocab_size',
  'hidden_size': 'hidden_size',
  'num_layers': 'num_hidden_layers',
  'num_heads': 'num_attention_heads',
  'mlp_dim': 'intermediate_size',
  'max_len': 'max_position_embeddings',
  'type_vocab_size': 'type_vocab_size',
  'dropout_rate': 'hidden_dropout_prob',
  'attention_dropout_rate': 'attention_probs_dropout_prob',
  'norm_epsilon': 'layer_norm_eps',
  'init_std': 'initializer_range',
}
# transformers' hidden_act -> our activation (the first name of each is the one exported).
HF_ACTIVATIONS = {
  'gelu': 'gelu',
  'gelu_new': 'gelu_tanh',
  'gelu_pytorch_tanh': 'gelu_tanh',
  'relu': 'relu',
}


def config_from_hf(hf_config: Any, **overrides: Any) -> ModelConfig:
  """ModelConfig matching a transformers `BertConfig` (post layout, no dropout overrides)."""
  values = {ours: getattr(hf_config, hf) for ours, hf in HF_CONFIG_FIELDS.items()}
  values.update(activation=HF_ACTIVATIONS[hf_config.hidden_act], ln_placement='post')
  values.update(overrides)
  return ModelConfig(**values)


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
  """The BertConfig fields of `config` (hidden_act: transformers' name where it has one)."""
  values = {hf: getattr(config, ours) for ours, hf in HF_CONFIG_FIELDS.items()}
  names = {ours: hf for hf, ours in reversed(HF_ACTIVATIONS.items())}
  values['hidden_act'] = names.get(config.activation, config.activation)
  return values

"""Model configuration: frozen dataclasses, one per concern, validated when they are made.

Every choice the papers compare (layer-norm placement, residual attention, attention scaling,
norm, residual branch, initialisation, parameterisation, activation) is a named string field, so
an experiment is a config change. `ModelConfig` is made of one dataclass per concern:
`Architecture` (which function the weights define), `Regularisation`, `Initialisation`,
`Storage` and `Execution` (how the function is computed: dtype, layer scan, remat, residual
carry, attention kernels); the field sets that fine-tuning and the export let differ from a
checkpoint are derived from that split (FIELD_CONCERNS). Making a `ModelConfig` (directly, by
`replace`, or from a config section with `from_mapping`) checks it once and raises
`ConfigError` with a one-line message naming the offending field: a ModelConfig that exists is
valid, so the modules below never check it again and bad input never reaches tracing. (One
exception by layering: the kernel backend that attention_impl names lives above this file, so
kernels/plumbing/select.py checks it.)

`from_section` / `to_config_dict` are the bridge every frozen config section of the project
uses (train/config.py, data/config.py, finetune/config.py): the dataclass is the schema (field
names, defaults, a comment per field); the ml_collections ConfigDict that configs/ files and
`--config.a.b=v` flags edit is generated from it, and turned back into the dataclass once, at
the entry point.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, TypeVar, Union

import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

from realformer_jax.config_docs import did_you_mean

LN_PLACEMENTS = ('post', 'pre', 'realformer', 'none')
ATTENTION_SCALES = ('standard', 'entropy_invariant', 't5')
POSITION_EMBEDDINGS = ('learned', 'rope', 'none')
NORMS = ('layernorm', 'rmsnorm')
RESIDUAL_BRANCHES = ('plain', 'rezero', 'skipinit', 'fixed_schedule')
INITS = ('bert', 'truncated_normal', 'lecun', 'xavier', 'he', 'ds_init')
PARAMETERIZATIONS = ('standard', 'ntk')
ACTIVATIONS = ('gelu', 'gelu_tanh', 'relu', 'normalized_sigmoid', 'selu')
DTYPES = ('float32', 'bfloat16', 'float16')
REMAT_POLICIES = ('none', 'full', 'dots', 'dots_no_batch')
RESIDUAL_SCORES_BACKWARD = ('saved', 'recomputed')
# How residual attention hands its scores to the next layer: 'scores' the float32 [B, H, L, L]
# sum (memory O(L^2)); 'qk' every layer's queries and keys, the sum rebuilt in the kernels
# (O(L) memory, more FLOPs: kernels/score_paths/qk_carry.py); 'auto' the fastest carry that fits one
# sequence in the device's memory, 'qk' only where a fused kernel serves the platform and
# length, chosen once when the train setup builds the model (kernels/plumbing/select.py `for_run`,
# called by train/build.py); kernels/score_paths/score_path.py then takes the chosen carry's path.
RESIDUAL_CARRIES = ('auto', 'scores', 'qk')
# How self-attention is computed (realformer_jax/kernels): 'xla' the einsum path; 'pallas' the
# fused kernel of the platform (Triton on GPU, Mosaic on TPU; interpret mode on CPU); 'auto' by
# the platform the step is compiled for; or a kernel backend by name: 'pallas_triton',
# 'pallas_mosaic', 'cudnn' (jax's cuDNN flash attention: GPU; post / pre without attention
# dropout), or one you register (docs/extending.md). The backends live above this file, so a
# backend's name and what it can do are checked by kernels/plumbing/select.py `check`: by the train
# setup
# before any data is built, and whenever the model is traced; here only the form.
ATTENTION_MODES = ('auto', 'xla', 'pallas')
ATTENTION_PLATFORMS = ('auto', 'cpu', 'gpu', 'tpu')
# The counter-based hash every dropout mask is drawn with (kernels/dropout/dropout_bits.py):
# 'threefry'
# (Threefry-2x32-20, eight 8-bit draws a hash) or 'philox' (Philox-4x32-10, sixteen: about half
# the integer work per draw in the GPU kernels). Another mask: a resumed run keeps its own.
DROPOUT_GENERATORS = ('threefry', 'philox')
# A rematerialised layer's attention dropout mask on the fused kernels (plain attention: Post-LN,
# Pre-LN): 'stored' the forward's mask (one bit per score element) is kept for the backward;
# 'per_layer' a pass draws the layer's mask just before its backward (one layer's in memory at
# a time, the hash once more); 'drawn' the backward kernel draws it again in its loops (no
# memory, the hash twice more); 'auto' the cheapest of them whose memory fits, decided once
# when the train setup builds the model and logged (kernels/dropout/remat_masks.py).
REMAT_DROPOUT_MASKS = ('auto', 'stored', 'per_layer', 'drawn')


class ConfigError(ValueError):
  """A configuration value is invalid. The message names the field."""


SectionT = TypeVar('SectionT')


def _plain(value: Any) -> Any:
  """JSON and ConfigDict hand back lists where the schema has tuples (hashable, frozen)."""
  if isinstance(value, list):
    return tuple(_plain(v) for v in value)
  return value


def from_section(cls: type[SectionT], section: str, values: Mapping[str, Any]) -> SectionT:
  """The frozen dataclass `cls` from one config section (a ConfigDict or dict), rejecting an
  unknown field by name ('<section>.<field>: unknown config field'); `cls` validates itself.
  A field of a saved config that moved since (SAVED_FIELD_MOVES) is read where it lives today."""
  if isinstance(values, cls):
    return values
  known = {f.name for f in dataclasses.fields(cls)}
  kept = {}
  for key in values.keys():
    where = saved_field(section, key, known)
    if where is None:  # left the section (SAVED_FIELD_MOVES): a saved config may hold it
      continue
    if where[0] != section or where[1] not in known:
      raise ConfigError(f'{section}.{key}: unknown config field{did_you_mean(key, known)}')
    kept[where[1]] = _plain(values[key])
  return cls(**kept)


def to_config_dict(
  instance: Any, field_types: Optional[Mapping[str, type]] = None
) -> ml_collections.ConfigDict:
  """A config dataclass as a ConfigDict (the editable defaults of a configs/ file).

  `field_types` types fields whose value may change type (e.g. int or 'auto': object) or is
  None by default (a typed placeholder, so that a command-line override still parses)."""
  field_types = field_types or {}
  c = ml_collections.ConfigDict()
  for field in dataclasses.fields(instance):
    value = getattr(instance, field.name)
    if field.name in field_types:
      value = config_dict.FieldReference(value, field_type=field_types[field.name])
    c[field.name] = value
  return c


# ModelConfig is made of one dataclass per concern: what a field is about is where it is
# declared, and what may differ between a checkpoint and the model that uses it follows from
# that (FIELD_CONCERNS below; fine-tuning and the Hugging Face export derive their field sets
# from it). Each concern's fields are flat on ModelConfig (`config.dtype`, `--config.model.dtype`);
# ModelConfig checks them all when it is made. The decoder of encoder-decoder models is
# seq2seq's (seq2seq/model_config.py: Seq2SeqModelConfig adds it).


@dataclasses.dataclass(frozen=True)
class Architecture:
  """Which function the weights define: a checkpoint fixes these."""

  vocab_size: int = 30522  # word-piece vocabulary size
  hidden_size: int = 768  # d_model
  num_layers: int = 12  # encoder layers (the scan length)
  num_heads: int = 12  # attention heads; must divide hidden_size
  mlp_dim: int = 3072  # feed-forward inner size
  max_len: int = 512  # size of the learned position table (no limit under rope / none)
  type_vocab_size: int = 2  # segment (token type) vocabulary

  ln_placement: str = 'post'  # 'post' (BERT) | 'pre' (+ final norm) | 'realformer' | 'none'
  residual_attention: Optional[bool] = None  # None: on iff ln_placement == 'realformer'
  running_mean: bool = False  # softmax sees sum/(l+1) (paper: xLarge only)
  attention_scale: str = 'standard'  # 'standard' 1/sqrt(d) | 'entropy_invariant' | 't5'
  # 'learned' (BERT's absolute table, added to the embeddings) | 'rope' (rotary, applied to
  # queries and keys per head: relative offsets, any length; rotary.py) | 'none'
  position_embedding: str = 'learned'
  rope_base: float = 10000.0  # rotary angle base: theta_i = rope_base^(-2i / head_dim)
  entropy_base_len: int = 512  # n at which entropy-invariant scaling equals 1/sqrt(d)

  norm: str = 'layernorm'  # 'layernorm' | 'rmsnorm'
  norm_epsilon: float = 1e-12  # BERT's value
  use_bias: bool = True  # False removes every bias (dense, norm, MLM output), T5 style
  activation: str = 'gelu'  # FFN and MLM-transform activation (exact erf GELU, as BERT)
  # 'plain' x+F | 'rezero' (trainable gate from 0, no norms in layers) | 'skipinit' (same gate,
  # branch norms removed) | 'fixed_schedule' (gate min(1, step/K), untrained): see block.py
  residual_branch: str = 'plain'
  gate_schedule_steps: int = 1000  # fixed_schedule: K, steps for the gate to rise from 0 to 1
  # 'standard' | 'ntk': kernels stored sqrt(fan_in) larger, output times 1/sqrt(fan_in) at run
  # time (same function at init; N(0, 1) weights with init='lecun'); embeddings unchanged
  parameterization: str = 'standard'


@dataclasses.dataclass(frozen=True)
class Regularisation:
  """Noise while training only; the function at inference is the same."""

  dropout_rate: float = 0.1  # embeddings and residual branches
  attention_dropout_rate: float = 0.1  # on attention probabilities only
  dropout_generator: str = 'threefry'  # the masks' hash: see DROPOUT_GENERATORS above


@dataclasses.dataclass(frozen=True)
class Initialisation:
  """How weights start: a checkpoint's weights already exist."""

  # dense kernels: 'bert' | 'truncated_normal' | 'lecun' | 'xavier' | 'he' | 'ds_init'
  # (realised stds in initializers.py); embeddings always use init_std
  init: str = 'bert'
  init_std: float = 0.02  # std of 'bert' / 'truncated_normal' and of embeddings
  ds_init_gamma: float = 1.0  # DS-Init extra gain on the bound (1 = the paper)
  ds_init_alpha: float = 1.0  # DS-Init alpha (bound = gamma * alpha * xavier / sqrt(l))


@dataclasses.dataclass(frozen=True)
class Storage:
  """How the weights are stored: a checkpoint's weights are restored as saved."""

  param_dtype: str = 'float32'  # storage dtype of parameters


@dataclasses.dataclass(frozen=True)
class Execution:
  """How the function is computed, not which one: the same numbers (dtype: another rounding of
  them) from other kernels, layouts, memory and compile time. May differ from a checkpoint's."""

  dtype: str = 'float32'  # compute dtype
  scan_layers: bool = True  # nn.scan over layers (False: Python loop, same numbers)
  # Layers per scan iteration (1 = a rolled loop: compile time flat in depth; num_layers = fully
  # unrolled: no per-layer slicing/stacking copies, compile time like the Python loop), or
  # 'auto': fully unrolled on a GPU where the unrolled compile is estimated within budget, else
  # rolled (model/layer_unroll.py). Same numbers and the same stacked parameter layout for
  # every value; an integer must divide num_layers.
  scan_unroll: Union[int, str] = 'auto'
  remat_policy: str = 'none'  # rematerialisation of each layer: see REMAT_POLICIES
  remat_dropout_masks: str = 'auto'  # kept or drawn again: see REMAT_DROPOUT_MASKS above
  # Residual attention's backward pass: 'saved' (autodiff, per the remat policy) or
  # 'recomputed': no layer's carried [B, H, L, L] sum is saved; going down the stack
  # acc_{l-1} = acc_l - s_l is rebuilt and each layer recomputed (recomputed_scores.py).
  # O(1) instead of O(num_layers) score-sized buffers: for long sequences. Needs scan_layers.
  residual_scores_backward: str = 'saved'
  # Residual attention's carry: 'scores' (the sum above, with residual_scores_backward),
  # 'qk' (the stacked queries and keys: memory linear in L, (4 + 2l) K instead of 4 K FLOPs
  # per score element of layer l forward) or 'auto' (see RESIDUAL_CARRIES above).
  residual_carry: str = 'auto'
  # Same numbers, different kernels (see ATTENTION_MODES above and kernels/plumbing/select.py).
  attention_impl: str = 'auto'
  # Platform the attention is compiled for: 'auto' = jax.default_backend() when traced. The
  # train setup sets it from the mesh's devices (in a deviceless compile: the target's).
  attention_platform: str = 'auto'
  # Before a run's first step on a GPU / TPU, check the kernels 'auto' or 'pallas' takes
  # against the einsum path on that device (a tiny problem at the run's head size and dtype;
  # analysis/kernel_check.py): 'auto' falls back to the einsum path on a mismatch, 'pallas' stops
  # with one error line. False trusts the kernels unchecked.
  attention_check: bool = True
  # Token ids outside [0, vocab_size) embed as NaN. Eager calls always refuse them; under jit
  # True adds a host callback that raises (debugging: a device -> host copy of the ids a step).
  check_token_ids: bool = False


# Each concern and its dataclass, in ModelConfig's field order.
CONCERNS = {
  'architecture': Architecture,
  'regularisation': Regularisation,
  'initialisation': Initialisation,
  'storage': Storage,
  'execution': Execution,
}
# Every ModelConfig field by its concern, derived from the dataclasses above.
FIELD_CONCERNS = {
  concern: tuple(f.name for f in dataclasses.fields(cls)) for concern, cls in CONCERNS.items()
}


# Execution fields that change the parameters' tree: one stacked scan or a Python loop of
# layers (model/params.py converts a checkpoint between them). The others leave a saved train
# state as it is, so a resumed run may change them (train/resume_checks.py check_resumable).
LAYOUT_FIELDS = ('scan_layers',)


def fields_of(*concerns: str) -> tuple[str, ...]:
  """The ModelConfig fields of `concerns` (keys of FIELD_CONCERNS), in declaration order."""
  return tuple(name for concern in concerns for name in FIELD_CONCERNS[concern])


# A saved config (a workdir's config.json) outlives the schema. Its fields that today's names
# otherwise, in this one place: (section, field) -> (section, field) today, or None where the
# field left the section: the decoder's fields moved to seq2seq's Seq2SeqModelConfig, and an
# encoder-only model never read them. `saved_field` applies it.
SAVED_FIELD_MOVES = {
  ('data', 'tokenizer_path'): ('data', 'vocab_file'),
  ('model', 'num_decoder_layers'): None,
  ('model', 'decoder_attention'): None,
}
# Fields added since, with the value a saved config written before them was trained with (not
# today's default, which may change): a resume compares a saved config without the field as
# holding this value (train/checkpoint_record.py model_differences).
SAVED_FIELD_ADDED = {('model', 'dropout_generator'): 'threefry'}


def saved_field(section: str, field: str, known: Any) -> Optional[tuple[str, str]]:
  """Where the saved `section.field` lives today: itself when `known` (today's fields of the
  section) has it, else where it moved (None: dropped)."""
  if field in known:
    return section, field
  return SAVED_FIELD_MOVES.get((section, field), (section, field))


@dataclasses.dataclass(frozen=True)
class ModelConfig(Execution, Storage, Initialisation, Regularisation, Architecture):
  """Hyperparameters of the encoder and its heads, by concern (the bases above; their fields
  are this class's). Defaults are BERT-Base."""

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def use_residual_attention(self) -> bool:
    if self.residual_attention is None:
      return self.ln_placement == 'realformer'
    return self.residual_attention

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def storage_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  def __post_init__(self):
    unroll = self.scan_unroll
    if isinstance(unroll, str) and unroll.isdigit():  # from the command line: '--...=24'
      object.__setattr__(self, 'scan_unroll', int(unroll))
    self._check()

  def replace(self, **changes: Any) -> 'ModelConfig':
    return dataclasses.replace(self, **changes)  # checked by __post_init__

  @classmethod
  def from_mapping(cls, values: Mapping[str, Any]) -> 'ModelConfig':
    """Builds from a dict / ConfigDict (the `model` section), rejecting unknown fields."""
    return from_section(cls, 'model', values)

  def _check_scan_unroll(self) -> None:
    unroll = self.scan_unroll
    if unroll == 'auto':
      return
    if not isinstance(unroll, int) or isinstance(unroll, bool) or unroll <= 0:
      raise ConfigError(
        f'model.scan_unroll={unroll!r}: must be a positive integer dividing model.num_layers '
        "or 'auto'"
      )
    if self.num_layers % unroll:
      raise ConfigError(
        f'model.scan_unroll={unroll}: must divide model.num_layers={self.num_layers}'
      )

  def _check(self) -> None:
    choices = {
      'ln_placement': LN_PLACEMENTS,
      'attention_scale': ATTENTION_SCALES,
      'position_embedding': POSITION_EMBEDDINGS,
      'norm': NORMS,
      'residual_branch': RESIDUAL_BRANCHES,
      'init': INITS,
      'parameterization': PARAMETERIZATIONS,
      'activation': ACTIVATIONS,
      'dtype': DTYPES,
      'param_dtype': DTYPES,
      'remat_policy': REMAT_POLICIES,
      'residual_scores_backward': RESIDUAL_SCORES_BACKWARD,
      'residual_carry': RESIDUAL_CARRIES,
      'attention_platform': ATTENTION_PLATFORMS,
      'dropout_generator': DROPOUT_GENERATORS,
      'remat_dropout_masks': REMAT_DROPOUT_MASKS,
    }
    for name, allowed in choices.items():
      value = getattr(self, name)
      if value not in allowed:
        raise ConfigError(f'model.{name}={value!r}: must be one of {", ".join(allowed)}')
    positive = (
      'vocab_size',
      'hidden_size',
      'num_layers',
      'num_heads',
      'mlp_dim',
      'max_len',
      'type_vocab_size',
      'entropy_base_len',
      'gate_schedule_steps',
    )
    for name in positive:
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f'model.{name}={value!r}: must be a positive integer')
    if self.hidden_size % self.num_heads:
      raise ConfigError(
        f'model.num_heads={self.num_heads}: must divide model.hidden_size={self.hidden_size}'
      )
    for name in ('dropout_rate', 'attention_dropout_rate'):
      value = getattr(self, name)
      if not 0.0 <= value < 1.0:
        raise ConfigError(f'model.{name}={value!r}: must be in [0, 1)')
    if self.position_embedding == 'rope' and self.head_dim % 2:
      raise ConfigError(
        f'model.position_embedding=rope: rotates feature pairs, so the head '
        f'size model.hidden_size/model.num_heads={self.head_dim} must be even'
      )
    for name in ('norm_epsilon', 'init_std', 'ds_init_gamma', 'ds_init_alpha', 'rope_base'):
      if getattr(self, name) <= 0:
        raise ConfigError(f'model.{name}={getattr(self, name)!r}: must be positive')
    self._check_scan_unroll()
    if self.entropy_base_len < 2:
      raise ConfigError(f'model.entropy_base_len={self.entropy_base_len}: must be >= 2')
    if self.residual_scores_backward == 'recomputed' and not self.scan_layers:
      raise ConfigError(
        "model.residual_scores_backward='recomputed': needs "
        'model.scan_layers=True (it runs its own scan over the stacked layers)'
      )
    if not isinstance(self.attention_impl, str) or not self.attention_impl.isidentifier():
      raise ConfigError(
        f'model.attention_impl={self.attention_impl!r}: must be one of '
        f"{', '.join(ATTENTION_MODES)} or a kernel backend's name (kernels/backends/)"
      )
    if not isinstance(self.attention_check, bool):
      raise ConfigError(f'model.attention_check={self.attention_check!r}: must be True or False')
    if self.residual_attention not in (None, True, False):
      raise ConfigError(
        f'model.residual_attention={self.residual_attention!r}: must be None, True or False'
      )

"""Which norms and residual gates a layer has: one rule for encoder and decoder layers.

`ln_placement` puts a layer's norms (N) around each sublayer's residual sum; `residual_branch`
may gate each branch (g) and remove norms (docs/design.md, "Layer-norm placement"):

  post / realformer   y = N(x + g·F(x))        the norm sits on the trunk, after the sum
  pre                 y = x + g·F(N(x))        the norm sits on the branch; + a final norm
  none                y = x + g·F(x)           no norm in the layer

  rezero              g: a trainable scalar from 0; every norm of the layer goes
  skipinit            g: the same; only norms ON the branch go (Pre-LN's), Post-LN's stay
  fixed_schedule      g = min(1, step / K), not trained; norms follow the placement
  plain               g = 1

Norms outside the layer stack are not the layer's: the embeddings' norm (BERT normalises the
word + position + segment sum) exists for every placement and branch, in the encoder and the
decoder alike, and Pre-LN's final norm exists whenever the placement is 'pre'.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Placement:
  post: bool  # norms follow the residual sum (Post-LN, RealFormer); else they precede F
  layer_norms: bool  # the layer has its norms (see the module docstring)
  trained_gate: bool  # each branch is scaled by a zero-initialised trainable scalar
  final_norm: bool  # a norm after the last layer (Pre-LN)
  embedding_norm: bool = True  # always: part of the embeddings, not of a layer


def placement(config: ModelConfig) -> Placement:
  post = config.ln_placement in ('post', 'realformer')
  branch = config.residual_branch
  if config.ln_placement == 'none' or branch == 'rezero':
    layer_norms = False
  elif branch == 'skipinit':
    layer_norms = post  # Post-LN's norms sit on the trunk, not on the branch
  else:
    layer_norms = True
  return Placement(
    post=post,
    layer_norms=layer_norms,
    trained_gate=branch in ('rezero', 'skipinit'),
    final_norm=config.ln_placement == 'pre',
  )


def trained_gate(module: nn.Module, name: str) -> jax.Array:
  """A branch's trainable scalar gate (float32, zero at init) as a parameter of `module`."""
  return module.param(
    name, nn.with_logical_partitioning(nn.initializers.zeros, ()), (), jnp.float32
  )

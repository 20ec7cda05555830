"""Parameter-tree utilities: scan <-> loop layouts, counting."""

import re
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

_LOOP_LAYER = re.compile(r'^layers_(\d+)$')


def unbox(tree: Any) -> Any:
  """Drops logical-partitioning metadata boxes, leaving plain arrays."""
  return nn.meta.unbox(tree)


def _map_encoders(tree: Mapping, fn) -> dict:
  """Applies `fn` to every dict that directly holds encoder layers."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      holds_layers = 'layers' in value or any(_LOOP_LAYER.match(k) for k in value)
      out[key] = fn(dict(value)) if holds_layers else _map_encoders(value, fn)
    else:
      out[key] = value
  return out


def unstack_layers(params: Mapping) -> dict:
  """scan layout ('layers' stacked on axis 0) -> loop layout ('layers_<i>'); idempotent."""

  def split(encoder: dict) -> dict:
    if 'layers' not in encoder:  # already in loop layout
      return encoder
    stacked = encoder.pop('layers')
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    for i in range(num_layers):
      encoder[f'layers_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
    return encoder

  return _map_encoders(unbox(params), split)


def stack_layers(params: Mapping) -> dict:
  """loop layout ('layers_<i>') -> scan layout ('layers' stacked on axis 0); idempotent."""

  def join(encoder: dict) -> dict:
    names = sorted(
      (k for k in encoder if _LOOP_LAYER.match(k)), key=lambda k: int(_LOOP_LAYER.match(k).group(1))
    )
    if not names:  # already in scan layout
      return encoder
    layers = [encoder.pop(k) for k in names]
    encoder['layers'] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return encoder

  return _map_encoders(unbox(params), join)


def count_params(params: Any) -> int:
  return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(unbox(params))))

"""Derivatives the fused kernels do not give, refused in one line instead of answered wrong.

The kernels' custom VJPs return a zero cotangent for the additive key bias and the score scale
(the model derives both from the padding mask, which has no gradient), and the kernels have no
derivative of their own (fused.py refuses grad of grad with HIGHER_ORDER).
`refuse_tangent(x, message)` is x, unchanged; when a derivative actually flows into x (jax
skips a custom JVP whose tangents are all symbolic zeros, so the ordinary training step never
reaches the rule) it raises a ConfigError with `message` while the program is traced, before
anything is compiled.
"""

from __future__ import annotations

import functools

import jax

from realformer_jax.config import ConfigError

HIGHER_ORDER = (
  'model.attention_impl: higher-order derivatives (grad of grad) are not supported on the '
  "fused attention kernels; use attention_impl='xla'"
)
SCALE_OR_BIAS = (
  'model.attention_impl: the fused attention kernels give no gradient for the attention bias '
  "or score scale (or other inputs shared by the layers); use attention_impl='xla'"
)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _refuse(x: jax.Array, message: str) -> jax.Array:
  return x


@_refuse.defjvp
def _refuse_jvp(message, primals, tangents):
  raise ConfigError(message)


def refuse_tangent(tree, message: str):
  """`tree` unchanged; raises ConfigError(message) if a derivative flows into an inexact leaf."""

  def guard(x):
    if not jax.numpy.issubdtype(jax.numpy.result_type(x), jax.numpy.inexact):
      return x
    return _refuse(x, message)

  return jax.tree.map(guard, tree)

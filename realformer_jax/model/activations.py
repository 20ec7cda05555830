"""Activation functions chosen by name (`ModelConfig.activation`).

The second-moment-normalised variants rescale so that a standard-normal input gives an output
with unit second moment (docs/design.md §4), which keeps E[y^2] = E[x^2] through a LeCun-
initialised layer followed by the activation.
"""

from typing import Callable

import jax
import jax.numpy as jnp

# E[sigmoid(z)^2] for z ~ N(0, 1).
SIGMOID_SECOND_MOMENT = 0.293379


def gelu(x: jax.Array) -> jax.Array:
  """BERT's exact GELU, x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))).

  jax.nn.gelu(approximate=False) goes through erfc, which keeps relative precision far in the
  negative tail (where GELU is below 1e-20) and costs ~3x more than erf on XLA:CPU; erf agrees
  with it to ~5e-7 absolute everywhere, and the tail is irrelevant to training.
  """
  return 0.5 * x * (1 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


def normalized_sigmoid(x: jax.Array) -> jax.Array:
  return jax.nn.sigmoid(x) / jnp.sqrt(jnp.asarray(SIGMOID_SECOND_MOMENT, x.dtype))


_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
  'gelu': gelu,  # BERT's exact erf GELU
  'gelu_tanh': lambda x: jax.nn.gelu(x, approximate=True),
  'relu': jax.nn.relu,
  'normalized_sigmoid': normalized_sigmoid,
  'selu': jax.nn.selu,  # lambda = 1.0507..., alpha = 1.6732...: self-normalising ELU
}


def get_activation(name: str) -> Callable[[jax.Array], jax.Array]:
  try:
    return _ACTIVATIONS[name]
  except KeyError:
    raise ValueError(f'activation={name!r}: must be one of {", ".join(_ACTIVATIONS)}') from None

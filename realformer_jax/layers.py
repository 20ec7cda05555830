"""DenseGeneral that creates its kernel at its real multi-dimensional shape.

flax.linen.DenseGeneral initialises a flattened 2-D kernel, which breaks multi-dimensional
logical names such as ('embed', 'heads', 'kv') under a mesh (FACTS.md). This one names every
kernel axis and supports NTK parameterisation (output scaled by 1/sqrt(fan_in) at run time).
"""

import math
from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.initializers import Initializer


class DenseGeneral(nn.Module):
  """y = x . kernel (+ bias), contracting `axis` of x with the kernel's leading axes."""

  features: Sequence[int]
  kernel_init: Initializer
  kernel_axes: Sequence[Optional[str]]  # logical names, input axes then output axes
  axis: Sequence[int] = (-1,)
  use_bias: bool = True
  ntk: bool = False  # multiply the output by 1/sqrt(fan_in) (NTK parameterisation)
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    axis = tuple(a % x.ndim for a in self.axis)
    features = tuple(self.features)
    in_shape = tuple(x.shape[a] for a in axis)
    kernel = self.param('kernel', nn.with_logical_partitioning(self.kernel_init,
                                                               tuple(self.kernel_axes)),
                        in_shape + features, self.param_dtype)
    kernel = kernel.astype(self.dtype)
    if self.ntk:
      kernel = kernel * jnp.asarray(1.0 / math.sqrt(math.prod(in_shape)), self.dtype)
    contract = (axis, tuple(range(len(axis))))
    y = jax.lax.dot_general(x.astype(self.dtype), kernel, (contract, ((), ())))
    if self.use_bias:
      bias_axes = tuple(self.kernel_axes)[len(axis):]
      bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros, bias_axes),
                        features, self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y

"""Basic layers: DenseGeneral with a real multi-dimensional kernel, and a faster, leaner Dropout.

flax.linen.DenseGeneral initialises a flattened 2-D kernel, which breaks multi-dimensional
logical names such as ('embed', 'heads', 'kv') under a mesh (FACTS.md). This one names every
kernel axis and supports NTK parameterisation (output scaled by 1/sqrt(fan_in) at run time).
"""

import functools
import math
from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.kernels.dropout.dropout_bits import keep_mask, realised_keep_prob
from realformer_jax.model.initializers import Initializer


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
    kernel = self.param(
      'kernel',
      nn.with_logical_partitioning(self.kernel_init, tuple(self.kernel_axes)),
      in_shape + features,
      self.param_dtype,
    )
    kernel = kernel.astype(self.dtype)
    if self.ntk:
      kernel = kernel * jnp.asarray(1.0 / math.sqrt(math.prod(in_shape)), self.dtype)
    contract = (axis, tuple(range(len(axis))))
    y = jax.lax.dot_general(x.astype(self.dtype), kernel, (contract, ((), ())))
    if self.use_bias:
      bias_axes = tuple(self.kernel_axes)[len(axis) :]
      bias = self.param(
        'bias',
        nn.with_logical_partitioning(nn.initializers.zeros, bias_axes),
        features,
        self.param_dtype,
      )
      y = y + bias.astype(self.dtype)
    return y


def configured_dense(cfg, **layer) -> DenseGeneral:
  """A DenseGeneral as the config runs every one (`cfg`: a ModelConfig): its bias, NTK
  parameterisation, compute and storage dtypes; `layer`: features, axes, init, name..."""
  return DenseGeneral(
    use_bias=cfg.use_bias,
    ntk=cfg.parameterization == 'ntk',
    dtype=cfg.compute_dtype,
    param_dtype=cfg.storage_dtype,
    **layer,
  )


class Dropout(nn.Module):
  """Inverted dropout with masks from `dropout_bits.keep_mask` (eight or sixteen 8-bit decisions
  per fused hash, by `generator`) and a backward pass that keeps only the boolean mask.

  Drop-in for `flax.linen.Dropout` (same arguments, auto-names and RNG stream), but not the same
  masks: flax draws a 32-bit uniform per element. Flax's version also computes
  `select(mask, x / keep, zeros_like(x))`, whose linearisation saves the mask plus two
  full-size float tensors (the scaled input and the zeros); under `nn.scan` each is stacked per
  layer, and for attention probabilities these are [B, H, L, L].
  """

  rate: float
  rng_collection: str = 'dropout'
  generator: str = 'threefry'  # the masks' hash (model.dropout_generator, dropout_bits.py)

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    if self.rate == 0.0 or deterministic:
      return x
    if self.rate == 1.0:
      return jnp.zeros_like(x)
    mask = keep_mask(self.make_rng(self.rng_collection), 1.0 - self.rate, x.shape, self.generator)
    return _apply_dropout_mask(x, mask, realised_keep_prob(1.0 - self.rate))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _apply_dropout_mask(x: jax.Array, mask: jax.Array, keep_prob: float) -> jax.Array:
  return jax.lax.select(mask, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros_like(x))


def _apply_dropout_mask_fwd(x, mask, keep_prob):
  return _apply_dropout_mask(x, mask, keep_prob), mask


def _apply_dropout_mask_bwd(keep_prob, mask, g):
  # The same operation order as the transpose of select(mask, x / keep, 0).
  return jax.lax.select(mask, g, jnp.zeros_like(g)) / jnp.asarray(keep_prob, g.dtype), None


_apply_dropout_mask.defvjp(_apply_dropout_mask_fwd, _apply_dropout_mask_bwd)

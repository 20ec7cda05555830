"""Residual attention through the kernels without saving any layer's carried sum.

Autodiff of a layer stack saves what each layer's backward needs. A fused residual-attention
layer needs its sum acc_l (the softmax input), and a scanned stack would save one float32
[B, H, L, L] per layer and copy it in and out of the stacked buffer (an H100 compile of
BERT-Large 32 x 512 showed ~4 extra score-sized passes per layer). But the sum is invertible
layer by layer, acc_{l-1} = acc_l - scale Q_l K_l^T, and the backward kernel can rebuild it
while it reads acc_l anyway. What autodiff cannot do is hand that rebuilt value to the layer
below. So the carry is a pair:

    CarriedScores(acc, shadow)

`acc` is the sum. `shadow` has its shape, is never read going up, and exists for its
cotangent: going down, the cotangent of layer l's output shadow is acc_l itself (put there by
the layer above, or by `seal` at the top, which saves the final sum once), and layer l's
backward returns acc_{l-1} as the cotangent of its input shadow. Per layer and score element
that is 8 bytes forward (read acc_{l-1}, write acc_l, in place) and 16 backward (read acc_l and
g_l, write acc_{l-1} and g_{l-1}, in place), plus 4 for dQ = scale g_{l-1} K. Works under
nn.scan and the Python loop; a per-layer remat would save each layer's input sum, so residual
attention with remat goes through the recomputed stack (recomputed_stack.py) instead.

`TopDown(acc, shadow)` is the carry of that recomputed stack's backward, where each layer is
re-run from its saved input and the sum it wrote, acc_l, is known: the forward kernel then
reads acc_l as the softmax input (`KernelSpec.sum_given`), and the backward is the same.

The shadow's cotangent is a value, not a gradient: these VJPs are only correct inside a stack
that seals its final carry. Only score_path.py uses this module: SealedPairPath.run_stack makes
the pair and seals it, so no caller can run a pair unsealed.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from realformer_jax.kernels.plumbing.fused import attention_backward, kernel_forward
from realformer_jax.kernels.plumbing.spec import KernelSpec


class CarriedScores(NamedTuple):
  acc: jax.Array  # acc_l, float32 [B, H, L, L]
  shadow: jax.Array  # same shape; carries acc_l down as its cotangent (module docstring)


class TopDown(NamedTuple):
  acc: jax.Array  # acc_l, the sum this layer wrote going up
  shadow: jax.Array  # its cotangent is acc_{l-1}


def initial_carry(acc0: jax.Array) -> CarriedScores:
  return CarriedScores(acc0, jnp.zeros_like(acc0))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def carried_attention(
  qkv,
  acc_in: Optional[jax.Array],
  shadow_in: Optional[jax.Array],
  bias,
  fparams,
  iparams,
  spec: KernelSpec,
):
  """(out, acc_l, shadow): the layer's attention; acc_in / shadow_in None at a first layer
  that has no incoming sum."""
  out, _, acc_out, _ = kernel_forward(qkv, acc_in, bias, fparams, iparams, spec)
  return out, acc_out, _shadow_out(shadow_in, acc_out)


def _shadow_out(shadow_in, acc_out):
  return jnp.zeros_like(acc_out) if shadow_in is None else shadow_in


def _carried_fwd(qkv, acc_in, shadow_in, bias, fparams, iparams, spec):
  out, lse, acc_out, bits = kernel_forward(qkv, acc_in, bias, fparams, iparams, spec)
  residuals = (qkv, bias, fparams, iparams, out, lse, bits)
  return (out, acc_out, _shadow_out(shadow_in, acc_out)), residuals


def _carried_bwd(spec, residuals, cotangents):
  qkv, bias, fparams, iparams, out, lse, bits = residuals
  g_out, g_acc, acc_out = cotangents  # the shadow's cotangent is acc_l (module docstring)
  dqkv, g_acc_in, acc_in = attention_backward(
    qkv, acc_out, g_acc, bias, fparams, iparams, out, lse, bits, g_out, spec, rebuild=spec.carry_in
  )
  if not spec.carry_in:
    g_acc_in = acc_in = None
  return dqkv, g_acc_in, acc_in, jnp.zeros_like(bias), jnp.zeros_like(fparams), None


carried_attention.defvjp(_carried_fwd, _carried_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def top_down_attention(qkv, acc_l, shadow, bias, fparams, iparams, spec: KernelSpec):
  """(out, acc_l, shadow) from the known sum acc_l; the VJP returns d acc_{l-1} for acc_l and
  acc_{l-1} for shadow. `spec.sum_given` must be set."""
  out, _, _, _ = kernel_forward(qkv, acc_l, bias, fparams, iparams, spec)
  return out, acc_l, shadow


def _top_down_fwd(qkv, acc_l, shadow, bias, fparams, iparams, spec):
  out, lse, _, bits = kernel_forward(qkv, acc_l, bias, fparams, iparams, spec)
  return (out, acc_l, shadow), (qkv, acc_l, bias, fparams, iparams, out, lse, bits)


def _top_down_bwd(spec, residuals, cotangents):
  qkv, acc_l, bias, fparams, iparams, out, lse, bits = residuals
  g_out, g_acc, _ = cotangents
  dqkv, g_acc_in, acc_in = attention_backward(
    qkv, acc_l, g_acc, bias, fparams, iparams, out, lse, bits, g_out, spec, rebuild=True
  )
  return dqkv, g_acc_in, acc_in, jnp.zeros_like(bias), jnp.zeros_like(fparams), None


top_down_attention.defvjp(_top_down_fwd, _top_down_bwd)


@jax.custom_vjp
def seal(x: jax.Array, carry: CarriedScores) -> jax.Array:
  """x, unchanged; going down, starts the chain of rebuilt sums with the final acc_N (saved
  once here) and a zero gradient for it (nothing uses the final sum)."""
  return x


def _seal_fwd(x, carry):
  return x, carry.acc


def _seal_bwd(acc, g_x):
  return g_x, CarriedScores(jnp.zeros_like(acc), acc)


seal.defvjp(_seal_fwd, _seal_bwd)

"""The fused attention op: one custom VJP over a fused backend's kernels (kernels/backends/).

    out_BxLxHxK, acc_BxHxLxL = fused_attention(qkv_BxLx3xHxK, acc_in, bias_BxL, fparams,
                                               iparams, spec)

computes what attention.py's einsum path computes (see tile_math.py for the notation) without
writing probabilities or their gradient to memory. The forward saves q, k, v, the output, the
row log-sum-exp and, with residual attention, the carried sum acc_l it wrote (not acc_{l-1}:
the softmax reads acc_l, and the backward never needs acc_{l-1}). The backward regenerates the
dropout mask from the key words in `iparams`.

Gradients: qkv, and the carried sum (d acc_{l-1} = d acc_l + dz * inv_div, written by the
kernel); the bias, the score scale and the running-mean divisor come from the padding mask and
the layer index, which have no gradient, so theirs are zero — and a gradient asked of the bias
or scale is refused in one line (score_path.py, refusals.py), as are higher derivatives.

Under a remat policy (`spec.for_remat`, plain attention) the backward's re-run of the layer
would run the forward kernel a second time only to rebuild the output and the row statistics:
the forward names them (`SAVED_FOR_BACKWARD`, O(L) per head: [B, L, H, K] in the compute dtype
and two float32 [B, H, L]), every policy of model/encoder.py keeps that name, and the re-run
then holds no forward kernel. The dropout mask (O(L^2): one bit per element) is among them
only with `spec.keeps_mask` (model.remat_dropout_masks, kernels/dropout/remat_masks.py); otherwise
the
backend's `backward` gets `bits=None` and draws it again: by a pass over the layer's whole mask
first with `spec.mask_pass` ('per_layer'), else in its own loops.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from realformer_jax.config import ConfigError
from realformer_jax.kernels import backends
from realformer_jax.kernels.plumbing import refusals
from realformer_jax.kernels.plumbing.spec import KernelSpec

# The checkpoint name of what a rematerialised layer's attention keeps for its backward (the
# output and the row log-sum-exp); model/encoder.py's remat policies save it.
SAVED_FOR_BACKWARD = 'attention_output_and_row_statistics'


def saved_for_backward_bytes(batch: int, seq_len: int, heads: int, head_dim: int, itemsize: int):
  """Bytes one rematerialised layer keeps under SAVED_FOR_BACKWARD: the output [B, L, H, K]
  (K the kernels' head size: Triton's padded one) in the compute dtype, and m and log l,
  float32 [B, H, L] each (BERT-Base, L = 65,536, bfloat16: 102 MiB a layer, 1.2 GiB for 12)."""
  return batch * seq_len * heads * (head_dim * itemsize + 2 * 4)


def _kernels(spec: KernelSpec):
  # The backend's record names its module, imported on first use (kernels/backends/).
  return backends.get(spec.backend).kernels()


# The kernels have no derivative of their own: the custom VJPs below are their first
# derivative. Differentiating those (grad of grad) reaches the kernel calls themselves, which
# are wrapped so that their VJP is a one-line refusal instead of an error from inside Pallas.
# (A custom VJP, not a custom JVP: jax drops custom JVP rules where it partially evaluates a
# scanned layer, but keeps custom VJPs.)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def kernel_forward(qkv, acc_in, bias, fparams, iparams, spec: KernelSpec):
  """The backend's forward kernel: (out, lse, acc_out, dropout bits)."""
  return _kernels(spec).forward(qkv, acc_in, bias, fparams, iparams, spec)


def _kernel_forward_fwd(qkv, acc_in, bias, fparams, iparams, spec):
  return kernel_forward(qkv, acc_in, bias, fparams, iparams, spec), None


def _refuse_higher_order(*_):
  raise ConfigError(refusals.HIGHER_ORDER)


kernel_forward.defvjp(_kernel_forward_fwd, _refuse_higher_order)


@functools.partial(jax.custom_vjp, nondiff_argnums=(10, 11))
def _kernel_backward(
  qkv, g_out, lse, delta, acc, g_acc, bias, fparams, iparams, bits, spec, rebuild
):
  return _kernels(spec).backward(
    qkv, g_out, lse, delta, acc, g_acc, bias, fparams, iparams, bits, spec, rebuild=rebuild
  )


def _kernel_backward_fwd(*args):
  return _kernel_backward(*args), None


_kernel_backward.defvjp(_kernel_backward_fwd, _refuse_higher_order)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def fused_attention(
  qkv: jax.Array,
  acc_in: Optional[jax.Array],
  bias: jax.Array,
  fparams: jax.Array,
  iparams: jax.Array,
  spec: KernelSpec,
) -> tuple[jax.Array, Optional[jax.Array]]:
  """(attention output [B, L, H, K] in qkv's dtype, carried sum [B, H, L, L] float32 or
  None)."""
  out, _, acc_out, _ = kernel_forward(qkv, acc_in, bias, fparams, iparams, spec)
  return out, acc_out


def _fused_fwd(qkv, acc_in, bias, fparams, iparams, spec):
  out, lse, acc_out, bits = kernel_forward(qkv, acc_in, bias, fparams, iparams, spec)
  if spec.for_remat:  # kept by the remat policy; the output the layer goes on with is the
    # named one, so the re-run's projection reads it too and the kernel is left unused there
    out, lse, bits = checkpoint_name((out, lse, bits), SAVED_FOR_BACKWARD)
  return (out, acc_out), (qkv, acc_out, bias, fparams, iparams, out, lse, bits)


def _fused_bwd(spec, residuals, cotangents):
  qkv, acc_out, bias, fparams, iparams, out, lse, bits = residuals
  g_out, g_acc = cotangents
  dqkv, g_acc_in, _ = attention_backward(
    qkv, acc_out, g_acc, bias, fparams, iparams, out, lse, bits, g_out, spec
  )
  return (
    dqkv,
    g_acc_in if spec.carry_in else None,
    jnp.zeros_like(bias),
    jnp.zeros_like(fparams),
    None,
  )


def attention_backward(
  qkv,
  acc,
  g_acc,
  bias,
  fparams,
  iparams,
  out,
  lse,
  bits,
  g_out,
  spec: KernelSpec,
  rebuild: bool = False,
):
  """(dqkv, d acc_{l-1} or None, acc_{l-1} = acc_l - s or None).

  `acc` is the layer's carried OUTPUT acc_l; with `rebuild` the kernel also writes acc_{l-1}
  (the layer below walks down with it). `bits`: the dropout mask the GPU forward stored (None:
  the kernels draw it again)."""
  g_out = g_out.astype(qkv.dtype)
  delta = jnp.einsum('blhk,blhk->bhl', out.astype(jnp.float32), g_out.astype(jnp.float32))
  if spec.carry_out and g_acc is None:
    g_acc = jnp.zeros_like(acc)
  return _kernel_backward(
    qkv, g_out, lse, delta, acc, g_acc, bias, fparams, iparams, bits, spec, rebuild
  )


fused_attention.defvjp(_fused_fwd, _fused_bwd)

"""Self-attention through a fused kernel: what score_path.FusedPath and its kin attend with.

Takes what the einsum path has at the point where it would form Q K^T — the fused projection's
q, k, v as one [B, L, 3, H, K] array (after RoPE), the incoming carried scores, the additive
padding bias, the score scale, the layer index and the dropout key — and returns what it
returns: the attention context [B, L, H, K] and the carried scores for the next layer (residual
attention). Called by the fused implementations in score_path.py, which say in which form
they carry the scores.

Under a device mesh the kernels run per shard (`jax.shard_map`): batch and heads are split as
the logical-axis rules split 'batch' and 'heads'; each shard gets the global offsets of its
rows, so that the dropout mask (a function of the global element position) is the einsum
path's whatever the sharding.
"""

from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from realformer_jax.kernels.dropout.dropout_bits import keep_threshold
from realformer_jax.kernels.plumbing.fused import fused_attention
from realformer_jax.kernels.plumbing.select import AttentionPlan
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.kernels.score_paths import carried


def kernel_inputs(
  bias_Bx1x1xL: jax.Array,
  scale: jax.Array,
  divisor: Optional[jax.Array],
  dropout_key: Optional[jax.Array],
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The kernels' dynamic arguments (spec.py), shared by the fused and the qk kernels:
  (bias [B, L] float32, scale [B] float32, fparams [B, 2] = (scale, 1 / divisor), the dropout
  key's two uint32 words)."""
  batch = bias_Bx1x1xL.shape[0]
  bias_BxL = bias_Bx1x1xL.reshape(batch, -1).astype(jnp.float32)
  scale_B = jnp.broadcast_to(jnp.reshape(scale, (-1,)), (batch,)).astype(jnp.float32)
  inv_div = 1.0 if divisor is None else 1.0 / jnp.asarray(divisor, jnp.float32)
  fparams = jnp.stack([scale_B, jnp.broadcast_to(inv_div, (batch,))], axis=-1)
  words = (
    jnp.zeros((2,), jnp.uint32)
    if dropout_key is None
    else jax.random.bits(dropout_key, (2,), jnp.uint32)
  )  # as dropout_bits.keep_mask
  return bias_BxL, scale_B, fparams, words


def plan_spec(
  plan: AttentionPlan, heads: int, dropout_key: Optional[jax.Array], keep_prob: float, **flags
) -> KernelSpec:
  """The KernelSpec of `plan` (its backend, tiles and interpret mode) over `heads` heads, with
  dropout where a key is given; `flags`: the KernelSpec fields of the call (carry_in,
  carry_out, sum_given, for_remat; plain attention where left out). Shared by the fused and the
  qk kernels."""
  return KernelSpec(
    plan.backend,
    **{'carry_in': False, 'carry_out': False, **flags},
    keep_threshold=0 if dropout_key is None else keep_threshold(keep_prob),
    generator=plan.dropout_generator,
    heads_total=heads,
    block_q=plan.block_q,
    block_k=plan.block_k,
    block_bwd=plan.block_bwd,
    interpret=plan.interpret,
  )


def fused_self_attention(
  plan: AttentionPlan,
  form: str,
  qkv_BxLx3xHxK: jax.Array,
  scores_in: tuple,
  bias_Bx1x1xL: jax.Array,
  scale: jax.Array,
  divisor: Optional[jax.Array],
  dropout_key: Optional[jax.Array],
  keep_prob: float,
  carry_out: bool,
) -> tuple[jax.Array, tuple]:
  """(context [B, L, H, K], the carried arrays for the next layer: () without carry_out).

  `form` is how the caller (a score_path.ScorePath) carries scores: 'sum' — `scores_in` is ()
  at a first layer or (the float32 [B, H, L, L] sum,), and the op saves the sum it writes, as
  autodiff would; 'pair' — (sum, shadow), carried.carried_attention; 'top_down' — (acc_l,
  shadow), carried.top_down_attention. The result has the same form."""
  batch, _, _, heads, head_dim = qkv_BxLx3xHxK.shape
  bias_BxL, scale_B, fparams, words = kernel_inputs(bias_Bx1x1xL, scale, divisor, dropout_key)
  backend = plan.kernels
  if not backend.fused:  # a call backend (cuDNN): post / pre attention in one call
    q, k, v = (qkv_BxLx3xHxK[:, :, part] for part in range(3))
    return backend.attend()(q, k, v, bias_Bx1x1xL, scale_B), ()
  spec = plan_spec(
    plan,
    heads,
    dropout_key,
    keep_prob,
    carry_in=carry_out and bool(scores_in),
    carry_out=carry_out,
    sum_given=form == 'top_down',
    for_remat=plan.rematerialised and not carry_out,
    keeps_mask=plan.remat_keeps_masks and not carry_out,
    mask_pass=plan.remat_mask_pass and not carry_out,
  )
  # The backend's tiles for this device and length (Triton: plain attention's forward).
  fit_blocks = getattr(backend.kernels(), 'fit_blocks', None)
  if fit_blocks is not None:
    spec = fit_blocks(spec, qkv_BxLx3xHxK.shape[1])
  if not carry_out:
    scores_in = ()
  qkv = qkv_BxLx3xHxK
  padded = backend.head_dim(head_dim)
  if padded != head_dim:  # zero features change no score; their outputs are sliced off
    qkv = jnp.pad(qkv, [(0, 0)] * 4 + [(0, padded - head_dim)])

  op = _OPS['sum' if not carry_out else form]
  outputs = 1 + (0 if not carry_out else 1 if form == 'sum' else 2)
  context, *scores_out = _sharded(
    functools.partial(op, spec=spec), outputs, qkv, scores_in, bias_BxL, fparams, words
  )
  return context[..., :head_dim], tuple(scores_out)


def _plain(qkv, scores, bias, fparams, iparams, spec):
  out, acc = fused_attention(qkv, scores[0] if scores else None, bias, fparams, iparams, spec)
  return (out,) if acc is None else (out, acc)


def _pair(qkv, scores, bias, fparams, iparams, spec):
  return carried.carried_attention(qkv, *scores, bias, fparams, iparams, spec)


def _top_down(qkv, scores, bias, fparams, iparams, spec):
  return carried.top_down_attention(qkv, *scores, bias, fparams, iparams, spec)


_OPS = {'sum': _plain, 'pair': _pair, 'top_down': _top_down}


def _mesh_axes(logical: str):
  """Mesh axes the active logical rules give `logical` (None, a name or a tuple)."""
  return nn.logical_to_mesh_axes((logical,))[0]


def _axis_size(mesh, axes) -> int:
  if axes is None:
    return 1
  return int(np.prod([mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes)]))


def _sharded(op, outputs: int, qkv, scores_in, bias, fparams, words):
  """op(qkv, scores_in, bias, fparams, iparams) -> (context, *scores) (`outputs` arrays), per
  shard under a mesh; iparams = (key words, batch offset, head offset) of the shard."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    iparams = jnp.concatenate([words, jnp.zeros((2,), jnp.uint32)])
    return op(qkv, scores_in, bias, fparams, iparams)
  batch_axes, head_axes = _mesh_axes('batch'), _mesh_axes('heads')
  batch, _, _, heads, _ = qkv.shape
  local_batch = batch // _axis_size(mesh, batch_axes)
  local_heads = heads // _axis_size(mesh, head_axes)
  rows = P(batch_axes, None, head_axes, None)
  scores = P(batch_axes, head_axes, None, None)

  def per_shard(qkv, scores_in, bias, fparams, words):
    b0 = (
      jnp.zeros((), jnp.uint32)
      if batch_axes is None
      else (jax.lax.axis_index(batch_axes).astype(jnp.uint32) * local_batch)
    )
    h0 = (
      jnp.zeros((), jnp.uint32)
      if head_axes is None
      else (jax.lax.axis_index(head_axes).astype(jnp.uint32) * local_heads)
    )
    return tuple(op(qkv, scores_in, bias, fparams, jnp.concatenate([words, jnp.stack([b0, h0])])))

  return jax.shard_map(
    per_shard,
    mesh=mesh,
    in_specs=(
      P(batch_axes, None, None, head_axes, None),
      (scores,) * len(scores_in),
      P(batch_axes, None),
      P(batch_axes, None),
      P(),
    ),
    out_specs=(rows,) + (scores,) * (outputs - 1),
    check_vma=False,
  )(qkv, scores_in, bias, fparams, words)

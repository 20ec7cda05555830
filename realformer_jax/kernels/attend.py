"""Self-attention through a fused kernel: the hook ResidualSelfAttention calls.

Takes what the einsum path has at the point where it would form Q K^T — q, k, v [B, L, H, K]
after RoPE, the incoming carried sum, the additive padding bias, the score scale, the layer
index and the dropout key — and returns what it returns: the attention context [B, L, H, K]
and the carried sum for the next layer (residual attention) or None.

Under a device mesh the kernels run per shard (`jax.shard_map`): batch and heads are split as
the logical-axis rules split 'batch' and 'heads'; each shard gets the global offsets of its
rows, so that the dropout mask (a function of the global element position) is the einsum
path's whatever the sharding.
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from realformer_jax.dropout_bits import keep_threshold
from realformer_jax.kernels.fused import fused_attention
from realformer_jax.kernels.select import AttentionPlan
from realformer_jax.kernels.spec import KernelSpec, padded_head_dim


def fused_self_attention(plan: AttentionPlan, q: jax.Array, k: jax.Array, v: jax.Array,
                         prev_scores: Optional[jax.Array], bias_Bx1x1xL: jax.Array,
                         scale: jax.Array, divisor: Optional[jax.Array],
                         dropout_key: Optional[jax.Array], keep_prob: float,
                         carry_out: bool) -> tuple[jax.Array, Optional[jax.Array]]:
  """(context [B, L, H, K], acc_l [B, H, L, L] float32 or None); see the module docstring."""
  batch, _, heads, _ = q.shape
  bias_BxL = bias_Bx1x1xL.reshape(batch, -1).astype(jnp.float32)
  scale_B = jnp.broadcast_to(jnp.reshape(scale, (-1,)), (batch,)).astype(jnp.float32)
  if plan.path == 'cudnn':
    from realformer_jax.kernels.cudnn import cudnn_attention  # pylint: disable=import-outside-toplevel
    return cudnn_attention(q, k, v, bias_Bx1x1xL, scale_B), None
  inv_div = 1.0 if divisor is None else 1.0 / jnp.asarray(divisor, jnp.float32)
  fparams = jnp.stack([scale_B, jnp.broadcast_to(inv_div, (batch,))], axis=-1)
  words = (jnp.zeros((2,), jnp.uint32) if dropout_key is None
           else jax.random.bits(dropout_key, (2,), jnp.uint32))  # as dropout_bits.keep_mask
  spec = KernelSpec(plan.backend, carry_in=prev_scores is not None, carry_out=carry_out,
                    keep_threshold=0 if dropout_key is None else keep_threshold(keep_prob),
                    heads_total=heads, block_q=plan.block_q, block_k=plan.block_k,
                    block_bwd=plan.block_bwd, interpret=plan.interpret)
  head_dim = q.shape[-1]
  padded = padded_head_dim(head_dim) if plan.backend == 'triton' else head_dim
  if padded != head_dim:  # zero features change no score; their outputs are sliced off
    pad = [(0, 0)] * 3 + [(0, padded - head_dim)]
    q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
  context, acc = _sharded(spec, q, k, v, prev_scores, bias_BxL, fparams, words)
  return context[..., :head_dim], acc


def _mesh_axes(logical: str):
  """Mesh axes the active logical rules give `logical` (None, a name or a tuple)."""
  return nn.logical_to_mesh_axes((logical,))[0]


def _axis_size(mesh, axes) -> int:
  if axes is None:
    return 1
  return int(np.prod([mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes)]))


def _sharded(spec, q, k, v, acc_in, bias, fparams, words):
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    offsets = jnp.zeros((2,), jnp.uint32)
    return fused_attention(q, k, v, acc_in, bias, fparams, jnp.concatenate([words, offsets]),
                           spec)
  batch_axes, head_axes = _mesh_axes('batch'), _mesh_axes('heads')
  batch, _, heads, _ = q.shape
  local_batch = batch // _axis_size(mesh, batch_axes)
  local_heads = heads // _axis_size(mesh, head_axes)
  rows = P(batch_axes, None, head_axes, None)
  scores = P(batch_axes, head_axes, None, None)

  def per_shard(q, k, v, acc_in, bias, fparams, words):
    b0 = jnp.zeros((), jnp.uint32) if batch_axes is None else (
        jax.lax.axis_index(batch_axes).astype(jnp.uint32) * local_batch)
    h0 = jnp.zeros((), jnp.uint32) if head_axes is None else (
        jax.lax.axis_index(head_axes).astype(jnp.uint32) * local_heads)
    iparams = jnp.concatenate([words, jnp.stack([b0, h0])])
    return fused_attention(q, k, v, acc_in, bias, fparams, iparams, spec)

  return jax.shard_map(
      per_shard, mesh=mesh,
      in_specs=(rows, rows, rows, None if acc_in is None else scores, P(batch_axes, None),
                P(batch_axes, None), P()),
      out_specs=(rows, scores if spec.carry_out else None), check_vma=False,
  )(q, k, v, acc_in, bias, fparams, words)

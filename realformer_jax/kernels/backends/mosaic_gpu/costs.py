"""What the Hopper qk kernels cost, stated for the estimator from the compiled program.

A Triton kernel carries its cost in its custom call (`metadata`, read by aot/kernel_work.py);
Mosaic GPU's lowering drops it (jax 0.10.2, pallas/mosaic_gpu/pallas_call_registration.py:
`del metadata, name  # TODO(sharadmv): Add metadata to HLO.`). So the statement is made here,
from what the call shows: its named scope (attention._named) in the op name and its operand
shapes, and passed as `roofline.estimate(..., costs_on_behalf=stated_cost)`.

The qk forward does what Triton's does (q and k of l + 1 layers reloaded per tile), on this
backend's tiles (plan_tiles); the dS kernel is Triton's with the keys resident in shared
memory (qk_attention.py: each program loads its keys once, only the q tiles stream).
"""

from __future__ import annotations

import re
from typing import Optional

import jax
import jax.numpy as jnp

from realformer_jax.kernels.backends.mosaic_gpu import plan_tiles
from realformer_jax.kernels.dropout.dropout_bits import DRAWS_PER_HASH, keep_threshold
from realformer_jax.kernels.plumbing.spec import KernelSpec

FORWARD, SCORE_GRADIENT = 'mosaic_gpu_qk_attention_fwd', 'mosaic_gpu_qk_attention_ds'
_SHAPE = re.compile(r'(\w+)\[([\d,]*)\]')


def _operands(ins) -> list[tuple[str, tuple[int, ...]]]:
  layouts = ins.attribute('operand_layout_constraints') or ''
  return [(t, tuple(int(d) for d in dims.split(',') if d)) for t, dims in _SHAPE.findall(layouts)]


def _stack(flat: tuple[int, ...], v: tuple[int, ...], dtype: str) -> jax.ShapeDtypeStruct:
  """The [2, N, B, L, H, K] stack of the kernels' flattened [2 N B, L, H, K] operand."""
  batch = v[0]
  layers = flat[0] // (2 * batch)
  return jax.ShapeDtypeStruct((2, layers, *v), jnp.dtype(dtype))


def stated_cost(ins) -> Optional[dict]:
  """roofline.estimate(costs_on_behalf=...): the stated fields (kernel_work.STATED_FIELDS) of
  a Hopper qk forward or dS call, as Triton's kernels state theirs; None for any other
  instruction. The dropout is taken as on (the suite's rows: dropout 0.1, keep 0.9)."""
  op_name = ins.attribute('metadata') or ''
  kernel = next((k for k in (FORWARD, SCORE_GRADIENT) if k in op_name), None)
  operands = _operands(ins)
  if kernel is None or len(operands) < 2:
    return None
  (dtype, flat), (_, v) = operands[0], operands[1]
  dtype = {'bf16': 'bfloat16', 'f16': 'float16'}.get(dtype, dtype)
  stack = _stack(flat, v, dtype)
  seq_len = v[1]
  tiles = plan_tiles(seq_len, interpret=False)
  if tiles is None:
    return None
  spec = KernelSpec('mosaic_gpu', False, False, keep_threshold(0.9), v[2], *tiles)
  batch, _, heads, _ = v
  # Triton's kernels through their backend record, as qk_attention.backward reaches them
  from realformer_jax.kernels import backends  # pylint: disable=import-outside-toplevel

  triton = backends.get('triton')
  triton_qk, hash_ops = triton.qk_kernels(), triton.kernels().HASH_OPS_PER_ELEMENT
  if kernel == FORWARD:
    stated = triton_qk._forward_cost(spec, stack)  # pylint: disable=protected-access
    elements = batch * heads * seq_len * seq_len
  else:
    columns = ins.shapes[0].dims[2]  # dS^T [B, H, columns, L]
    stated = triton_qk._score_gradient_cost(spec, stack, columns, resident_keys=True)  # pylint: disable=protected-access
    elements = batch * heads * seq_len * columns
  stated = {key: float(value) for key, value in stated.items()}
  # attention.keep hashes every element's whole Threefry word (Triton shares one per
  # DRAWS_PER_HASH elements)
  stated['int_ops'] += hash_ops['threefry'] * (DRAWS_PER_HASH - 1) * elements
  return stated

"""Which branch of a `lax.switch` a step executes, for the switches the project's kernels make,
so that the roofline costs the branches that run instead of the dearest one every time.

An HLO `conditional` picks its branch at run time from an index the program computes (for the
qk backward: a searchsorted inside the layer loop), which the optimized HLO text cannot
evaluate. The rule that computes it is in the code, so it is read from there:

- the `residual_carry='qk'` backward (kernels/backends/triton/qk_attention.py, `backward`): its
  dS GEMMs run over a static bucket of slots, layer l takes the first bucket of
  `slot_buckets(N)` that is >= l + 1. A rolled layer scan runs the one conditional once a layer,
  so over a step branch b runs for the layers whose bucket is b: `layer_shares(N)`. At N = 12 the
  buckets are 3, 6, 9 and 12 slots, three layers each: the GEMMs multiply 90 slot-layers a step,
  not the 144 of the dearest branch counted every layer.
- the ring's fused block backward (the same file, `block_backward`; score_paths/ring_attention.py):
  the same switch over the same buckets, once per block of every layer, handed the ring's float32
  gradients of the stacked queries and keys, [N, B, L, H, K] each, under the ring's name scope.
  Every layer attends the same number of blocks, so its branches take the same layer shares.

`branch_shares(conditional, computation)` returns each branch's share of the conditional's
executions, or None for a conditional it does not know (the roofline then counts the dearest
branch and says so).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from realformer_jax.aot.hlo_text import Computation, Instruction
from realformer_jax.kernels.score_paths.ring_attention import SCOPE

# The stacked queries and keys of residual_carry='qk' (kernels/score_paths/qk_carry.py: [2, N, B,
# L, H, K]):
# how a conditional shows that it is the qk backward's switch and how deep its stack is.
STACK_RANK, STACK_PARTS = 6, 2
# The ring's gradients of one part of that stack (qk_attention.block_backward: [N, B, L, H, K]).
RING_STACK_RANK = 5


def _slot_buckets(layers: int) -> tuple[int, ...]:
  # The kernels' own rule, from the module the Triton record names: read, not restated.
  from realformer_jax.kernels import backends  # pylint: disable=import-outside-toplevel

  return tuple(backends.get('triton').qk_kernels().slot_buckets(layers))


def layer_shares(layers: int) -> tuple[float, ...]:
  """Share of a step's layers whose backward takes each slot bucket (branch order): layer l takes
  the first bucket >= l + 1, the kernel's `searchsorted(buckets, l + 1)`."""
  buckets = _slot_buckets(layers)
  taken = np.searchsorted(np.asarray(buckets), np.arange(layers) + 1)
  return tuple(float(np.sum(taken == b)) / layers for b in range(len(buckets)))


def branch_shares(
  conditional: Instruction, computation: Computation
) -> Optional[tuple[float, ...]]:
  """Each branch's share of the conditional's executions, or None where the rule is not known:
  the qk backward's slot-bucket switch (a conditional handed the [2, N, B, L, H, K] stack, with
  one branch per bucket of slot_buckets(N), in bucket order as `lax.switch` lists them)."""
  layers = stack_layers(conditional, computation)
  if layers is None or len(conditional.called()) < 2:
    return None
  shares = layer_shares(layers)
  return shares if len(shares) == len(conditional.called()) else None


def stack_layers(conditional: Instruction, computation: Computation) -> Optional[int]:
  """N of the [2, N, B, L, H, K] stack among the arrays the conditional hands its branches, or of
  the [N, B, L, H, K] stack gradients that a conditional of the ring returns."""
  for name in conditional.operands[1:]:  # operand 0 is the branch index
    operand = computation.by_name.get(name)
    for array in operand.shapes if operand is not None else ():
      if len(array.dims) == STACK_RANK and array.dims[0] == STACK_PARTS:
        return array.dims[1]
  if SCOPE in conditional.op_name:
    for array in conditional.shapes:
      if len(array.dims) == RING_STACK_RANK:
        return array.dims[0]
  return None

"""The carried sum rebuilt from the stacked queries and keys: the einsum form of
`model.residual_carry='qk'` (the reference its kernels are tested against, and its CPU path).

Residual attention hands layer l the sum of every layer's scaled scores (model/attention.py):

    acc_l = sum_{i<=l} s_i,   s_i = scale * Q_i K_i^T   (per batch row and head)

where Q_i, K_i [L, K] are layer i's queries and keys after the rotary rotation (rope rotates
q and k before the product, so the rotated vectors are the ones kept) and `scale` is the score
scale of the row's sequence: 1/sqrt(K), 1, or entropy-invariant log_b(n)/sqrt(K) with n the
sequence's real keys. That scale is one value for every layer (the stack's shared
block.LayerInputs), but it may as well differ per layer: a sum of products is one product
over the concatenated features,

    acc_l = [scale Q_0, ..., scale Q_l] [K_0, ..., K_l]^T      ([L, (l+1) K] x [(l+1) K, L]),

because (A B^T)_{qv} = sum_f A_{qf} B_{vf} splits over any partition of the features f. So
acc_l is a function of the per-layer queries and keys: carry those, [N, B, L, H, K] each,
O(L) memory, instead of the [B, H, L, L] sum. Everything after the sum stays as it is: the
softmax sees z_l = acc_l / (l + 1) (running mean) or acc_l, plus the padding bias added after
(never part of the sum, so it is not folded into the queries); dropout acts on the
probabilities. The carry holds no mask, no divisor and no dropout, as the carried sum does not.

`stack` below is the carry: [2, N, B, L, H, K] in the compute dtype, part 0 the queries, part 1
the keys; layer i writes slot i and layer l reads slots 0..l (later slots hold zeros going up
and the later layers' finite values when a backward pass re-runs layer l on the final stack;
they are multiplied by 0 here and never loaded by the kernels).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def layer_scores(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array, scale: jax.Array) -> jax.Array:
  """s = scale Q K^T, float32 [B, H, L, L], as the einsum path forms one layer's scores."""
  logits = jnp.einsum('bqhk,bvhk->bhqv', q_BxLxHxK, k_BxLxHxK, preferred_element_type=jnp.float32)
  return logits * scale


def summed_scores(stack: jax.Array, upto: jax.Array, scale: jax.Array, dtype) -> jax.Array:
  """acc = sum_{i < upto} scale Q_i K_i^T [B, H, L, L] float32, as ONE product over the
  (upto x K) features of the stacked queries and keys (zero where upto is 0). `dtype`: the
  compute dtype the einsum path multiplies in (the stack's own, or float32 holding its
  values)."""
  layers = stack.shape[1]
  used = (jnp.arange(layers) < upto).astype(stack.dtype)[:, None, None, None, None]
  # A product with 0, not jnp.where: with the layers unrolled (scan_layers=False) `upto` is a
  # constant and XLA's optimised CPU program gave all-nan for where(used, stack, 0) over the
  # zero-initialised stack its dynamic-update-slices wrote (tests/kernels/test_qk_carry.py runs that
  # case with the optimisations on). A product is exact for the finite values a slot holds.
  q_N, k_N = ((stack[part] * used).astype(dtype) for part in range(2))
  logits = jnp.einsum('nbqhk,nbvhk->bhqv', q_N, k_N, preferred_element_type=jnp.float32)
  return logits * scale

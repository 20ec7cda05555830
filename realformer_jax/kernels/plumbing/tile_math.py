"""The arithmetic of one [block_q, block_k] attention tile, shared by the GPU and TPU kernels.

Pure jnp on values already loaded from their refs, so the Triton and Mosaic kernels differ only
in how they move tiles (loops over refs vs grid steps with VMEM scratch), not in what they
compute. Notation as in attention.py: s = scale Q K^T, acc = acc_in + s (residual attention)
or s, z = acc * inv_div + bias (inv_div = 1 / (l + 1) with the running mean, else 1),
p = softmax(z), dropout keeps with probability keep_prob and divides by it.
Row statistics are [rows, 1] arrays (m: running max, l: running sum of exp). The backward gets
the log-sum-exp as the pair (m, log l), never as their sum: in a row whose every key is padding
m is ~-1e9, where float32 steps by 64, and m + log l would lose log l (p would come back as 1
instead of 1 / L, the row's gradient L times too large).
Base 2 (the Triton kernels, whose `ex2.approx` is one instruction where jnp.exp is libdevice's
~8): the kernel folds log2 e into its scale, divisor and bias, so z and m are z log2 e and
m log2 e, `exp` is 2^x and `log` log2: p = 2^(z - m), and its statistics are (m log2 e,
log2 l), the same log-sum-exp in base-2 units, which its own backward reads. A kernel that
takes natural statistics from elsewhere converts them once (`to_base2`: exact where it matters,
below); the other way is never taken: m log2 e -> natural -> base 2 is not exact where m is
~-1.4e9 (an all-padding row, float32 steps by 128 there: p would be off by up to 2^128).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax

_TRANS_B = (((1,), (1,)), ((), ()))  # x [m, d] . y [n, d]^T
_TRANS_A = (((0,), (0,)), ((), ()))  # x [d, m]^T . y [d, n]


def dot_t(x: jax.Array, y: jax.Array) -> jax.Array:
  """x y^T in float32."""
  return lax.dot_general(x, y, _TRANS_B, preferred_element_type=jnp.float32)


def t_dot(x: jax.Array, y: jax.Array) -> jax.Array:
  """x^T y in float32."""
  return lax.dot_general(x, y, _TRANS_A, preferred_element_type=jnp.float32)


def dot(x: jax.Array, y: jax.Array) -> jax.Array:
  return jnp.dot(x, y, preferred_element_type=jnp.float32)


def scores(q: jax.Array, k: jax.Array, scale: jax.Array) -> jax.Array:
  return dot_t(q, k) * scale


def softmax_input(acc: jax.Array, inv_div: jax.Array, bias_row: jax.Array) -> jax.Array:
  return acc * inv_div + bias_row


def drop(x: jax.Array, keep: Optional[jax.Array], keep_prob: float) -> jax.Array:
  if keep is None:
    return x
  return jnp.where(keep, x / keep_prob, jnp.zeros_like(x))


LOG2E = math.log2(math.e)

Elementwise = Callable[[jax.Array], jax.Array]  # exp / log of the kernel's base, float32


def to_base2(lse: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
  """Natural statistics (m, log l) in a base-2 kernel's units: (m log2 e, log l log2 e). Exact
  where it must be: in an all-padding row the natural m is the bias itself, and the base-2
  kernel's z there is that bias times log2 e, rounded the same way, so z - m is 0 again."""
  m, log_l = lse
  return m * LOG2E, log_l * LOG2E


def initial_state(rows: int, head_dim: int):
  return (
    jnp.full((rows, 1), -jnp.inf, jnp.float32),
    jnp.zeros((rows, 1), jnp.float32),
    jnp.zeros((rows, head_dim), jnp.float32),
  )


def online_softmax_step(
  state,
  z: jax.Array,
  v: jax.Array,
  keep: Optional[jax.Array],
  keep_prob: float,
  exp: Elementwise = jnp.exp,
):
  """One key block of the online softmax: (m, l, o) -> updated, o unnormalised. `exp`: of the
  kernel's base, z's units (module docstring)."""
  m, l, o = state
  m_new = jnp.maximum(m, jnp.max(z, axis=-1, keepdims=True))
  alpha = exp(m - m_new)
  p = exp(z - m_new)
  l_new = alpha * l + jnp.sum(p, axis=-1, keepdims=True)
  o_new = alpha * o + dot(drop(p, keep, keep_prob).astype(v.dtype), v)
  return m_new, l_new, o_new


def finish(state, log: Elementwise = jnp.log):
  """(normalised output [rows, K] float32, (m, log l) [rows, 1] each: the log-sum-exp, in the
  units of `log`, the kernel's base)."""
  m, l, o = state
  return o / l, (m, log(l))


def score_gradient(
  z: jax.Array,
  lse: tuple[jax.Array, jax.Array],
  delta: jax.Array,
  do: jax.Array,
  v: jax.Array,
  keep: Optional[jax.Array],
  keep_prob: float,
  exp: Elementwise = jnp.exp,
):
  """(dropped probabilities in the compute dtype, d loss / d z) for one tile.

  p = exp(z - m - log l) with lse = (m, log l); out = drop(p) V, so dP = drop(dO V^T) and
  dz = p (dP - delta) with delta = rowsum(dO * out) (= rowsum(dP * p), dropout included).
  `exp`: of the kernel's base; z and lse in its units (module docstring). dz is d loss / d z
  of the natural z in either base (p is the same)."""
  m, log_l = lse
  p = exp(z - m - log_l)  # (z - m) first: exact where m is a padding row's ~-1e9
  p_dropped = drop(p, keep, keep_prob).astype(v.dtype)
  dp = drop(dot_t(do, v), keep, keep_prob)
  return p_dropped, p * (dp - delta)


def summed_scores(q_of, k_of, layers: jax.Array, scale: jax.Array, shape: tuple[int, int]):
  """acc = scale sum_{i < layers} q_i k_i^T for one [rows, cols] tile of the queries and keys
  of stacked layers (`q_of(i)`, `k_of(i)` load layer i's tiles): residual_carry='qk'
  (qk_reference.py). `layers` is traced, a dynamic loop bound.

  Every layer's product goes into ONE float32 accumulator and the sum is scaled once, after
  the loop, as qk_reference.summed_scores scales its one product over the stacked features:
  on Hopper the loop is then a chain of wgmma into one accumulator, the next layer's product
  issued before the last one is done (no `wgmma.wait_group 0` and no scale / add on the CUDA
  cores per layer; tests/kernels/test_qk_carry.py reads the PTX). Where the scale is a power of
  two (1/8 at K = 64, 1 with t5) scaling once is exact: it commutes with every float32
  rounding of the sum. Any other scale (entropy-invariant) rounds the scaled sum once
  (relative 2^-24) where scaling each product rounded l + 1 times: the same bound as the
  reference's."""

  def add(i, acc):
    return acc + dot_t(q_of(i), k_of(i))

  return lax.fori_loop(0, layers, add, jnp.zeros(shape, jnp.float32)) * scale

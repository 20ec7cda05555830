"""The dropout hash's integer work, counted from the code the kernels run (aot/hash_work.py):
what the estimator charges a fused kernel's integer ops at. No compiler: a jaxpr."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realformer_jax.aot import hash_work


def test_the_8_bit_threefry_draw_counts_about_13_integer_ops_per_decision_as_compiled():
  # 20 rounds of (add, rotate, xor) and five key injections per hash of eight decisions, the
  # counters, the byte pick and the compare: ~17.4 ops as written, ~12.4 once every rotation
  # is one funnel shift (shf.l.wrap: what ptxas makes of (x << r) | (x >> (32 - r))).
  counts = hash_work.per_decision()
  hash_ops = 2 + 20 * 3 + 5 * 3  # per hash, rotations as one op: 77
  draws = (2 + 3 + 3 + 2) / 4  # per decision: (and, lt), (shift, and, lt) x 2, (shift, lt)
  assert counts.compiled == pytest.approx(hash_ops / 8 + 2 / 8 + draws)  # + the two counters
  assert counts.written == pytest.approx(counts.compiled + 20 * 2 / 8)  # two shifts a rotation
  assert 0.70 < counts.compiled_share < 0.72
  assert hash_work.kernel_int_ops(1000.0) == pytest.approx(1000.0 * counts.compiled_share)


def test_a_rotation_is_one_op_only_when_both_shifts_feed_nothing_else():
  x = jnp.zeros((8, 8), jnp.uint32)

  def rotation(x):
    return (x << np.uint32(13)) | (x >> np.uint32(19))

  def shared(x):
    left = x << np.uint32(13)
    return (left | (x >> np.uint32(19))) + left  # the left shift is also used: not folded

  count = lambda f: hash_work.count_jaxpr(jax.make_jaxpr(f)(x).jaxpr, per_element_of=64)  # noqa: E731
  assert count(rotation) == hash_work.Counts(written=3.0, compiled=1.0)
  assert count(shared) == hash_work.Counts(written=4.0, compiled=4.0)

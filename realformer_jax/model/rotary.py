"""Rotary position embeddings (RoPE), the RoFormer form (Su et al. 2021).

Each head's query and key vectors are rotated pair by pair: features (2i, 2i+1) of the vector at
position m turn by the angle m * theta_i, theta_i = base^(-2i / d_head). A rotation keeps the
norm, and R(m)^T R(n) = R(n - m), so q_m . k_n depends on the positions only through n - m:
attention sees relative offsets, and nothing limits the length it can be evaluated at (there is
no position table). Angles are computed in float32 from integer positions, then the rotated
vectors are cast back to the compute dtype.
"""

import jax
import jax.numpy as jnp


def rotary_angles(length: int, head_dim: int, base: float, offset=0) -> jax.Array:
  """m * theta_i for m = offset .. offset + length - 1, float32 [length, head_dim // 2]."""
  if head_dim % 2:
    raise ValueError(f'rotary embeddings rotate feature pairs: head_dim={head_dim} is odd')
  inverse_frequency = base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
  positions = jnp.arange(length, dtype=jnp.float32) + jnp.asarray(offset, jnp.float32)
  return positions[:, None] * inverse_frequency[None, :]


def apply_rotary(x_BxLxHxK: jax.Array, base: float, offset=0) -> jax.Array:
  """x with the pairs (2i, 2i+1) of position m rotated by m * theta_i; the sequence starts at
  position `offset` (an int or a traced scalar: incremental decoding)."""
  _, length, _, head_dim = x_BxLxHxK.shape
  angles_LxK2 = rotary_angles(length, head_dim, base, offset)
  cos = jnp.cos(angles_LxK2)[None, :, None, :]
  sin = jnp.sin(angles_LxK2)[None, :, None, :]
  x = x_BxLxHxK.astype(jnp.float32)
  even, odd = x[..., 0::2], x[..., 1::2]
  rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
  return rotated.reshape(x.shape).astype(x_BxLxHxK.dtype)

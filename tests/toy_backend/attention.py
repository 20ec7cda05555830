"""The toy backend's kernels: forward / backward of kernels/backends/registry.py's contract,
written with whole-array einsums instead of tiles (float32 inside, qkv's dtype out)."""

import jax
import jax.numpy as jnp


def _scores(qkv, fparams):
  q, k, v = (qkv[:, :, part].astype(jnp.float32) for part in range(3))
  scale_B, inv_div_B = fparams[:, 0], fparams[:, 1]
  s_BxHxLxL = scale_B[:, None, None, None] * jnp.einsum('blhk,bmhk->bhlm', q, k)
  return q, k, v, s_BxHxLxL, scale_B[:, None, None, None], inv_div_B[:, None, None, None]


def forward(qkv, acc_in, bias, fparams, iparams, spec):
  """(out [B, L, H, K], lse [B, H, L], acc_out or None, bits = None)."""
  del iparams  # the dropout words: this backend has no dropout
  assert not spec.dropout, 'the toy backend has no dropout (its record says dropout=False)'
  _, _, v, s, _, inv_div = _scores(qkv, fparams)
  if spec.sum_given:  # acc_in is already this layer's acc_l
    acc = acc_in
  else:
    acc = acc_in + s if spec.carry_in else s
  z = acc * inv_div + bias[:, None, None, :]
  lse = jax.nn.logsumexp(z, axis=-1)
  p = jnp.exp(z - lse[..., None])
  out = jnp.einsum('bhlm,bmhk->blhk', p, v).astype(qkv.dtype)
  writes_sum = spec.carry_out and not spec.sum_given
  return out, lse, acc if writes_sum else None, None


def backward(qkv, g_out, lse, delta, acc, g_acc, bias, fparams, iparams, bits, spec, rebuild=False):
  """(dqkv [B, L, 3, H, K], g_acc_in or None, acc_in = acc_l - s or None)."""
  del iparams, bits
  q, k, v, s, scale, inv_div = _scores(qkv, fparams)
  z = (acc if spec.carry_out else s) * inv_div + bias[:, None, None, :]
  p = jnp.exp(z - lse[..., None])
  do = g_out.astype(jnp.float32)
  dv = jnp.einsum('bhlm,blhk->bmhk', p, do)
  dz = p * (jnp.einsum('blhk,bmhk->bhlm', do, v) - delta[..., None])
  g_acc_in = g_acc + dz * inv_div if spec.carry_out else None
  ds = g_acc_in if spec.carry_out else dz * inv_div  # acc_l = acc_{l-1} + s
  dq = jnp.einsum('bhlm,bmhk->blhk', ds * scale, k)
  dk = jnp.einsum('bhlm,blhk->bmhk', ds * scale, q)
  dqkv = jnp.stack([dq, dk, dv], axis=2).astype(qkv.dtype)
  return dqkv, g_acc_in, acc - s if rebuild else None

"""An independent NumPy model of the RealFormer MLM forward (docs/design.md §1), written from the
paper's official TF1 modeling.py semantics and sharing nothing with the Flax code but the
weights: what tests/model/test_residual_attention_reference.py and test_rotary.py compare with.
"""

import math

import numpy as np

from realformer_jax.model import params as params_lib

_erf = np.vectorize(math.erf)


def _layer_norm(x, p, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p['scale'] + p['bias']


def _gelu(x):
  return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _rotate_pairs(x_BxHxLxK, base):
  """RoPE as complex multiplication: pair (2i, 2i+1) at position m times exp(i m base^(-2i/K))."""
  length, dim = x_BxHxLxK.shape[-2:]
  pairs = x_BxHxLxK[..., 0::2] + 1j * x_BxHxLxK[..., 1::2]
  angles = np.arange(length)[:, None] * base ** (-np.arange(0, dim, 2) / dim)[None, :]
  turned = pairs * np.exp(1j * angles)
  return np.stack([turned.real, turned.imag], axis=-1).reshape(x_BxHxLxK.shape)


def reference_mlm_logits(params, cfg, ids, mask, segments, positions):
  """Also covers position_embedding (learned / rope / none) and attention_scale (standard /
  entropy_invariant: log_base(real keys) / sqrt(d))."""
  p = params_lib.unstack_layers(params)
  p = {k: np.asarray(v) if not isinstance(v, dict) else v for k, v in p.items()}
  to_np = lambda tree: {
    k: to_np(v) if isinstance(v, dict) else np.asarray(v, np.float64) for k, v in tree.items()
  }
  p = to_np(p)
  ids, mask, segments = map(np.asarray, (ids, mask, segments))
  emb = p['encoder']['embeddings']
  length = ids.shape[1]
  x = emb['word']['embedding'][ids] + emb['segment']['embedding'][segments]
  if cfg.position_embedding == 'learned':
    x = x + emb['position']['embedding'][:length][None]
  x = _layer_norm(x, emb['norm'], cfg.norm_epsilon)
  dh = cfg.head_dim
  scale = np.full((ids.shape[0], 1, 1, 1), 1.0 / math.sqrt(dh))
  if cfg.attention_scale == 'entropy_invariant':
    real_keys = mask.sum(-1)[:, None, None, None]
    scale = scale * np.log(real_keys) / np.log(cfg.entropy_base_len)
  acc = None
  for l in range(cfg.num_layers):
    lp = p['encoder'][f'layers_{l}']
    w = lp['attention']['qkv']['kernel']  # [D, 3, H, K]
    b = lp['attention']['qkv']['bias']  # [3, H, K]
    q = np.einsum('bld,dhk->bhlk', x, w[:, 0]) + b[0][None, :, None, :]
    k = np.einsum('bld,dhk->bhlk', x, w[:, 1]) + b[1][None, :, None, :]
    v = np.einsum('bld,dhk->bhlk', x, w[:, 2]) + b[2][None, :, None, :]
    if cfg.position_embedding == 'rope':
      q, k = _rotate_pairs(q, cfg.rope_base), _rotate_pairs(k, cfg.rope_base)
    s = np.einsum('bhqk,bhvk->bhqv', q, k) * scale
    acc = s if acc is None else acc + s  # carried: no mask, no division
    z = acc / (l + 1) if cfg.running_mean else acc
    z = z + (1.0 - mask[:, None, None, :]) * -10000.0  # BERT's additive mask, after the sum
    probs = _softmax(z)
    ctx = np.einsum('bhqv,bhvk->bqhk', probs, v)
    attn = (
      np.einsum('bqhk,hkd->bqd', ctx, lp['attention']['out']['kernel'])
      + lp['attention']['out']['bias']
    )
    h = _layer_norm(x + attn, lp['attention_norm'], cfg.norm_epsilon)
    ff = _gelu(h @ lp['mlp']['wi']['kernel'] + lp['mlp']['wi']['bias'])
    ff = ff @ lp['mlp']['wo']['kernel'] + lp['mlp']['wo']['bias']
    x = _layer_norm(h + ff, lp['mlp_norm'], cfg.norm_epsilon)
  head = p['mlm_head']
  g = np.take_along_axis(x, np.asarray(positions)[:, :, None], axis=1)
  t = _gelu(g @ head['transform']['kernel'] + head['transform']['bias'])
  t = _layer_norm(t, head['norm'], cfg.norm_epsilon)
  return t @ emb['word']['embedding'].T + head['output_bias']

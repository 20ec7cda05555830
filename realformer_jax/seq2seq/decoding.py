"""Incremental decoding for Seq2Seq: a cache, greedy search and beam search, jit-friendly.

    cache = init_cache(model, params, encoded, source_mask, max_len)
    tokens, lengths = greedy_search(model, params, source, source_mask, max_len=..., ...)
    tokens, scores = beam_search(model, params, source, source_mask, beam_size=4, ...)

Everything runs inside one `lax.while_loop` with fixed shapes (the output buffer is max_len
wide; finished rows keep emitting [PAD]), so it compiles once per (batch, source length,
max_len). Each step feeds one token per sequence to the decoder in `decode=True` mode, which
reads and updates the 'cache' collection (decoder.py).

Beam search keeps, per source, `beam_size` alive hypotheses and `beam_size` finished ones.
Each step ranks the 2 x beam_size best extensions of the alive beams; those among the best
beam_size that end in EOS join the finished pool (ranked by log-probability / length_penalty,
GNMT's penalty ((5 + length) / 6) ** alpha; alpha = 0: plain log-probability), and the best
beam_size that do not end stay alive (their caches gathered to follow their parents). It
stops at max_len or when no alive hypothesis can still beat the worst finished one. With
beam_size = 1 and alpha = 0 this is exactly greedy search (an EOS is only finished when it is
the best extension, and then nothing alive can beat it).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PAD = 0
NEG_INF = -1e30


def init_cache(model, params, encoded_BxSxD, source_mask_BxS, max_len: int) -> Any:
  """The decoding cache for max_len target positions, with the cross-attention keys and values
  of `encoded` already computed."""
  batch = encoded_BxSxD.shape[0]
  _, variables = model.apply(
    {'params': params},
    jnp.zeros((batch, max_len), jnp.int32),
    encoded_BxSxD,
    source_mask_BxS,
    decode=True,
    mutable=['cache'],
    method='decode',
  )
  return variables['cache']


def decode_step(model, params, cache, tokens_B, encoded_BxSxD, source_mask_BxS):
  """(log-probabilities [B, V] of the next token, the updated cache). [PAD] is never a next
  token: it marks the end of a decoded sequence."""
  logits, variables = model.apply(
    {'params': params, 'cache': cache},
    tokens_B[:, None],
    encoded_BxSxD,
    source_mask_BxS,
    decode=True,
    mutable=['cache'],
    method='decode',
  )
  logits = logits[:, 0].astype(jnp.float32).at[:, PAD].set(NEG_INF)
  return jax.nn.log_softmax(logits), variables['cache']


def greedy_search(
  model, params, source_BxS, source_mask_BxS, *, max_len: int, bos_id: int, eos_id: int
) -> tuple[jax.Array, jax.Array]:
  """(tokens [B, max_len] int32, [PAD] after EOS, lengths [B] including the EOS)."""
  encoded = model.apply({'params': params}, source_BxS, source_mask_BxS, method='encode')
  batch = source_BxS.shape[0]
  cache = init_cache(model, params, encoded, source_mask_BxS, max_len)

  def body(state):
    t, previous, cache, out, done = state
    log_probs, cache = decode_step(model, params, cache, previous, encoded, source_mask_BxS)
    token = jnp.where(done, PAD, jnp.argmax(log_probs, axis=-1).astype(jnp.int32))
    out = out.at[:, t].set(token)
    return t + 1, token, cache, out, done | (token == eos_id)

  def keep_going(state):
    t, _, _, _, done = state
    return (t < max_len) & ~jnp.all(done)

  start = (
    jnp.zeros((), jnp.int32),
    jnp.full((batch,), bos_id, jnp.int32),
    cache,
    jnp.full((batch, max_len), PAD, jnp.int32),
    jnp.zeros((batch,), bool),
  )
  _, _, _, out, _ = jax.lax.while_loop(keep_going, body, start)
  return out, jnp.sum(out != PAD, axis=-1)


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def _gather_beams(tree: Any, indices_BxK: jax.Array, batch: int, beams: int) -> Any:
  """Reorders every [B * beams, ...] leaf of `tree` by per-source beam indices."""
  flat = (jnp.arange(batch)[:, None] * beams + indices_BxK).reshape(-1)

  def gather(x):
    if x.ndim == 0 or x.shape[0] != batch * beams:
      return x  # scalars (cache indices) are shared by all beams
    return x[flat]

  return jax.tree.map(gather, tree)


def beam_search(
  model,
  params,
  source_BxS,
  source_mask_BxS,
  *,
  beam_size: int,
  max_len: int,
  bos_id: int,
  eos_id: int,
  alpha: float = 0.6,
) -> tuple[jax.Array, jax.Array]:
  """(best tokens [B, max_len] int32 padded with [PAD], their length-penalised scores [B])."""
  batch, k = source_BxS.shape[0], beam_size
  repeat = lambda x: jnp.repeat(x, k, axis=0)
  encoded = model.apply({'params': params}, source_BxS, source_mask_BxS, method='encode')
  encoded, source_mask = repeat(encoded), repeat(source_mask_BxS)
  cache = init_cache(model, params, encoded, source_mask, max_len)

  # Only the first beam is live at the start: the others would duplicate it.
  alive_scores = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1))
  state = dict(
    t=jnp.zeros((), jnp.int32),
    alive_tokens=jnp.full((batch, k, max_len), PAD, jnp.int32),
    alive_scores=alive_scores,
    last=jnp.full((batch * k,), bos_id, jnp.int32),
    cache=cache,
    finished_tokens=jnp.full((batch, k, max_len), PAD, jnp.int32),
    finished_scores=jnp.full((batch, k), NEG_INF, jnp.float32),
  )

  def body(s):
    t = s['t']
    log_probs, cache = decode_step(model, params, s['cache'], s['last'], encoded, source_mask)
    vocab = log_probs.shape[-1]
    candidates = s['alive_scores'][:, :, None] + log_probs.reshape(batch, k, vocab)
    top_scores, top_flat = jax.lax.top_k(candidates.reshape(batch, k * vocab), 2 * k)
    parent, token = top_flat // vocab, (top_flat % vocab).astype(jnp.int32)
    sequences = jnp.take_along_axis(s['alive_tokens'], parent[:, :, None], axis=1)
    sequences = sequences.at[:, :, t].set(token)
    ends = token == eos_id
    # Finished pool: previous finished + candidates ending here among the best k (as fairseq:
    # an EOS ranked below k would not have survived a beam of k), best k by penalised score.
    in_beam = jnp.arange(2 * k) < k
    new_finished = jnp.where(ends & in_beam, top_scores / length_penalty(t + 1, alpha), NEG_INF)
    pool_scores = jnp.concatenate([s['finished_scores'], new_finished], axis=1)
    pool_tokens = jnp.concatenate([s['finished_tokens'], sequences], axis=1)
    finished_scores, best = jax.lax.top_k(pool_scores, k)
    finished_tokens = jnp.take_along_axis(pool_tokens, best[:, :, None], axis=1)
    # Alive: the best k candidates that did not end.
    alive_scores, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, top_scores), k)
    alive_tokens = jnp.take_along_axis(sequences, keep[:, :, None], axis=1)
    parents = jnp.take_along_axis(parent, keep, axis=1)
    cache = _gather_beams(cache, parents, batch, k)
    last = jnp.take_along_axis(token, keep, axis=1).reshape(-1)
    return dict(
      t=t + 1,
      alive_tokens=alive_tokens,
      alive_scores=alive_scores,
      last=last,
      cache=cache,
      finished_tokens=finished_tokens,
      finished_scores=finished_scores,
    )

  def keep_going(s):
    # An alive hypothesis only loses probability; its best possible penalised score is its
    # score now over the largest penalty (at max_len, when alpha >= 0).
    best_alive = s['alive_scores'][:, 0] / length_penalty(jnp.asarray(max_len), alpha)
    worst_finished = s['finished_scores'][:, -1]
    return (s['t'] < max_len) & jnp.any(best_alive > worst_finished)

  s = jax.lax.while_loop(keep_going, body, state)
  any_finished = s['finished_scores'][:, 0] > NEG_INF / 2
  tokens = jnp.where(any_finished[:, None], s['finished_tokens'][:, 0], s['alive_tokens'][:, 0])
  scores = jnp.where(
    any_finished,
    s['finished_scores'][:, 0],
    s['alive_scores'][:, 0] / length_penalty(jnp.asarray(max_len), alpha),
  )
  return tokens, scores

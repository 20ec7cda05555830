"""Masked-LM loss and metrics over the predicted slots (weights mark real predictions)."""

import jax
import jax.numpy as jnp


def mlm_nll_and_correct(
  logits_BxPxV: jax.Array, masked_ids_BxP: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Per-slot cross-entropy and argmax-correctness (float32 [B, P]), unweighted."""
  logits = logits_BxPxV.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, masked_ids_BxP[..., None], axis=-1)[..., 0]
  correct_BxP = (jnp.argmax(logits, axis=-1) == masked_ids_BxP).astype(jnp.float32)
  return log_z - target_logit, correct_BxP


def mlm_loss_and_metrics(
  logits_BxPxV: jax.Array, masked_ids_BxP: jax.Array, masked_weights_BxP: jax.Array
) -> tuple[jax.Array, dict]:
  """Mean cross-entropy over real predictions; metrics are sums so that they add across
  batches, devices and accumulation steps (divide by 'mlm_weight' at the end)."""
  weights = masked_weights_BxP.astype(jnp.float32)
  nll_BxP, correct_BxP = mlm_nll_and_correct(logits_BxPxV, masked_ids_BxP)
  total_weight = jnp.sum(weights)
  loss = jnp.sum(nll_BxP * weights) / jnp.maximum(total_weight, 1.0)
  metrics = {
    'mlm_loss_sum': jnp.sum(nll_BxP * weights),
    'mlm_correct_sum': jnp.sum(correct_BxP * weights),
    'mlm_weight': total_weight,
  }
  return loss, metrics

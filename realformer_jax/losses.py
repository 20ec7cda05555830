"""Masked-LM loss and metrics over the predicted slots (weights mark real predictions)."""

import jax
import jax.numpy as jnp


def mlm_loss_and_metrics(logits_BxPxV: jax.Array, masked_ids_BxP: jax.Array,
                         masked_weights_BxP: jax.Array) -> tuple[jax.Array, dict]:
  """Mean cross-entropy over real predictions; metrics are sums so that they add across
  batches, devices and accumulation steps (divide by 'mlm_weight' at the end)."""
  logits = logits_BxPxV.astype(jnp.float32)
  weights = masked_weights_BxP.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, masked_ids_BxP[..., None], axis=-1)[..., 0]
  nll_BxP = log_z - target_logit
  total_weight = jnp.sum(weights)
  loss = jnp.sum(nll_BxP * weights) / jnp.maximum(total_weight, 1.0)
  correct = (jnp.argmax(logits, axis=-1) == masked_ids_BxP).astype(jnp.float32)
  metrics = {
      'mlm_loss_sum': jnp.sum(nll_BxP * weights),
      'mlm_correct_sum': jnp.sum(correct * weights),
      'mlm_weight': total_weight,
  }
  return loss, metrics

import jax.numpy as jnp
import numpy as np

from realformer_jax.model.losses import mlm_loss_and_metrics


def test_mlm_loss_ignores_unused_slots_and_counts_correct_predictions():
  logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]]))
  ids = jnp.array([[0, 1, 2]])
  weights = jnp.array([[1.0, 1.0, 0.0]])
  loss, metrics = mlm_loss_and_metrics(logits, ids, weights)
  np.testing.assert_allclose(loss, -(np.log(0.7) + np.log(0.1)) / 2, rtol=1e-6)
  assert float(metrics['mlm_correct_sum']) == 1.0 and float(metrics['mlm_weight']) == 2.0

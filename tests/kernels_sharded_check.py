"""Run by tests/kernels/test_kernels_sharded.py in a subprocess with 8 forced CPU devices: the real
train setup on a (data 2, fsdp 2, tensor 2) mesh, RealFormer with dropout on, once with the
einsum path and once with the Pallas kernels (interpret mode, per shard). Prints one JSON line:
the largest gradient difference relative to the largest gradient, the two losses, and the loss
of one compiled train step with the kernels."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax.bench import steps
from realformer_jax.train import build, pretraining
from realformer_jax.train import step as step_lib
from tests import scale_out_support as support


def _config(impl: str, **model):
  config = support.tiny_sharded_config()
  config.mesh.shape = (2, 2, 2)
  config.model.attention_dropout_rate = 0.5  # masks that matter: any mismatch shows
  config.model.attention_impl = impl
  for field, value in model.items():
    config.model[field] = value
  return config


def sharded_runs(cases: dict, step_case: str) -> dict:
  """{case: (loss, gradients)} of the sharded setup for each `cases` entry (impl, model
  overrides), plus 'step_loss': one compiled train step of `step_case`."""
  shape = steps.Shape(
    'tiny', hidden=64, layers=2, heads=8, vocab=1000, seq_len=32, batch=16, predictions=5
  )
  batch = steps.make_batch(shape)
  batch['input_mask'][3, 20:] = 0  # padding in one shard's rows
  results = {}
  for case, (impl, model) in cases.items():
    spec = pretraining.validate_config(_config(impl, **model))
    setup = build.make_setup(spec)
    state = build.init_state(
      setup.model,
      setup.tx,
      spec.data,
      setup.layout,
      jax.random.key(0),
      setup.mesh,
      setup.rules,
      setup.task,
    )
    device_batch = build.global_batch(batch, setup.batch_sharding)
    rng = jax.random.key(1)
    forward_rng = jax.random.fold_in(jax.random.fold_in(rng, 0), 0)  # as train_step at step 0

    def loss(params, batch, rng):
      sums = step_lib._forward_sums(
        setup.task,
        setup.model,
        params,
        batch,  # pylint: disable=protected-access
        step=jnp.zeros((), jnp.int32),
        rng=rng,
      )
      return sums[setup.task.loss_sum] / setup.task.batch_weight(batch)

    grad_fn = jax.jit(
      jax.value_and_grad(loss),
      in_shardings=(setup.layout.param_shardings, setup.batch_sharding, None),
    )
    with build.activate(setup.mesh, setup.rules):
      value, grads = grad_fn(state.params, device_batch, forward_rng)
    results[case] = (float(value), jax.tree.map(np.asarray, grads))
    if case == step_case:
      train_step = build.compile_train_step(setup)
      _, metrics = train_step(state, device_batch, rng)
      metrics = jax.device_get(metrics)
      results['step_loss'] = float(metrics['mlm_loss_sum'] / metrics['mlm_weight'])
  return results


def grad_difference(actual, expected) -> float:
  """The largest gradient difference relative to the largest expected gradient."""
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(expected))
  worst = max(
    float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected))
  )
  return worst / scale


def print_report(results: dict, **figures) -> None:
  """A sharded check's one JSON line: its `figures`, then what every such check reports (the
  loss of the compiled train step, the device count)."""
  print(json.dumps({**figures, 'step_loss': results['step_loss'], 'devices': jax.device_count()}))


def main():
  results = sharded_runs({'xla': ('xla', {}), 'pallas': ('pallas', {})}, 'pallas')
  print_report(
    results,
    grad_difference=grad_difference(results['pallas'][1], results['xla'][1]),
    loss_xla=results['xla'][0],
    loss_pallas=results['pallas'][0],
  )


if __name__ == '__main__':
  main()

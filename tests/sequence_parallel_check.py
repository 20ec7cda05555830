"""Run by tests/train/test_sequence_parallel.py in a subprocess with 8 forced CPU devices:

    python -m tests.sequence_parallel_check FAMILY [MESH ...]

the real train setup of a tiny model of one family (post, pre, realformer: the carried sum,
realformer_qk: residual_carry='qk', realformer_qk_triton: the same with the Triton qk block
kernel as the ring's forward per-block op) with hidden and attention dropout and padded rows, on one
device and on each MESH (data,fsdp,tensor,sequence, e.g. 1,1,1,4): the MLM outputs and the
gradients of one dropout forward, then 5 compiled train steps from the same state and batches.
float32, matmul precision 'highest'. Prints one JSON line: per mesh, the largest difference
from the one-device run relative to the largest value, of the outputs, the gradients, the 5
losses and the parameters after them."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax.train import build, pretraining
from tests import scale_out_support as support

jax.config.update('jax_default_matmul_precision', 'highest')

STEPS = 5
FAMILIES = {
  'post': {'ln_placement': 'post'},
  'pre': {'ln_placement': 'pre'},
  'realformer': {'ln_placement': 'realformer', 'residual_carry': 'scores'},
  'realformer_qk': {'ln_placement': 'realformer', 'residual_carry': 'qk'},
  # The ring's forward blocks through the Triton qk block kernel (interpret mode on CPU).
  'realformer_qk_triton': {
    'ln_placement': 'realformer',
    'residual_carry': 'qk',
    'attention_impl': 'pallas_triton',
  },
}
BATCH, LENGTH, PREDICTIONS = 4, 32, 5


def config_for(family: str, mesh: tuple):
  config = support.tiny_sharded_config()
  config.model.hidden_size = 32
  config.model.num_heads = 2
  config.model.mlp_dim = 64
  config.model.attention_dropout_rate = 0.2
  for field, value in FAMILIES[family].items():
    config.model[field] = value
  config.data.vocab_size = 200
  config.train.global_batch_size = BATCH
  config.train.learning_rate = 1e-2
  config.mesh.shape = mesh
  return config


def batches(seed: int) -> dict:
  """An MLM batch with padded rows (one shard of every split holds padding)."""
  rng = np.random.default_rng(seed)
  lengths = np.array([LENGTH, 19, 7, 26])
  positions = np.stack([np.sort(rng.choice(n, PREDICTIONS, replace=False)) for n in lengths])
  ids = rng.integers(5, 200, (BATCH, LENGTH)).astype(np.int32)
  return {
    'input_ids': ids,
    'input_mask': (np.arange(LENGTH) < lengths[:, None]).astype(np.int32),
    'segment_ids': (np.arange(LENGTH)[None] >= LENGTH // 2).astype(np.int32).repeat(BATCH, 0),
    'masked_positions': positions.astype(np.int32),
    'masked_ids': np.take_along_axis(ids, positions, 1),
    'masked_weights': np.ones((BATCH, PREDICTIONS), np.float32),
  }


def run(family: str, mesh: tuple) -> dict:
  devices = jax.devices()[: int(np.prod(mesh))]
  spec = pretraining.validate_config(
    config_for(family, mesh), device_count=len(devices), process_count=1
  )
  setup = build.make_setup(spec, devices)
  state = setup.init_state(jax.random.key(0))
  rng = jax.random.key(1)
  batch = build.global_batch(batches(0), setup.batch_sharding)

  def loss(params, batch):
    outputs = setup.task.forward(
      setup.model, params, batch, step=jnp.zeros((), jnp.int32), rng=jax.random.key(2)
    )
    sums = setup.task.loss_sums(outputs, batch)
    return sums[setup.task.loss_sum] / setup.task.batch_weight(batch), outputs

  grad_fn = jax.jit(
    jax.value_and_grad(loss, has_aux=True),
    in_shardings=(setup.layout.param_shardings, setup.batch_sharding),
    out_shardings=setup.replicated,
  )
  with build.activate(setup.mesh, setup.rules):
    (_, outputs), grads = grad_fn(state.params, batch)
  outputs, grads = jax.device_get((outputs, grads))
  train_step = build.compile_train_step(setup)
  losses = []
  for step in range(STEPS):
    step_batch = build.global_batch(batches(step), setup.batch_sharding)
    state, metrics = train_step(state, step_batch, rng)
    metrics = jax.device_get(metrics)
    losses.append(float(metrics['mlm_loss_sum'] / metrics['mlm_weight']))
  return {
    'outputs': outputs,
    'grads': grads,
    'losses': np.array(losses),
    'params': jax.device_get(state.params),
    'path': type(ring_path(setup)).__name__,
  }


def ring_path(setup):
  """The attention path the encoder takes on this setup's mesh (traced, not run)."""
  from realformer_jax.kernels.score_paths import score_path
  from realformer_jax.model.attention import einsum_attention

  with build.activate(setup.mesh, setup.rules):
    return score_path.stack_path(
      setup.model_config, LENGTH, einsum=einsum_attention, may_recompute=True
    )


def relative(actual, expected) -> float:
  """The largest difference relative to the largest expected value, over a tree."""
  scale = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(expected))
  return (
    max(
      float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
      for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected))
    )
    / scale
  )


def main():
  family, meshes = sys.argv[1], [tuple(int(n) for n in m.split(',')) for m in sys.argv[2:]]
  reference = run(family, (1, 1, 1, 1))
  report = {'devices': jax.device_count(), 'reference_path': reference['path']}
  for mesh in meshes:
    result = run(family, mesh)
    report[','.join(map(str, mesh))] = {
      'path': result['path'],
      **{
        key: relative(result[key], reference[key])
        for key in ('outputs', 'grads', 'losses', 'params')
      },
    }
  print(json.dumps(report))


if __name__ == '__main__':
  main()

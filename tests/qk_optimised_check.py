"""Run by tests/kernels/test_qk_carry.py in a subprocess with XLA's optimisations ON
(tests/conftest.py turns them off in the test process): the qk einsum path with the layers unrolled
(scan_layers=False), initialised and applied inside one jit, against the carried sum. That program
once came back all-nan (qk_reference.summed_scores's `where` over the stack) while the same code
eagerly and without the optimisations was finite. Prints one JSON line."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax.config import ModelConfig
from realformer_jax.model.encoder import Encoder

SEQ = 128


def _output(config: ModelConfig, ids, mask):
  def init_and_apply(key):
    params = Encoder(config).init(key, ids, mask)
    return Encoder(config).apply(params, ids, mask)

  return np.asarray(jax.jit(init_and_apply)(jax.random.key(0)))


def main():
  jax.config.update('jax_default_matmul_precision', 'highest')
  config = ModelConfig(
    hidden_size=192,
    num_layers=5,
    num_heads=6,
    mlp_dim=768,
    max_len=SEQ,
    ln_placement='realformer',
    residual_carry='qk',
    attention_impl='xla',
    scan_layers=False,
  )
  ids = jax.random.randint(jax.random.key(1), (2, SEQ), 1, 100)
  mask = jnp.ones((2, SEQ), jnp.int32).at[1, 100:].set(0)
  qk = _output(config, ids, mask)
  scores = _output(config.replace(residual_carry='scores'), ids, mask)
  report = {
    'optimisations_disabled': bool(jax.config.read('jax_disable_most_optimizations')),
    'nan_fraction': float(np.mean(np.isnan(qk))),
    'max_difference': float(np.max(np.abs(qk - scores))),
    'max_value': float(np.max(np.abs(scores))),
  }
  print(json.dumps(report))


if __name__ == '__main__':
  main()

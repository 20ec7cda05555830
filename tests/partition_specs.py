"""Prints the partition specs of the train state (params + optimizer state) of a small scanned
RealFormer on 8 devices, for three layouts, as JSON. Run with 8 forced CPU devices; the golden
copy lives in tests/golden/partition_specs.json."""

import json

import jax

from realformer_jax.configs import tiny
from realformer_jax.train import build, pretraining

LAYOUTS = {'data_8': (8, 1, 1), 'fsdp_8': (1, 8, 1), 'data_2_fsdp_2_tensor_2': (2, 2, 2)}


def _spec_tree(shardings):
  flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
  out = {}
  for path, sharding in flat:
    out[jax.tree_util.keystr(path)] = str(sharding.spec)
  return out


def main():
  assert jax.device_count() == 8, 'run with XLA_FLAGS=--xla_force_host_platform_device_count=8'
  result = {}
  for name, shape in LAYOUTS.items():
    config = tiny.get_config()
    config.model.num_layers = 2
    config.model.hidden_size = 64
    config.model.num_heads = 8
    config.model.mlp_dim = 128
    config.model.position_embedding = 'learned'  # the golden tree includes the position table
    config.data.vocab_size = 1000
    config.train.global_batch_size = 16
    config.mesh.shape = shape
    setup = build.make_setup(pretraining.validate_config(config))
    result[name] = _spec_tree(setup.layout.shardings)
  print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == '__main__':
  main()

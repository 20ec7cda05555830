r"""Per-device memory of the train state under different meshes, from the compiled step.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python -m experiments.sharding_memory --config=configs/realformer_large.py

For each layout (replicated data parallel, FSDP, FSDP x tensor) it compiles the sharded train
step ahead of time (no parameter is allocated) and prints, per device: the bytes of the
arguments the compiled step reads (params + optimizer state + batch + rng), the train state's
share of them, and XLA's temporary buffers. Use a small global batch: the state does not
depend on it.
"""

import math

import jax
from absl import app, flags
from ml_collections import config_flags

from realformer_jax.aot.train_step import per_device_bytes
from realformer_jax.commands import cli
from realformer_jax.train import build, pretraining

_CONFIG = config_flags.DEFINE_config_file(
  'config', cli.shipped_path('configs/realformer_large.py'), 'Training config file.'
)
_BATCH = flags.DEFINE_integer('global_batch_size', 8, 'Global batch for the compiled step.')
_LENGTH = flags.DEFINE_integer('max_len', 128, 'Sequence length for the compiled step.')

LAYOUTS = {
  'replicated (data=N)': (-1, 1, 1),
  'FSDP (fsdp=N)': (1, -1, 1),
  'FSDP x tensor (fsdp=N/2, tensor=2)': (1, -1, 2),
}


def _size(num_bytes: float) -> str:
  """GiB for the paper sizes, MiB for small configs (3 decimals of GiB would round to 0)."""
  if num_bytes >= 2.0**30:
    return f'{num_bytes / 2.0**30:.3f} GiB'
  return f'{num_bytes / 2.0**20:.3f} MiB'


def main(argv):
  del argv
  devices = jax.device_count()
  print(f'{devices} devices; global batch {_BATCH.value} x {_LENGTH.value} tokens')
  header = (
    f'{"layout":38} {"params+opt (state)":>20} {"of which params":>16} '
    f'{"step arguments":>15} {"step temporaries":>17}'
  )
  print(header)
  print('-' * len(header))
  for name, shape in LAYOUTS.items():
    config = _CONFIG.value.copy_and_resolve_references()  # this layout's copy
    config.mesh.shape = shape
    config.train.global_batch_size = _BATCH.value
    config.data.max_len = _LENGTH.value
    config.data.max_predictions = max(1, math.ceil(0.15 * _LENGTH.value))
    setup = build.make_setup(
      pretraining.validate_config(
        config, device_count=jax.device_count(), process_count=jax.process_count()
      )
    )
    compiled = build.compile_train_step(setup)
    memory = compiled.memory_analysis()
    state_bytes = per_device_bytes(setup.layout.abstract)
    param_bytes = per_device_bytes(setup.layout.abstract.params)
    print(
      f'{name:38} {_size(state_bytes):>20} {_size(param_bytes):>16} '
      f'{_size(memory.argument_size_in_bytes):>15} '
      f'{_size(memory.temp_size_in_bytes):>17}'
    )


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)

r"""Compile a config's train step for an accelerator you do not have, and see whether it fits.

    python -m experiments.compile --config=configs/realformer_large.py --target=h100:8 \
        --config.mesh.shape='(1,-1,1)'
    python -m experiments.compile --config=configs/realformer_large.py --target=v5e:4x4
    python -m experiments.compile --config=configs/tiny.py --target=a100-40g:2 --dump=DIR

Runs on any machine, a CPU laptop included: XLA compiles the real train step (the config's
mesh, logical rules, dtypes, remat and accumulation) for the target's devices without opening
one. It prints per-device memory (arguments with the params / optimizer-state share, outputs,
temporaries) against the target's memory, whether it fits and by how much, the accumulation
that grad_accum_steps='auto' chooses for that target, model FLOPs per step, and an ESTIMATED
step time and MFU (a kernel roofline, realformer_jax/aot/roofline.py: an estimate, never a
measurement). Targets: h100, a100-40g, a100-80g as NAME:COUNT (more than 8 = hosts of 8);
v4, v5e, v5p, v6e as NAME:TOPOLOGY in chips (jax's names: v5e:2x2, v4:2x2x1, v5p:4x4x4).
--dump DIR writes the optimized HLO, a per-kernel CSV and the figures as JSON.

Needs the accelerator compilers: pip install -e '.[aot]' (jax-cuda13-plugin, jax-cuda13-pjrt,
libtpu; no CUDA libraries). The command sets JAX_PLATFORMS=cpu itself, so nothing tries to open
a device. A config that cannot fit even at one sequence per device ends with one line
`error: ...` naming the bytes needed and available, exit status 1.
"""

import os

# Before JAX starts: compiling for a target needs no device here, and a machine with the CUDA
# or TPU plugin but no such device must not try to open one.
os.environ['JAX_PLATFORMS'] = 'cpu'

from absl import app, flags  # pylint: disable=wrong-import-position
from ml_collections import config_flags  # pylint: disable=wrong-import-position

from realformer_jax.aot import fit_report, targets  # pylint: disable=wrong-import-position
from realformer_jax.commands.cli import fail, loaded, parse_flags, start  # pylint: disable=wrong-import-position
from realformer_jax.config import ConfigError  # pylint: disable=wrong-import-position
from realformer_jax.data import DataError  # pylint: disable=wrong-import-position

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
_TARGET = flags.DEFINE_string(
  'target',
  None,
  f'Accelerator target: {targets.known_targets()} (e.g. h100:8, a100-40g:16, v5e:2x2, v4:2x2x1).',
)
_DUMP = flags.DEFINE_string(
  'dump', None, 'Write the optimized HLO, kernels.csv and report.json here.'
)
flags.mark_flags_as_required(['config', 'target'])


def main(argv):
  start(argv)
  config = loaded(_CONFIG.value)
  try:
    fit_report.run(config, _TARGET.value, _DUMP.value)
  except (ConfigError, DataError) as e:
    fail(str(e))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

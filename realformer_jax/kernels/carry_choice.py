"""`model.residual_carry='auto'`: which carry residual attention takes, decided when the model
is built. A minimal rule: 'scores' (the carried float32 [B, H, L, L] sum, the cheaper in FLOPs)
unless that one sum alone is larger than the device's memory, then 'qk' (kernels/qk_carry.py,
memory linear in L). The device is the first local one; a device that does not report its
memory (a CPU) keeps 'scores'. The choice is logged.
"""

from __future__ import annotations

import logging
from typing import Optional

import jax

from realformer_jax.config import ModelConfig

_log = logging.getLogger(__name__)


def device_memory_bytes() -> Optional[int]:
  """The first local device's memory limit, or None where it reports none."""
  stats = jax.local_devices()[0].memory_stats()
  return None if not stats else stats.get('bytes_limit')


def resolve_residual_carry(config: ModelConfig, batch: int, seq_len: int) -> str:
  """'scores' or 'qk' for config.residual_carry; 'auto' by the rule above."""
  if config.residual_carry != 'auto':
    return config.residual_carry
  sum_bytes = 4 * batch * config.num_heads * seq_len * seq_len
  memory = device_memory_bytes()
  choice = 'qk' if memory is not None and sum_bytes > memory else 'scores'
  _log.info(
    "model.residual_carry='auto' -> %r: one carried sum is %.3g GiB, device memory %s",
    choice,
    sum_bytes / 2**30,
    'unknown' if memory is None else f'{memory / 2**30:.3g} GiB',
  )
  return choice

"""`model.residual_carry='auto'`: which carry residual attention takes, decided when the model
is built and logged.

The rule: 'scores' (the carried float32 [B, H, L, L] sum) when the sums that carry holds for
ONE sequence fit in SCORES_SHARE of a device's memory budget, else 'qk' (kernels/qk_carry.py:
the stacked queries and keys, memory linear in L).

* Sums held per sequence (`scores_carry_bytes`): with residual_scores_backward='saved', one
  per layer for the backward plus the carry in flight and its gradient, num_layers + 2; with
  'recomputed', 2. Both counts are the measured ones: BERT-Base at batch 1 in a deviceless H100
  compile needs Post-LN's memory + 14.0 sums at L = 16k and 32k ('saved'), + 2.0 ('recomputed').
* One sequence, not the batch: 'auto' accumulation (train/accumulation.py) then splits the
  batch into microbatches that fit, so 'qk' is taken only where the sum cannot hold even one
  sequence per device, and any length that fitted before keeps today's carry.
* 'scores' first: where it fits it does less work. Per score element of layer l it costs 4d
  forward and 10d backward matmul FLOPs against (4 + 2l)d and (10 + 6l)d for 'qk' (~4x over 12
  layers) for ~24 bytes of HBM traffic (docs/performance.md). Neither carry has been timed
  against the other on a device yet.
* The budget: what the train setup gives (`train.device_memory_bytes`, the device's limit, or
  in a deviceless compile the target's: accumulation.memory_budget), else the first local
  device's `bytes_limit`; a device that reports none (a CPU) keeps 'scores'.
"""

from __future__ import annotations

import logging
from typing import Optional

import jax

from realformer_jax.config import ModelConfig

_log = logging.getLogger(__name__)

# Share of the budget the carried sums may take: the rest holds the weights, the optimizer
# state and the other activations (BERT-Base at L = 65,536 needs 10.7 GiB for those alone).
SCORES_SHARE = 0.75
SUM_BYTES_PER_ELEMENT = 4  # the sum is float32 whatever the compute dtype


def device_memory_bytes() -> Optional[int]:
  """The first local device's memory limit, or None where it reports none."""
  stats = jax.local_devices()[0].memory_stats()
  return None if not stats else stats.get('bytes_limit')


def sums_held(config: ModelConfig) -> int:
  """How many [H, L, L] sums the scores carry holds per sequence (module docstring)."""
  return 2 if config.residual_scores_backward == 'recomputed' else config.num_layers + 2


def scores_carry_bytes(config: ModelConfig, seq_len: int) -> int:
  """Bytes of the carried sums for one sequence under residual_carry='scores'."""
  return sums_held(config) * SUM_BYTES_PER_ELEMENT * config.num_heads * seq_len * seq_len


def resolve_residual_carry(
  config: ModelConfig, seq_len: int, memory_bytes: Optional[int] = None
) -> str:
  """'scores' or 'qk' for config.residual_carry; 'auto' by the rule above, against
  `memory_bytes` (default: the first local device's limit)."""
  if config.residual_carry != 'auto':
    return config.residual_carry
  if memory_bytes is None:
    memory_bytes = device_memory_bytes()
  needed = scores_carry_bytes(config, seq_len)
  fits = memory_bytes is None or needed <= SCORES_SHARE * memory_bytes
  choice = 'scores' if fits else 'qk'
  _log.info(
    "model.residual_carry='auto' -> %r: the carried sums of one sequence (%d x [%d, %d, %d] "
    'float32) are %.3g GiB, %s of device memory %s',
    choice,
    sums_held(config),
    config.num_heads,
    seq_len,
    seq_len,
    needed / 2**30,
    f'{SCORES_SHARE:.0%}',
    'unknown' if memory_bytes is None else f'{memory_bytes / 2**30:.3g} GiB',
  )
  return choice


def resolved(config: ModelConfig, seq_len: Optional[int], memory_bytes: Optional[int]):
  """`config` with residual_carry 'auto' replaced by the choice (unchanged without residual
  attention or a known sequence length)."""
  if config.residual_carry != 'auto' or not config.use_residual_attention or not seq_len:
    return config
  return config.replace(residual_carry=resolve_residual_carry(config, seq_len, memory_bytes))

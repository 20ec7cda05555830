"""`model.residual_carry='auto'`: which carry residual attention takes, decided when the model
is built and logged with the reason.

The rule looks at time first, then memory. Per score element of layer l the carries cost, in
attention matmul FLOPs (K = head dim; one forward and the backward; a rematerialised layer adds
its forward again to each):
  'scores', residual_scores_backward='saved'       14 K   (the carried float32 sum, saved)
  'scores', residual_scores_backward='recomputed'  18 K   (+ one forward going down)
  'qk'                                             (14 + 8 l) K   (the sum rebuilt per tile
                                                   from every layer's q, k: ~4x over 12 layers)
and on an H200 the qk Triton kernels of before issue 40 measured 9.6x Post-LN's step at
L = 65,536 (docs/performance.md). So:

1. 'scores' with 'saved' while the sums it holds for ONE sequence fit SCORES_SHARE of the
   device's budget (num_layers + 2 sums: one per layer for the backward, the carry in flight
   and its gradient; measured in a deviceless H100 compile of BERT-Base at 16k and 32k);
2. else 'scores' with 'recomputed' (2 sums) while those fit (it needs scan_layers);
3. else 'qk' (kernels/qk_carry.py: the stacked queries and keys, memory linear in L), but only
   where a fused kernel serves the platform and length (kernels/select.py's plan): on the einsum
   path (attention_impl='xla', a CPU, or a length the kernels cannot tile) 'qk' materialises the
   same [B, H, L, L] scores per layer, so it saves no memory and multiplies FLOPs;
4. else (no fused kernel) the smallest sum, logged as not fitting: train/accumulation.py then
   reports the shortfall.

One sequence, not the batch: 'auto' accumulation (train/accumulation.py) splits the batch into
microbatches that fit. The budget: what the train setup gives (`train.device_memory_bytes`, or
in a deviceless compile the target's: accumulation.memory_budget), else the first local device's
`bytes_limit`; a device that reports none (a CPU) keeps the configured sum.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Optional

import jax

from realformer_jax.config import ModelConfig
from realformer_jax.kernels import select

_log = logging.getLogger(__name__)

# Share of the budget the carried sums may take: the rest holds the weights, the optimizer
# state and the other activations (BERT-Base at L = 65,536 needs 10.7 GiB for those alone).
SCORES_SHARE = 0.75
SUM_BYTES_PER_ELEMENT = 4  # the sum is float32 whatever the compute dtype
# Attention matmul FLOPs per score element and head dim, forward + backward (module docstring).
FLOPS_PER_ELEMENT = {'saved': 14, 'recomputed': 18}
QK_EXTRA_PER_LAYER = 8  # 'qk' at layer l: 14 + 8 l


class CarryChoice(NamedTuple):
  carry: str  # 'scores' | 'qk'
  scores_backward: str  # residual_scores_backward the model takes ('saved' | 'recomputed')
  reason: str  # for the log line


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


def attention_flops_factor(config: ModelConfig, carry: str) -> float:
  """A carry's attention matmul FLOPs over the saved sum's (module docstring)."""
  layers = config.num_layers
  if carry == 'qk':
    qk = sum(FLOPS_PER_ELEMENT['saved'] + QK_EXTRA_PER_LAYER * l for l in range(layers))
    return qk / (FLOPS_PER_ELEMENT['saved'] * layers)
  return FLOPS_PER_ELEMENT[carry] / FLOPS_PER_ELEMENT['saved']


def fused_kernel(config: ModelConfig, seq_len: int) -> Optional[str]:
  """The Pallas backend that would run this config at this length ('triton' | 'mosaic'), or
  None on the einsum path."""
  attention_plan = select.plan(config, seq_len)
  if attention_plan is None or attention_plan.path != 'pallas':
    return None
  return attention_plan.backend


def _gib(n: float) -> str:
  return f'{n / 2**30:.3g} GiB'


def choose(config: ModelConfig, seq_len: int, memory_bytes: Optional[int] = None) -> CarryChoice:
  """The carry for config.residual_carry='auto' (module docstring); an explicit carry is kept."""
  configured = config.residual_scores_backward
  if config.residual_carry != 'auto':
    return CarryChoice(config.residual_carry, configured, 'set in the config')
  if memory_bytes is None:
    memory_bytes = device_memory_bytes()
  if memory_bytes is None:
    return CarryChoice('scores', configured, 'the device reports no memory limit')
  budget = SCORES_SHARE * memory_bytes
  shape = f'[{config.num_heads}, {seq_len}, {seq_len}] float32'
  candidates = [configured]
  if configured == 'saved' and config.scan_layers:
    candidates.append('recomputed')
  for backward in candidates:
    needed = scores_carry_bytes(config.replace(residual_scores_backward=backward), seq_len)
    if needed <= budget:
      held = sums_held(config.replace(residual_scores_backward=backward))
      return CarryChoice(
        'scores',
        backward,
        f'the sum is the fastest carry that fits ({backward}: {held} x {shape} = '
        f'{_gib(needed)} <= {SCORES_SHARE:.0%} of {_gib(memory_bytes)}; attention FLOPs '
        f"x{attention_flops_factor(config, backward):.2f} of 'saved', 'qk' would be "
        f'x{attention_flops_factor(config, "qk"):.1f})',
      )
  smallest = candidates[-1]
  needed = scores_carry_bytes(config.replace(residual_scores_backward=smallest), seq_len)
  backend = fused_kernel(config, seq_len)
  if backend is not None:
    return CarryChoice(
      'qk',
      configured,
      f'even the {smallest} sum ({_gib(needed)}) outgrows {SCORES_SHARE:.0%} of '
      f'{_gib(memory_bytes)}; the {backend} kernels rebuild it per tile from the stacked '
      f'queries and keys (memory linear in L, attention FLOPs '
      f'x{attention_flops_factor(config, "qk"):.1f})',
    )
  return CarryChoice(
    'scores',
    smallest,
    f'the {smallest} sum ({_gib(needed)}) does not fit {SCORES_SHARE:.0%} of '
    f'{_gib(memory_bytes)}, but no fused kernel serves this platform and length '
    f"(attention_impl={config.attention_impl!r}, L = {seq_len}): 'qk' on the einsum path "
    'materialises the same scores, saving no memory for '
    f'x{attention_flops_factor(config, "qk"):.1f} the attention FLOPs',
  )


def _logged(config: ModelConfig, seq_len: int, memory_bytes: Optional[int]) -> CarryChoice:
  choice = choose(config, seq_len, memory_bytes)
  if config.residual_carry == 'auto':
    _log.info(
      "model.residual_carry='auto' -> %r (residual_scores_backward=%r): %s",
      choice.carry,
      choice.scores_backward,
      choice.reason,
    )
  return choice


def resolve_residual_carry(
  config: ModelConfig, seq_len: int, memory_bytes: Optional[int] = None
) -> str:
  """'scores' or 'qk' for config.residual_carry (choose()), logged when it was 'auto'."""
  return _logged(config, seq_len, memory_bytes).carry


def resolved(config: ModelConfig, seq_len: Optional[int], memory_bytes: Optional[int]):
  """`config` with residual_carry 'auto' replaced by the choice, and residual_scores_backward
  by the sum's backward it chose (unchanged without residual attention or a known length)."""
  if config.residual_carry != 'auto' or not config.use_residual_attention or not seq_len:
    return config
  choice = _logged(config, seq_len, memory_bytes)
  return config.replace(
    residual_carry=choice.carry, residual_scores_backward=choice.scores_backward
  )

"""What a run on a CPU says before it compiles, when the model is too big for one.

A paper-size config started on a laptop compiles for minutes, takes gigabytes and then shows
nothing for a first step that lasts minutes more. So before compiling, a run whose devices are
CPUs estimates its cost and, when a step would take more than STEP_SECONDS or its train state
more than STATE_FRACTION of this host's memory, says so in one line with the way out
(configs/tiny.py). The figures are estimates and say so: the step's matmul FLOPs (analysis/
flops.py's counting: 6 x the weights that multiply activations x tokens, plus attention) at the
float32 matmul rate this host measures in a fraction of a second, and 16 bytes a parameter
(float32 parameters, gradients and AdamW's two moments; activations come on top).
"""

from __future__ import annotations

import os
import time
from typing import Optional

import jax
import jax.numpy as jnp

from realformer_jax.analysis.flops import encoder_matmul_params
from realformer_jax.units import format_duration

STEP_SECONDS = 10.0  # an estimated step above this is worth a word
STATE_FRACTION = 0.25  # of this host's memory
_STATE_BYTES_PER_PARAM = 16  # float32 params + grads + two AdamW moments
# float32 matmul FLOP/s no CPU this project runs on exceeds (FACTS: 170-450 GFLOP/s measured):
# a step below STEP_SECONDS at this rate needs no measurement.
_FASTEST_CPU_FLOPS = 2e12


def notice(spec) -> Optional[str]:
  """The line to print before compiling `spec` (a RunSpec) on CPU devices, or None (another
  platform, or a model a CPU trains comfortably)."""
  if jax.devices()[0].platform != 'cpu':
    return None
  model, train = spec.model, spec.train
  matmul_params = model.num_layers * encoder_matmul_params(model.hidden_size, model.mlp_dim)
  params = matmul_params + model.vocab_size * model.hidden_size
  tokens = spec.task.tokens_per_step(spec)
  attention = 12 * model.num_layers * tokens * model.max_len * model.hidden_size
  flops = 6 * matmul_params * tokens + attention
  state_bytes = _STATE_BYTES_PER_PARAM * params
  memory = _host_memory_bytes()
  big_state = memory is not None and state_bytes > STATE_FRACTION * memory
  if flops / _FASTEST_CPU_FLOPS <= STEP_SECONDS and not big_state:
    return None  # quick even on the fastest CPU: nothing to measure or say
  flops_per_second = measured_flops_per_second()
  step_seconds = flops / flops_per_second
  if step_seconds <= STEP_SECONDS and not big_state:
    return None
  steps = train.stop_step
  return (
    f'note: training on CPU ({jax.device_count()} device(s), no GPU or TPU found): this model '
    f'(~{params / 1e6:.1f}M parameters in its matmuls and word embeddings; the model line '
    f'counts every one) needs ~{state_bytes / 2**30:.1f} GiB for its train '
    f'state alone{_of_memory(memory)} and ~{format_duration(step_seconds)} a step, '
    f'{_long_duration(step_seconds * steps)} for {steps:,} steps (estimated: '
    f'{flops:.2e} FLOPs a step at the {flops_per_second / 1e9:.0f} GFLOP/s this CPU measured); '
    'the first step also compiles. For a run a CPU finishes: --config=configs/tiny.py '
    '(~4 minutes on 2 cores)'
  )


def measured_flops_per_second(size: int = 1024, repeats: int = 2) -> float:
  """float32 matmul FLOP/s of this host's default device (a few jitted [size, size] products)."""
  x = jnp.ones((size, size), jnp.float32)
  product = jax.jit(lambda a: a @ a)
  product(x).block_until_ready()  # compiled outside the timing
  start = time.perf_counter()
  for _ in range(repeats):
    product(x).block_until_ready()
  seconds = (time.perf_counter() - start) / repeats
  return 2 * size**3 / max(seconds, 1e-9)


def _long_duration(seconds: float) -> str:
  days = seconds / 86400
  if days >= 365:
    return f'~{days / 365:,.0f} years'
  if days >= 2:
    return f'~{days:,.0f} days'
  return format_duration(seconds)


def _host_memory_bytes() -> Optional[int]:
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return None


def _of_memory(memory: Optional[int]) -> str:
  return f' (this host has {memory / 2**30:.1f} GiB)' if memory else ''

"""Benchmark candidates compiled and ready to time: a train step with its own state, XLA's
memory figures, and the device's high-water mark."""

from __future__ import annotations

import time
from typing import Optional

import jax

from realformer_jax.bench import steps


class CompiledStep:
  """A compiled train step with its own state; calling it runs one step and blocks."""

  def __init__(self, name: str, step: steps.Step):
    self.name = name
    start = time.perf_counter()
    lowered = step.lower()
    self.lower_s = time.perf_counter() - start
    start = time.perf_counter()
    self.compiled = lowered.compile()
    self.compile_s = time.perf_counter() - start
    self.memory = memory_stats(self.compiled)
    self.state, self.batch, self.rng = step.state, step.batch, step.rng
    self.metrics = None

  def __call__(self) -> None:
    self.state, self.metrics = self.compiled(self.state, self.batch, self.rng)
    jax.block_until_ready((self.state, self.metrics))

  def loss(self) -> float:
    """Mean MLM loss of the last step (the project's step reports sums)."""
    if self.metrics is None:
      return float('nan')
    return float(self.metrics['mlm_loss_sum']) / max(float(self.metrics['mlm_weight']), 1.0)

  def grad_norm(self) -> float:
    """The global gradient norm of the last step: what the backward kernels computed."""
    if self.metrics is None:
      return float('nan')
    return float(self.metrics['grad_norm'])


def memory_stats(compiled) -> dict:
  """Bytes from XLA's buffer assignment. peak = arguments + outputs + temporaries - aliased
  (donated inputs that outputs reuse): what the step needs resident at once."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pragma: no cover - backends without memory analysis
    return {}
  if m is None:
    return {}
  stats = {
    k: int(getattr(m, f'{k}_size_in_bytes', 0))
    for k in ('argument', 'output', 'temp', 'alias', 'generated_code')
  }
  stats['peak'] = stats['argument'] + stats['output'] + stats['temp'] - stats['alias']
  return stats


def build_step(
  shape: steps.Shape,
  which: str,
  dropout: float,
  *,
  abstract: bool = False,
  dtype: str = 'float32',
  **overrides,
) -> steps.Step:
  batch = steps.make_batch(shape)
  if which == 'hf':
    return steps.make_hf_step(
      steps.hf_bert_config(shape, dropout=dropout),
      steps.train_config(shape, dropout=dropout),
      batch,
      abstract=abstract,
      dtype=dtype,
    )
  config = steps.train_config(shape, ln_placement=which, dropout=dropout, dtype=dtype, **overrides)
  return steps.make_project_step(config, batch, abstract=abstract)


def device_peak_bytes() -> Optional[int]:
  """The device's own high-water mark so far (GPU / TPU `memory_stats`; None on CPU)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')

"""Timing helpers: interleaved rounds, robust summaries, the machine's matmul peak.

Everything here is measured in rounds: one step of every candidate per round, the order
rotated each round, so that a burst of load from other processes hits all candidates alike.
Ratios are taken per round (same few seconds of machine state) and then summarised.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Summary:
  """Median and spread of a sample. `iqr` is (q25, q75); `n` the sample size."""

  median: float
  q25: float
  q75: float
  lo: float
  hi: float
  n: int

  @classmethod
  def of(cls, values: Sequence[float]) -> 'Summary':
    xs = np.asarray([v for v in values if v is not None], np.float64)
    if xs.size == 0:
      nan = float('nan')
      return cls(nan, nan, nan, nan, nan, 0)
    q25, med, q75 = np.percentile(xs, [25, 50, 75])
    return cls(float(med), float(q25), float(q75), float(xs.min()), float(xs.max()), xs.size)

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class Candidate:
  """Something to time once per round: `run()` does one unit of work and blocks on it."""

  name: str
  run: Callable[[], None]
  times: list = dataclasses.field(default_factory=list)


def time_once(fn: Callable[[], None]) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def interleave(
  candidates: Sequence[Candidate],
  rounds: int,
  warmup: int = 1,
  on_round: Callable[[int], None] | None = None,
) -> None:
  """Runs `warmup` untimed rounds, then `rounds` timed ones, rotating the order each round."""
  for _ in range(warmup):
    for c in candidates:
      c.run()
  k = len(candidates)
  for r in range(rounds):
    order = [candidates[(i + r) % k] for i in range(k)]
    for c in order:
      c.times.append(time_once(c.run))
    if on_round is not None:
      on_round(r)


class MatmulPeak:
  """A jitted n^3 matmul in `dtype` (float32 on CPU, bfloat16 on accelerators), the yardstick
  for model FLOPs utilisation."""

  def __init__(self, n: int = 2048, dtype: str = 'float32', seed: int = 0):
    self.n = n
    key_a, key_b = jax.random.split(jax.random.key(seed))
    self.a = jax.random.normal(key_a, (n, n), dtype)
    self.b = jax.random.normal(key_b, (n, n), dtype)
    self.fn = jax.jit(jnp.matmul)
    self.fn(self.a, self.b).block_until_ready()

  def measure(self, repeats: int = 3) -> float:
    """Best FLOP/s of `repeats` calls (a peak, so the best; load only slows it down)."""
    best = min(
      time_once(lambda: self.fn(self.a, self.b).block_until_ready()) for _ in range(repeats)
    )
    return 2 * self.n**3 / best


def per_round_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> list:
  return [a / b for a, b in zip(numerators, denominators) if b > 0 and math.isfinite(a / b)]


def median(xs: Sequence[float]) -> float:
  return statistics.median(xs) if xs else float('nan')

"""Small-sample statistics for experiments: means with Student-t confidence intervals.

    summary = mean_ci([61.2, 61.9, 60.8])            # Summary(mean, half_width, n, values)
    format_ci(summary, digits=2)                     # '61.30 ± 1.38'
    paired_diff_ci(realformer, post)                 # per-seed differences, same seeds paired
    welch_diff_ci(a, b)                              # unpaired difference (Welch)

No SciPy: the t quantile comes from the regularised incomplete beta function (continued
fraction, Numerical Recipes 6.4) and bisection; tests check it against tabulated values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Summary:
  mean: float
  half_width: float  # the interval is mean ± half_width (nan for one value)
  n: int
  values: tuple[float, ...]

  @property
  def low(self) -> float:
    return self.mean - self.half_width

  @property
  def high(self) -> float:
    return self.mean + self.half_width

  def as_dict(self) -> dict:
    return {'mean': self.mean, 'ci95_half_width': self.half_width, 'low': self.low,
            'high': self.high, 'n': self.n, 'values': list(self.values)}


def _betacf(a: float, b: float, x: float) -> float:
  tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
  c, d = 1.0, 1.0 - qab * x / qap
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, 300):
    m2 = 2 * m
    aa = m * (b - m) * x / ((qam + m2) * (a + m2))
    d = 1.0 + aa * d
    d = 1.0 / (d if abs(d) > tiny else tiny)
    c = 1.0 + aa / c
    c = c if abs(c) > tiny else tiny
    h *= d * c
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
    d = 1.0 + aa * d
    d = 1.0 / (d if abs(d) > tiny else tiny)
    c = 1.0 + aa / c
    c = c if abs(c) > tiny else tiny
    delta = d * c
    h *= delta
    if abs(delta - 1.0) < 1e-15:
      break
  return h


def _betainc(a: float, b: float, x: float) -> float:
  """Regularised incomplete beta I_x(a, b)."""
  if x <= 0.0:
    return 0.0
  if x >= 1.0:
    return 1.0
  log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
               + a * math.log(x) + b * math.log1p(-x))
  if x < (a + 1.0) / (a + b + 2.0):
    return math.exp(log_front) * _betacf(a, b, x) / a
  return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
  """P(T <= t) for Student's t with `df` (> 0, not necessarily integer) degrees of freedom."""
  tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
  return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
  """The p-quantile of Student's t (bisection on t_cdf; |error| < 1e-10)."""
  if not 0.0 < p < 1.0:
    raise ValueError(f'p={p}: must be in (0, 1)')
  if p < 0.5:
    return -t_quantile(1.0 - p, df)
  low, high = 0.0, 1.0
  while t_cdf(high, df) < p:
    high *= 2.0
  for _ in range(200):
    mid = 0.5 * (low + high)
    if t_cdf(mid, df) < p:
      low = mid
    else:
      high = mid
    if high - low < 1e-12:
      break
  return 0.5 * (low + high)


def mean_ci(values: Sequence[float], level: float = 0.95) -> Summary:
  """Mean and the Student-t interval mean ± t_{(1+level)/2, n-1} * s / sqrt(n)."""
  values = tuple(float(v) for v in values)
  if not values:
    raise ValueError('mean_ci needs at least one value')
  n = len(values)
  mean = sum(values) / n
  if n == 1:
    return Summary(mean, math.nan, 1, values)
  variance = sum((v - mean) ** 2 for v in values) / (n - 1)
  half = t_quantile(0.5 + level / 2.0, n - 1) * math.sqrt(variance / n)
  return Summary(mean, half, n, values)


def paired_diff_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Summary:
  """Interval for mean(a - b) from per-seed differences (a[i], b[i] share seed i)."""
  if len(a) != len(b):
    raise ValueError(f'paired_diff_ci: {len(a)} values vs {len(b)}: pair them by seed')
  return mean_ci([x - y for x, y in zip(a, b)], level)


def welch_diff_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Summary:
  """Interval for mean(a) - mean(b) of independent samples (Welch-Satterthwaite df)."""
  sa, sb = mean_ci(a, level), mean_ci(b, level)
  if sa.n < 2 or sb.n < 2:
    return Summary(sa.mean - sb.mean, math.nan, min(sa.n, sb.n), ())
  va = sum((v - sa.mean) ** 2 for v in sa.values) / (sa.n - 1) / sa.n
  vb = sum((v - sb.mean) ** 2 for v in sb.values) / (sb.n - 1) / sb.n
  if va + vb == 0:
    return Summary(sa.mean - sb.mean, 0.0, min(sa.n, sb.n), ())
  df = (va + vb) ** 2 / (va ** 2 / (sa.n - 1) + vb ** 2 / (sb.n - 1))
  half = t_quantile(0.5 + level / 2.0, df) * math.sqrt(va + vb)
  return Summary(sa.mean - sb.mean, half, min(sa.n, sb.n), ())


def format_ci(summary: Summary, digits: int = 2, scale: float = 1.0) -> str:
  """'mean ± half_width' (values times `scale`, e.g. 100 for percentages)."""
  if math.isnan(summary.half_width):
    return f'{summary.mean * scale:.{digits}f}'
  return f'{summary.mean * scale:.{digits}f} ± {summary.half_width * scale:.{digits}f}'


def interval_verdict(diff: Summary) -> str:
  """'higher' / 'lower' when the interval of a difference excludes 0, else 'inconclusive'."""
  if math.isnan(diff.half_width):
    return 'inconclusive'
  if diff.low > 0:
    return 'higher'
  if diff.high < 0:
    return 'lower'
  return 'inconclusive'

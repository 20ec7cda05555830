"""Small-sample statistics for experiments: means with Student-t confidence intervals.

    summary = mean_ci([61.2, 61.9, 60.8])            # Summary(mean, half_width, n, values)
    format_ci(summary, digits=2)                     # '61.30 ± 1.38'
    paired_diff_ci(realformer, post)                 # per-seed differences, same seeds paired
    welch_diff_ci(a, b)                              # unpaired difference (Welch)
    paired_ratio_comparison(correct_a, correct_b, count)   # seeds + eval-set bootstrap
    holm([p1, p2, p3])                               # Holm-adjusted p-values
    holm_levels([p1, p2, p3])                        # the level each p is tested at
    boschloo_exact(0, 4, 4, 4)                       # two failure fractions (exact test)
    power(comparison, 0.003, level=1 - 0.05 / 2)     # chance to detect a true difference
    p_verdict(mean, p, expected_sign=+1)             # 'holds' / 'does not hold' / 'inconclusive'

No SciPy: the t quantile comes from the regularised incomplete beta function (continued
fraction, Numerical Recipes 6.4) and bisection; tests check it against tabulated values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np


class _Interval:
  """The ends and JSON form of an interval mean ± half_width over n values."""

  mean: float
  half_width: float
  n: int

  @property
  def low(self) -> float:
    return self.mean - self.half_width

  @property
  def high(self) -> float:
    return self.mean + self.half_width

  def _interval_dict(self, values: Sequence[float]) -> dict:
    return {
      'mean': self.mean,
      'ci95_half_width': self.half_width,
      'low': self.low,
      'high': self.high,
      'n': self.n,
      'values': list(values),
    }


@dataclasses.dataclass(frozen=True)
class Summary(_Interval):
  mean: float
  half_width: float  # the interval is mean ± half_width (nan for one value)
  n: int
  values: tuple[float, ...]

  def as_dict(self) -> dict:
    return self._interval_dict(self.values)


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
  log_front = (
    math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
  )
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
  df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
  half = t_quantile(0.5 + level / 2.0, df) * math.sqrt(va + vb)
  return Summary(sa.mean - sb.mean, half, min(sa.n, sb.n), ())


def format_ci(summary: Summary, digits: int = 2, scale: float = 1.0) -> str:
  """'mean ± half_width' (values times `scale`, e.g. 100 for percentages)."""
  if math.isnan(summary.half_width):
    return f'{summary.mean * scale:.{digits}f}'
  return f'{summary.mean * scale:.{digits}f} ± {summary.half_width * scale:.{digits}f}'


def verdict(mean: float, significant: bool, expected_sign: int = 0) -> str:
  """The verdict of a difference a - b: 'inconclusive' unless `significant`; else 'holds' /
  'does not hold' as its sign is `expected_sign` (+1 / -1) or not, or 'higher' / 'lower'
  where no sign is expected (0)."""
  if not significant:
    return 'inconclusive'
  direction = 1 if mean > 0 else -1
  if expected_sign == 0:
    return 'higher' if direction > 0 else 'lower'
  return 'holds' if direction == expected_sign else 'does not hold'


def p_verdict(mean: float, p_value: float, expected_sign: int = 0, alpha: float = 0.05) -> str:
  """`verdict`, significant when p < alpha (Holm-adjusted p where the test is in a family)."""
  return verdict(mean, p_value < alpha, expected_sign)


def interval_verdict(diff: Summary, expected_sign: int = 0) -> str:
  """`verdict`, significant when the interval of the difference excludes 0 (never for one
  value: its half-width is nan)."""
  return verdict(diff.mean, diff.low > 0 or diff.high < 0, expected_sign)


def t_p_value(estimate: float, standard_error: float, df: float) -> float:
  """Two-sided p-value of estimate / standard_error under Student's t with `df`."""
  if not standard_error > 0:
    return 0.0 if estimate != 0 else 1.0
  return 2.0 * (1.0 - t_cdf(abs(estimate) / standard_error, df))


@dataclasses.dataclass(frozen=True)
class PairedComparison(_Interval):
  """mean over seeds of a - b, with an interval for seeds AND eval-set sampling."""

  mean: float
  half_width: float  # 95%: t_{n-1} * sqrt(seed variance / n + eval-set bootstrap variance)
  p_value: float
  n: int  # seeds
  per_seed: tuple[float, ...]
  seed_se: float  # standard error from the seeds alone
  eval_se: float  # bootstrap standard error over eval sequences (seeds fixed)

  def as_dict(self) -> dict:
    return {
      **self._interval_dict(self.per_seed),
      'p_value': self.p_value,
      'seed_se': self.seed_se,
      'eval_se': self.eval_se,
    }


def paired_ratio_comparison(
  numer_a_SxN: np.ndarray,
  numer_b_SxN: np.ndarray,
  denom_N: np.ndarray,
  *,
  resamples: int = 2000,
  seed: int = 0,
  level: float = 0.95,
) -> PairedComparison:
  """Compares a ratio metric (e.g. accuracy at [MASK] = correct / count) of two models.

  Row s of `numer_a_SxN` / `numer_b_SxN` holds per-eval-sequence sums of the two models
  trained with seed s (paired: same data order, for Post-LN-based layouts the same initial
  weights), `denom_N` the sequences' counts (the same eval set for every run). Per seed,
  d_s = (sum a_s - sum b_s) / sum denom. The interval adds two variances: the seeds'
  (var(d) / n) and the eval set's, from resampling the N sequences with replacement (the same
  resample for every seed and both models; seeds fixed). Both contain the seed x sequence
  interaction, so the interval is conservative; t quantile with n - 1 degrees of freedom.
  """
  a, b = np.asarray(numer_a_SxN, np.float64), np.asarray(numer_b_SxN, np.float64)
  denom = np.asarray(denom_N, np.float64)
  if a.shape != b.shape or a.shape[1] != denom.shape[0]:
    raise ValueError(f'paired_ratio_comparison: shapes {a.shape}, {b.shape}, {denom.shape}')
  n = a.shape[0]
  diff_SxN = a - b
  per_seed = diff_SxN.sum(1) / denom.sum()
  mean = float(per_seed.mean())
  seed_se = float(per_seed.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
  rng = np.random.default_rng(seed)
  mean_diff_N = diff_SxN.mean(0)
  index_RxN = rng.integers(0, len(denom), (resamples, len(denom)))
  boot = mean_diff_N[index_RxN].sum(1) / denom[index_RxN].sum(1)
  eval_se = float(boot.std(ddof=1))
  if n < 2:
    return PairedComparison(mean, math.nan, math.nan, n, tuple(per_seed), seed_se, eval_se)
  se = math.sqrt(seed_se**2 + eval_se**2)
  half = t_quantile(0.5 + level / 2.0, n - 1) * se
  return PairedComparison(
    mean, half, t_p_value(mean, se, n - 1), n, tuple(float(v) for v in per_seed), seed_se, eval_se
  )


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm-Bonferroni adjusted p-values (same order): reject H_i at level a iff adjusted <= a."""
  order = sorted(range(len(p_values)), key=lambda i: p_values[i])
  adjusted = [0.0] * len(p_values)
  running = 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
    adjusted[i] = running
  return adjusted


def holm_levels(p_values: Sequence[float], alpha: float = 0.05) -> list[float]:
  """The level Holm's step-down compares each p-value with (same order): alpha / (m - rank),
  rank 0 for the smallest p. `holm` and these agree: adjusted p < alpha iff every p up to this
  one in the order is below its level."""
  order = sorted(range(len(p_values)), key=lambda i: p_values[i])
  levels = [0.0] * len(p_values)
  for rank, i in enumerate(order):
    levels[i] = alpha / (len(p_values) - rank)
  return levels


def power(comparison: PairedComparison, difference: float, level: float = 0.95) -> float:
  """The chance that a design like `comparison`'s (its seeds, its measured standard error)
  finds a true `difference` significant in a two-sided test at 1 - `level`: the shifted-t
  approximation `detectable_difference` inverts (power(c, detectable_difference(c)) = 0.8
  up to the far tail)."""
  if comparison.n < 2:
    return math.nan
  se = math.sqrt(comparison.seed_se**2 + comparison.eval_se**2)
  if not se > 0:  # no spread at all (e.g. runs that never left the floor): any gap shows
    return 1.0 if difference != 0 else 1.0 - level
  df = comparison.n - 1
  critical = t_quantile(0.5 + level / 2.0, df)
  return t_cdf(difference / se - critical, df) + t_cdf(-difference / se - critical, df)


def detectable_difference(
  comparison: PairedComparison, power: float = 0.8, level: float = 0.95
) -> float:
  """The smallest true difference a design like `comparison`'s (its seeds, its measured
  standard error) detects with probability `power` in a two-sided test at 1 - `level`:
  (t_{(1+level)/2} + t_{power}) * SE, Student's t with n - 1 degrees of freedom."""
  if comparison.n < 2:
    return math.nan
  se = math.sqrt(comparison.seed_se**2 + comparison.eval_se**2)
  df = comparison.n - 1
  return (t_quantile(0.5 + level / 2.0, df) + t_quantile(power, df)) * se


# Boschloo's exact test (no SciPy here: tests check it against scipy.stats.boschloo_exact).


def _hypergeom_cdf(k: int, total: int, successes: int, draws: int) -> float:
  """P(X <= k), X the successes among `draws` drawn from `total` holding `successes`."""
  low = max(0, draws - (total - successes))
  norm = math.comb(total, draws)
  return (
    sum(
      math.comb(successes, i) * math.comb(total - successes, draws - i)
      for i in range(low, min(k, successes, draws) + 1)
    )
    / norm
  )


def _boschloo_one_sided(x1: int, n1: int, x2: int, n2: int) -> float:
  """H1: group 1's rate is below group 2's. The statistic is Fisher's one-sided p-value
  P(X1 <= x1 | x1 + x2); the p-value its supremum over the common rate pi of
  P(statistic <= observed), on a grid of pi fine enough for a handful of runs a side."""
  fisher = np.array(
    [[_hypergeom_cdf(a, n1 + n2, a + b, n1) for b in range(n2 + 1)] for a in range(n1 + 1)]
  )
  extreme = fisher <= fisher[x1, x2] * (1 + 1e-13)  # scipy's guard against rounding
  pi = np.linspace(0.0, 1.0, 20001)

  def pmf(n):  # (n + 1, grid): P(X = k | pi), X ~ Binomial(n, pi)
    k = np.arange(n + 1)[:, None]
    return np.array([math.comb(n, int(i)) for i in k[:, 0]])[:, None] * pi**k * (1 - pi) ** (n - k)

  prob = np.einsum('ag,bg,ab->g', pmf(n1), pmf(n2), extreme.astype(np.float64))
  return float(min(1.0, prob.max()))


def boschloo_exact(x1: int, n1: int, x2: int, n2: int) -> float:
  """Two-sided p-value of Boschloo's exact test that two binomial rates are equal (x1 of n1
  against x2 of n2): twice the smaller one-sided p-value, as scipy.stats.boschloo_exact."""
  if n1 < 1 or n2 < 1 or not (0 <= x1 <= n1 and 0 <= x2 <= n2):
    raise ValueError(f'boschloo_exact: {x1} of {n1} against {x2} of {n2}')
  if x1 + x2 in (0, n1 + n2):
    return 1.0
  less = _boschloo_one_sided(x1, n1, x2, n2)
  greater = _boschloo_one_sided(n1 - x1, n1, n2 - x2, n2)
  return float(min(1.0, 2 * min(less, greater)))

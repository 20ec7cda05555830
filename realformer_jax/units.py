"""Units shared by the memory budgets, estimates, reports and progress lines: bytes (decimal GB /
TB rates of a datasheet stay where they are quoted, realformer_jax/aot/targets.py) and how a
duration reads on the console."""

GiB = 2**30


def format_duration(seconds: float) -> str:
  """'1h05m' or '4m07s'; '?' before anything was measured (nan or inf)."""
  if seconds != seconds or seconds == float('inf'):
    return '?'
  seconds = int(round(max(seconds, 0.0)))
  hours, rest = divmod(seconds, 3600)
  return f'{hours}h{rest // 60:02d}m' if hours else f'{rest // 60}m{rest % 60:02d}s'

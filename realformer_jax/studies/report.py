"""What the studies' reports share: the table cell of a per-seed metric, the layouts' names
and plot colours, and writing a study's results.json, results.md and plots.

    seed_cell([0.6121, 0.6190, 0.6082], scale=100)   # '61.31 ± 1.36 (61.21, 61.90, 60.82)'
    write_results(args.out, record, lambda path: write_markdown(path, ...), lambda: plots(...))
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping, Optional, Sequence

from realformer_jax.studies import runs as runs_lib
from realformer_jax.studies import stats

LAYOUT_NAMES = {'post': 'Post-LN', 'pre': 'Pre-LN', 'realformer': 'RealFormer'}
LAYOUT_COLORS = {'post': 'tab:blue', 'pre': 'tab:green', 'realformer': 'tab:red'}


def seed_cell(values: Sequence[float], digits: int = 2, scale: float = 1.0) -> str:
  """'mean ± half-width (per-seed values)': the 95% Student-t interval over the finite values,
  then every seed's value ('diverged' where it is not finite), all times `scale` (100 for
  percentages). With fewer than two finite values only the per-seed list ('n/a': none)."""
  finite = [v for v in values if math.isfinite(v)]
  per_seed = ', '.join(
    'diverged' if not math.isfinite(v) else f'{v * scale:.{digits}f}' for v in values
  )
  if len(finite) < 2:
    return per_seed or 'n/a'
  return f'{stats.format_ci(stats.mean_ci(finite), digits, scale)} ({per_seed})'


def difference_cell(comparison: Optional[Mapping[str, float]]) -> str:
  """A paired comparison's (stats.PairedComparison.as_dict) 'mean ± half-width' in percentage
  points; 'n/a' without one."""
  if not comparison:
    return 'n/a'
  return f'{100 * comparison["mean"]:+.2f} ± {100 * comparison["ci95_half_width"]:.2f}'


def comparison_cells(row: Mapping[str, Any]) -> tuple[str, str, str]:
  """The difference, p and Holm-adjusted p cells of a table row that holds a paired
  comparison (row['comparison']; row['holm_p_value'] where its family was adjusted): p-values
  to 3 significant figures, 'n/a' where there is none."""
  comparison = row['comparison']
  p = 'n/a' if comparison is None else f'{comparison["p_value"]:.3g}'
  holm = f'{row["holm_p_value"]:.3g}' if 'holm_p_value' in row else 'n/a'
  return difference_cell(comparison), p, holm


def write_lines(path: str, lines: Sequence[str]) -> None:
  """A markdown report, one string a line."""
  with open(path, 'w') as f:
    f.write('\n'.join(lines))


def write_results(
  out: str, record: dict, markdown: Callable[[str], Any], plots: Callable[[], Sequence[str]] = tuple
) -> None:
  """A study's report in `out`: `record` as results.json, `markdown(path)` writes results.md,
  then `plots()` draws (the paths it wrote; none without matplotlib); prints what was written."""
  runs_lib.write_json(os.path.join(out, 'results.json'), record)
  markdown_path = os.path.join(out, 'results.md')
  markdown(markdown_path)
  drawn = plots()
  written = [markdown_path] if os.path.exists(markdown_path) else []
  print(f'wrote {", ".join(written + list(drawn)) or os.path.join(out, "results.json")}')

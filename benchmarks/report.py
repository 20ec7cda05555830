"""The benchmark's results: a flat list of rows, printed as tables and optionally saved as JSON,
plus the machine they were measured on."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

from benchmarks.timing import Summary


@dataclasses.dataclass
class Row:
  section: str
  metric: str
  unit: str
  summary: Summary
  note: str = ''

  def as_dict(self) -> dict:
    return {
      'section': self.section,
      'metric': self.metric,
      'unit': self.unit,
      'note': self.note,
      **self.summary.as_dict(),
    }


class Report:
  def __init__(self, out: Callable[[str], None] = print):
    self.rows: list[Row] = []
    self.targets: list[dict] = []
    self.meta: dict = {}
    self.out = out

  def add(self, section: str, metric: str, unit: str, values, note: str = '') -> Row:
    summary = (
      values
      if isinstance(values, Summary)
      else Summary.of(values if isinstance(values, (list, tuple)) else [values])
    )
    row = Row(section, metric, unit, summary, note)
    self.rows.append(row)
    return row

  def print_section(self, section: str, title: str) -> None:
    rows = [r for r in self.rows if r.section == section]
    self.out(f'\n== {title}')
    self.out(f'{"metric":44s} {"median":>10s} {"IQR":>21s} {"min-max":>21s} {"n":>3s}  unit')
    for r in rows:
      s = r.summary
      spread = lambda a, b: f'{fmt(a)}-{fmt(b)}' if s.n > 1 else '-'
      self.out(
        f'{r.metric:44s} {fmt(s.median):>10s} {spread(s.q25, s.q75):>21s} '
        f'{spread(s.lo, s.hi):>21s} {s.n:>3d}  {r.unit}' + (f'  ({r.note})' if r.note else '')
      )

  def target(
    self,
    name: str,
    text: str,
    value: float,
    limit: float,
    at_least: bool,
    spread: Optional[Summary] = None,
    applicable: bool = True,
  ) -> None:
    ok = (value >= limit) if at_least else (value <= limit)
    status = ('PASS' if ok else 'MISS') if math.isfinite(value) else 'MISS'
    if not applicable:
      status = 'INFO'
    cmp = '>=' if at_least else '<='
    extra = f' (IQR {fmt(spread.q25)}-{fmt(spread.q75)})' if spread and spread.n > 1 else ''
    line = f'{status}  {text}: {fmt(value)}{extra} {cmp} {limit}'
    self.targets.append(
      {
        'target': name,
        'status': status,
        'text': text,
        'value': value,
        'limit': limit,
        'at_least': at_least,
      }
    )
    self.out(line)

  def as_dict(self) -> dict:
    return {'meta': self.meta, 'rows': [r.as_dict() for r in self.rows], 'targets': self.targets}


def fmt(x: float) -> str:
  if x is None or not math.isfinite(x):
    return 'nan'
  a = abs(x)
  if a >= 1e5:
    return f'{x:.3g}'
  if a >= 100:
    return f'{x:.0f}'
  if a >= 10:
    return f'{x:.1f}'
  if a >= 1:
    return f'{x:.2f}'
  return f'{x:.3f}'

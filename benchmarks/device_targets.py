"""Issues 57's and 64's targets on one H100 / H200, judged PASS / MISS per row the device suite
measured (benchmarks/device_suite.py) or a predictions file estimated
(benchmarks/device_predictions.py, labelled ESTIMATED: judged against the issue's ESTIMATED
bound where it set one). One table: the suite, the predictions and the docs read it.

Long rows: BERT-Base, batch 1, bf16, every layer rematerialised, dropout 0.1. Step rows:
BERT-Large 32 x 512, bf16, against Hugging Face's Flax BERT measured in the same run. MFU is
model FLOPs (benchmarks/flops.py) over the step over the ONE stated peak,
realformer_jax/aot/targets.mfu_peak_flops (989.4 TFLOP/s dense bf16 for H100 / H200 SXM).
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Target:
  name: str  # the figure's key
  text: str
  limit: Optional[float]  # what a MEASURED figure must reach (None: judged estimated only)
  at_most: bool  # PASS when the figure is <= limit (else >=)
  unit: str = 's'
  # What an ESTIMATED figure must reach, where an issue set its own deviceless bound (issue 64:
  # Post-LN 65,536 <= 3.6 s, qk 65,536 <= 8.5 s, BERT-Large RealFormer <= 115 ms); else `limit`.
  estimated_limit: Optional[float] = None

  def bound(self, label: str = 'MEASURED') -> Optional[float]:
    if label == 'ESTIMATED' and self.estimated_limit is not None:
      return self.estimated_limit
    return self.limit

  def verdict(self, value: Optional[float], label: str = 'MEASURED') -> str:
    if value is None or value != value:
      return 'NOT MEASURED'
    limit = self.bound(label)
    ok = value <= limit if self.at_most else value >= limit
    return 'PASS' if ok else 'MISS'

  def line(self, value: Optional[float], label: str = 'MEASURED') -> str:
    bound = f'{"<=" if self.at_most else ">="} {_fmt(self.bound(label), self.unit)}'
    shown = _fmt(value, self.unit) if value is not None and value == value else '-'
    return f'{self.verdict(value, label)} ({label}) {self.text} {bound}: {shown}'


def _fmt(value: float, unit: str) -> str:
  if unit == 's':
    return f'{value * 1e3:.1f} ms' if value < 1 else f'{value:.2f} s'
  return f'{value:.2f}{unit}'


LARGE = 'bert_large_512'
TARGETS = (
  Target('post_65536_s', 'Post-LN step, L = 65,536', 3.0, True, estimated_limit=3.6),
  Target('qk_65536_s', 'RealFormer qk step, L = 65,536', 6.6, True, estimated_limit=8.5),
  Target('qk_65536_first_s', 'RealFormer qk first step, L = 65,536', 8.0, True),
  Target('qk_131072_s', 'RealFormer qk step, L = 131,072, one H200 (fits)', 40.0, True),
  Target('large_post_s', 'BERT-Large 32 x 512 Post-LN step', 0.085, True),
  Target('large_realformer_s', 'BERT-Large 32 x 512 RealFormer step', None, True, 's', 0.115),
  Target('large_post_stretch_s', 'BERT-Large 32 x 512 Post-LN step (stretch)', 0.075, True),
  Target(
    'large_post_mfu', 'BERT-Large 32 x 512 Post-LN MFU of the datasheet peak', 0.39, False, ''
  ),
  Target(
    'large_post_vs_hf', 'BERT-Large 32 x 512 tokens/s Post-LN / Hugging Face', 1.5, False, 'x'
  ),
)


def step_figures(shape_name: str, step_s: dict, mfu: dict) -> dict:
  """The step table's figures for the targets: {target name: value} of one shape's medians."""
  if shape_name != LARGE or 'post' not in step_s:
    return {}
  figures = {
    'large_post_s': step_s['post'],
    'large_post_stretch_s': step_s['post'],
    'large_realformer_s': step_s.get('realformer'),
    'large_post_mfu': mfu.get('post'),
  }
  if step_s.get('hf'):
    figures['large_post_vs_hf'] = step_s['hf'] / step_s['post']
  return figures


def long_figures(rows: list[dict]) -> dict:
  """The long part's figures for the targets, from rows with `length`, `variant`, `step_s`
  (and `first_step_s`); candidate-tile rows are not the table's own and do not count."""
  figures = {}
  for row in rows:
    if row.get('qk_ds_tile') or row.get('post_bwd_tile') or row.get('step_s') is None:
      continue
    # Post-LN: the faster of its masks stored and drawn (what 'auto' takes where both fit)
    key = {'post': 'post', 'post stored': 'post', 'post drawn': 'post', 'realformer qk': 'qk'}.get(
      row['variant']
    )
    if key is None or row['length'] not in (65536, 131072):
      continue
    if key == 'post' and row['length'] != 65536:
      continue
    name = f'{key}_{row["length"]}_s'
    figures[name] = min(row['step_s'], figures.get(name, row['step_s']))
    if key == 'qk' and row['length'] == 65536 and row.get('first_step_s') is not None:
      figures['qk_65536_first_s'] = row['first_step_s']
  return figures


def lines(figures: dict, label: str = 'MEASURED') -> list[str]:
  """One PASS / MISS line per target the figures cover and `label` judges."""
  return [
    t.line(figures[t.name], label)
    for t in TARGETS
    if t.name in figures and t.bound(label) is not None
  ]

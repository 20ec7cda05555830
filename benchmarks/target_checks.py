"""The targets a run is judged against, printed as PASS / MISS (INFO where the profile or the
backend is not the one a target is about). Nothing here fails a run."""

from __future__ import annotations

import jax
import numpy as np

from benchmarks.profiles import ACCELERATOR_TARGETS, LARGE_512, PROFILES, TARGETS, Profile
from benchmarks.report import Report
from benchmarks.timing import Summary


def _mfu_post(res: dict) -> list[float]:
  """Per round: the post model's FLOPs / step time / the datasheet peak of a known accelerator
  (aot/targets.mfu_peak_flops), else the matmul peak measured beside it (a CPU)."""
  peaks = [res['mfu_peak']] * len(res['times']['post']) if res.get('mfu_peak') else None
  return [
    res['model_flops'] / t / p for t, p in zip(res['times']['post'], peaks or res['peaks']['post'])
  ]


def cpu_targets(
  report: Report, profile: Profile, profile_name: str, train: dict, compile_results: dict
) -> None:
  applicable = profile == PROFILES['full']
  report.out(
    '\nTargets'
    + ('' if applicable else f' ({profile_name} profile, changed or reduced: INFO only)')
  )
  ratio_checks = (  # target, what is measured, the ratio in `train`, at least (else at most)
    ('tokens_per_s_vs_hf', 'tokens/s post / HF', 'post_vs_hf', True),
    ('realformer_over_post', 'step time realformer / post', 'realformer_vs_post', False),
  )
  for target, text, ratio, at_least in ratio_checks:
    for name, res in train.items():
      s = Summary.of(res['ratios'][ratio])
      report.target(target, f'{text} at {name}', s.median, TARGETS[target], at_least, s, applicable)
  if compile_results:
    lo, hi = min(profile.compile_layers), max(profile.compile_layers)
    growth = np.median(compile_results[('scanned', hi)]) / np.median(
      compile_results[('scanned', lo)]
    )
    report.target(
      'scan_compile_growth',
      f'scanned compile time {hi} / {lo} layers',
      float(growth),
      TARGETS['scan_compile_growth'],
      False,
      None,
      applicable,
    )
  if train:
    name = 'bert_base' if 'bert_base' in train else list(train)[-1]
    res = train[name]
    s = Summary.of(_mfu_post(res))
    report.target(
      'mfu_bert_base',
      f'MFU post at {name}',
      s.median,
      TARGETS['mfu_bert_base'],
      True,
      s,
      applicable and name == 'bert_base',
    )


def accelerator_targets(report: Report, profile: Profile, profile_name: str, train: dict) -> None:
  """Issue targets at BERT-Large 32 x 512 on one accelerator (INFO on CPU or other shapes)."""
  name = LARGE_512.name if LARGE_512.name in train else (list(train)[-1] if train else None)
  applicable = (
    profile == PROFILES['accelerator'] and jax.default_backend() != 'cpu' and name == LARGE_512.name
  )
  report.out(
    '\nTargets (one accelerator, BERT-Large 32 x 512, bf16)'
    + ('' if applicable else f' ({profile_name} profile on {jax.default_backend()}: INFO only)')
  )
  if name is None:
    return
  res = train[name]
  checks = (
    (
      'large_tokens_per_s_vs_hf',
      f'tokens/s post / HF at {name}',
      res['ratios']['post_vs_hf'],
      True,
    ),
    ('large_mfu_post', f'MFU post (of the datasheet bf16 peak) at {name}', _mfu_post(res), True),
    (
      'large_realformer_over_post',
      f'step time realformer / post at {name}',
      res['ratios']['realformer_vs_post'],
      False,
    ),
    ('large_pre_over_post', f'step time pre / post at {name}', res['ratios']['pre_vs_post'], False),
  )
  for target, text, values, at_least in checks:
    s = Summary.of(values)
    report.target(target, text, s.median, ACCELERATOR_TARGETS[target], at_least, s, applicable)

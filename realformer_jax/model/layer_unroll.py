"""model.scan_unroll='auto': the layer scan fully unrolled where it pays, rolled elsewhere.

A rolled scan (one layer per loop trip) slices each layer's weights out of the stacked
parameters and stacks its activations and gradients back, every trip: on a GPU those copies
and layout changes cost BERT-Large 32 x 512 ~11 ms of a 92 ms step (ESTIMATED for an H200,
docs/results/device_suite/predictions-2026-12-07). Unrolled, XLA sees every layer at once
and the copies go; the compile takes longer, about one layer body's compile more per layer.

'auto' unrolls fully where all of these hold, else keeps the scan rolled:
- a GPU (the attention platform): where the saving was estimated. On a CPU the copies are
  cheap next to the step and an unrolled compile only slows the tests; a TPU program has no
  estimate unrolled yet.
- the estimated unrolled compile on the accelerator's host fits COMPILE_BUDGET_S:
  ROLLED_COMPILE_S + (num_layers - 1) x COMPILE_S_PER_LAYER, fitted to BERT-Large's
  deviceless compile for an H100 on 2 CPU cores, 58 s rolled -> ~229 s unrolled (issue 64;
  on the H100 itself ~25 -> ~165 s, docs FACTS). 24 layers fit; 48 would take ~7 min.
- model.max_len <= LONG_CONTEXT: beyond, a step takes seconds, the parameter-sized copies
  are under 1 % of it, and the memory rules that pick the remat masks and the residual carry
  (kernels/dropout/remat_masks.py, select.py) are fitted to the rolled program's measured peaks.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from realformer_jax.config import ModelConfig
from realformer_jax.kernels.plumbing import select

ROLLED_COMPILE_S = 58.0  # BERT-Large 32 x 512 train step, rolled, deviceless for an H100
COMPILE_S_PER_LAYER = (229.0 - 58.0) / 23  # each layer unrolled beyond the first: ~7.4 s
COMPILE_BUDGET_S = 240.0  # the longest compile 'auto' accepts on 2 CPU cores (~4 minutes)
LONG_CONTEXT = 4096  # model.max_len above which 'auto' stays rolled (module docstring)
UNROLLED_PLATFORMS = ('gpu',)


class UnrollChoice(NamedTuple):
  layers_per_iteration: int  # model.scan_unroll as the scan takes it
  reason: str  # for the fit line


def unrolled_compile_s(num_layers: int) -> float:
  """The estimated compile of a fully unrolled train step on 2 CPU cores (constants above)."""
  return ROLLED_COMPILE_S + (num_layers - 1) * COMPILE_S_PER_LAYER


def platform(config: ModelConfig) -> str:
  """The attention platform: the config's once resolved for a run (a deviceless target's
  too), else this process's default devices'."""
  if config.attention_platform != 'auto':
    return config.attention_platform
  return select.platform_of(jax.local_devices()[:1])


def choose(config: ModelConfig) -> UnrollChoice:
  """Layers per scan iteration for config.scan_unroll (an integer is kept), and why."""
  if config.scan_unroll != 'auto':
    return UnrollChoice(config.scan_unroll, 'set in the config')
  layers, where = config.num_layers, platform(config)
  rolled = 'rolled (1 layer per iteration)'
  if where not in UNROLLED_PLATFORMS:
    return UnrollChoice(1, f'{rolled}: on {where} unrolling pays only on a GPU')
  if config.max_len > LONG_CONTEXT:
    return UnrollChoice(
      1, f'{rolled}: model.max_len={config.max_len} > {LONG_CONTEXT}, a long-context step'
    )
  compile_s = unrolled_compile_s(layers)
  if compile_s > COMPILE_BUDGET_S:
    return UnrollChoice(
      1,
      f'{rolled}: {layers} layers unrolled would compile in ~{compile_s:.0f} s on 2 CPU '
      f'cores, over the {COMPILE_BUDGET_S:.0f} s budget',
    )
  return UnrollChoice(
    layers,
    f'fully unrolled ({layers} layers): on {where}, compile ~{compile_s:.0f} s estimated on '
    f'2 CPU cores (rolled ~{ROLLED_COMPILE_S:.0f} s), within the {COMPILE_BUDGET_S:.0f} s budget',
  )


def layers_per_iteration(config: ModelConfig) -> int:
  """The scan's `unroll` for config (choose)."""
  return choose(config).layers_per_iteration

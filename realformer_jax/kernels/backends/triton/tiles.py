"""Tile sizes, warps and stages of the Triton kernels per GPU: one table, read by the qk kernels
(qk_attention.py: forward and dS tiles) and by plain attention's kernels (attention.py,
post / pre: the forward, and the backward where a row names its tiles; the residual kernels
that carry a float32 sum keep the plan's tiles, whose extra float32 tile per step a wider
block would have to hold in registers too). Each row says which of its entries were timed on a
device (`measured`); the others are published configurations, unmeasured."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, NamedTuple, Optional

import jax


class Tiles(NamedTuple):
  block_q: int  # forward rows
  block_k: int  # forward columns
  block_bwd: int  # qk dS kernel: key rows a program owns
  warps: int  # of a forward on these tiles (and the qk dS kernel)
  stages: int
  ds_rows: int = 0  # qk dS kernel: query rows per step (0: block_bwd, a square tile)
  ds_warps: int = 0  # qk dS kernel's warps and stages (0: `warps`, `stages`)
  ds_stages: int = 0
  # Plain attention's backward: key rows a program owns (its dQ loop: query rows), rows per
  # step of its loops, warps, stages. 0 keys: the plan's square tile (64) with 4 warps and 2
  # stages, as measured on the H200 (2026-11-27).
  bwd_keys: int = 0
  bwd_rows: int = 0
  bwd_warps: int = 4
  bwd_stages: int = 2
  # Which of these entries were timed on a device, where and on which code; '' none: chosen
  # from published configurations, unmeasured.
  measured: str = ''


# By jax's `device_kind`; DEFAULT where the kind is not listed (and for deviceless compiles,
# which see no device: an H100's row). Hopper: 128 x 128 forward tiles with 8 warps and 3
# stages (one of the Triton fused-attention tutorial's Hopper configurations for K = 64). In
# the qk forward each score tile reloads the q and k tiles of l + 1 layers from L2, so the
# wider key block cuts those bytes by a third against 128 x 64 (the estimated forward:
# L2-bound either way); plain attention's forward halves its key-loop trips (its estimate,
# CUDA-core bound, does not change). The qk dS kernel: 64 keys a program x 128 query rows a
# step, taller than square to cut the stack's reloads per score element. Measured on an H200
# (2026-11-27, BERT-Base qk step at L = 65,536, `benchmarks.device_suite --qk_ds_tiles`): 64 x
# 64 11.31 s, 64 x 128 9.12 s, 128 x 128 11.73 s, the same loss to six digits (ptxas -v for
# sm_90a: 170, 248 and 255 registers, 128 x 128 spilling 208 bytes), all with the forward's 8
# warps and 3 stages; the dS kernel's own warps and stages were never varied, and the kernels
# timed then summed the layers' products with a wait and a scale per layer (before
# tile_math.summed_scores' one accumulator): the one-accumulator kernels are unmeasured. The
# H100 has the same SMs and L2: it takes the same row, not measured there. Plain attention's
# backward keeps the plan's square 64 x 64 tile with 4 warps and 2 stages: of the candidates
# timed beside it on that H200 (Post-LN step 4.00 s) 128 x 32 with 4 warps and 5 stages took
# 4.59 s, 128 x 128 with 8 warps and 2 stages 4.88 s, 128 x 64 (8, 2) 5.95 s and 64 x 64
# (8, 3) 6.22 s.
HOPPER = Tiles(128, 128, 64, 8, 3, ds_rows=128, ds_warps=8, ds_stages=3)
DEFAULT = HOPPER._replace(measured='none on an H100 (the H200 row: the same SMs and L2)')
TILES = {
  'NVIDIA H100 80GB HBM3': DEFAULT,
  'NVIDIA H200': HOPPER._replace(
    measured='H200, 2026-11-27, commit 43e232e (a wait and a scale per layer in the qk '
    'kernels): qk dS 64 x 128 with 8 warps, 3 stages (of 3 tiles); plain backward 64 x 64 '
    'with 4 warps, 2 stages (of 5 candidates); the forward tiles once, unvaried'
  ),
  'NVIDIA A100-SXM4-80GB': Tiles(128, 64, 64, 4, 2),  # unmeasured: Ampere's published tiles
  'NVIDIA A100-SXM4-40GB': Tiles(128, 64, 64, 4, 2),
}
# SMs of the GPU a deviceless compile is assumed to target (DEFAULT is an H100's row): the dS
# panels are sized to fill them (qk_attention.column_panels).
DEVICELESS_SMS = 132


_override: Optional[Tiles] = None


@contextlib.contextmanager
def override(tiles: Tiles) -> Iterator[None]:
  """Kernels traced inside take `tiles` instead of the table's row (benchmarks.device_suite's
  --qk_ds_tiles and --post_bwd_tiles: candidate tiles timed on the device in one call)."""
  global _override
  before, _override = _override, tiles
  try:
    yield
  finally:
    _override = before


def device_tiles() -> Tiles:
  """The row of TILES for the first device when it is a GPU, else DEFAULT (or the tiles of
  an `override` in force)."""
  if _override is not None:
    return _override
  device = jax.devices()[0]
  if device.platform != 'gpu':
    return DEFAULT
  return TILES.get(device.device_kind, DEFAULT)


def device_sms() -> int:
  """The first device's SMs when it is a GPU that reports them (`core_count`), else
  DEVICELESS_SMS."""
  device = jax.devices()[0]
  count = getattr(device, 'core_count', None) if device.platform == 'gpu' else None
  return count if isinstance(count, int) and count > 0 else DEVICELESS_SMS


def dividing(mine: int, plan: int, seq_len: int) -> int:
  """The table's tile where it divides the sequence, else the plan's."""
  return mine if seq_len % mine == 0 else plan


def with_device_tiles(spec, seq_len: int, qk_backward: bool = False):
  """`spec` (a KernelSpec) with the device's forward tiles, and its backward's: with
  `qk_backward` the qk dS kernel's (key rows and query rows), else plain attention's where
  the row names them; each where it divides the sequence (the plan's otherwise)."""
  tiles = device_tiles()
  fields = dict(
    block_q=dividing(tiles.block_q, spec.block_q, seq_len),
    block_k=dividing(tiles.block_k, spec.block_k, seq_len),
  )
  keys, rows = (tiles.block_bwd, tiles.ds_rows) if qk_backward else (tiles.bwd_keys, tiles.bwd_rows)
  if keys and seq_len % keys == 0 and (not rows or seq_len % rows == 0):
    fields['block_bwd'], fields['block_bwd_rows'] = keys, rows
  elif qk_backward:
    fields['block_bwd_rows'] = 0
  return dataclasses.replace(spec, **fields)

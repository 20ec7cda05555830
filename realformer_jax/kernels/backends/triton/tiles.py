"""Tile sizes, warps and stages of the Triton kernels per GPU: one table, read by the qk kernels
(qk_attention.py: forward and dS tiles) and by plain attention's forward (attention.py,
post / pre; the residual kernels that carry a float32 sum keep the plan's tiles, whose extra
float32 tile per step a wider block would have to hold in registers too)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax


class Tiles(NamedTuple):
  block_q: int  # forward rows
  block_k: int  # forward columns
  block_bwd: int  # qk dS kernel tiles (square)
  warps: int  # of a forward on these tiles (and the qk dS kernel)
  stages: int


# By jax's `device_kind`; DEFAULT where the kind is not listed (and for deviceless compiles,
# which see no device: an H100's row). Hopper: 128 x 128 forward tiles with 8 warps and 3
# stages (one of the Triton fused-attention tutorial's Hopper configurations for K = 64). In
# the qk forward each score tile reloads the q and k tiles of l + 1 layers from L2, so the
# wider key block cuts those bytes by a third against 128 x 64 (the estimated forward:
# L2-bound either way); plain attention's forward halves its key-loop trips (its estimate,
# CUDA-core bound, does not change). The qk dS kernel keeps 64 x 64 tiles (its registers hold
# dV and a dS tile besides the score tile; 128 x 128 would halve its reloads too, but risks
# register spills: to be measured).
DEFAULT = Tiles(128, 128, 64, 8, 3)
TILES = {
  'NVIDIA H100 80GB HBM3': DEFAULT,
  'NVIDIA H200': DEFAULT,
  'NVIDIA A100-SXM4-80GB': Tiles(128, 64, 64, 4, 2),
  'NVIDIA A100-SXM4-40GB': Tiles(128, 64, 64, 4, 2),
}


def device_tiles() -> Tiles:
  """The row of TILES for the first device when it is a GPU, else DEFAULT."""
  device = jax.devices()[0]
  if device.platform != 'gpu':
    return DEFAULT
  return TILES.get(device.device_kind, DEFAULT)


def dividing(mine: int, plan: int, seq_len: int) -> int:
  """The table's tile where it divides the sequence, else the plan's."""
  return mine if seq_len % mine == 0 else plan


def with_device_tiles(spec, seq_len: int, square: bool = False):
  """`spec` (a KernelSpec) with the device's forward tiles, and with `square` the qk dS
  kernel's too, each where it divides the sequence (the plan's otherwise)."""
  tiles = device_tiles()
  fields = dict(
    block_q=dividing(tiles.block_q, spec.block_q, seq_len),
    block_k=dividing(tiles.block_k, spec.block_k, seq_len),
  )
  if square:
    fields['block_bwd'] = dividing(tiles.block_bwd, spec.block_bwd, seq_len)
  return dataclasses.replace(spec, **fields)

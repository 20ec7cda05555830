"""What a fused attention kernel computes: the static half of its arguments.

One frozen, hashable record (it is a `nondiff_argnums` of the custom VJP and keys the kernel
builders), shared by the fused backends (kernels/backends/: Triton on GPU, Mosaic on TPU). The
dynamic half travels as arrays: qkv [B, L, 3, H, K]; the carried float32 sum [B, H, L, L];
the additive key bias [B, L]; `fparams` [B, 2] float32 = (score scale of the row's sequence,
1 / running-mean divisor); `iparams` [4] uint32 = (dropout key word 1, word 2, batch offset,
head offset) — the offsets place a shard's tile in the global [B, H, L, L] array, so the
dropout stream does not depend on the sharding.
"""

from __future__ import annotations

import dataclasses

from realformer_jax.kernels import backends
from realformer_jax.kernels.dropout.dropout_bits import GENERATORS, MASK_BITS


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  backend: str  # a registered fused backend's name (kernels/backends/): 'triton', 'mosaic'
  carry_in: bool  # reads acc_{l-1} (residual attention after layer 0)
  carry_out: bool  # writes acc_l = acc_{l-1} + scale Q K^T (residual attention)
  keep_threshold: int  # dropout keeps an 8-bit draw < threshold (dropout_bits); 0: none
  heads_total: int  # H of the global (unsharded) array: the dropout row counter
  block_q: int  # forward tile rows
  block_k: int  # forward tile columns
  block_bwd: int  # backward: the key rows a program owns (Triton's dQ loop: its query rows)
  # Rows per step of a Triton backward's loops (query rows of the dK / dV loop and the qk dS
  # kernel; key rows of plain attention's dQ loop); 0: block_bwd, a square tile. Larger tiles
  # cut the reloads per score element (the qk stack's, plain attention's q and dO tiles).
  block_bwd_rows: int = 0
  interpret: bool = False  # run the kernels in Pallas interpret mode (CPU tests)
  # The carried input is already this layer's acc_l (the recomputed stack walking down): the
  # forward reads it as the softmax input, computes no Q K^T and writes no sum.
  sum_given: bool = False
  # The layer is rematerialised (a remat policy re-runs it in the backward): the forward names
  # its output and row statistics (fused.SAVED_FOR_BACKWARD) so that the policy keeps them and
  # the re-run runs no forward kernel, and stores no dropout mask (O(L^2) per layer): the
  # backward draws it again. Plain attention only (a carried sum is O(L^2) too).
  for_remat: bool = False
  # for_remat only: the forward also stores its dropout mask (one bit per element) under the
  # same name, so the remat policy keeps it and the backward reads it; else the backward draws
  # the mask again (kernels/dropout/remat_masks.py decides: model.remat_dropout_masks).
  keeps_mask: bool = False
  # for_remat only, without keeps_mask: the backward draws the layer's whole mask by a separate
  # pass first and reads it (model.remat_dropout_masks='per_layer'); else its loops draw tiles.
  mask_pass: bool = False
  generator: str = 'threefry'  # the dropout masks' hash (dropout_bits.GENERATORS)

  def __post_init__(self):
    if not backends.get(self.backend).fused:
      raise ValueError(f'KernelSpec.backend={self.backend!r}: not a fused kernel backend')
    if self.carry_in and not self.carry_out:
      raise ValueError(
        'KernelSpec: a carried sum that is read is also written (carry_in needs carry_out)'
      )
    if self.sum_given and not self.carry_in:
      raise ValueError('KernelSpec: sum_given needs carry_in')
    if self.for_remat and self.carry_out:
      raise ValueError('KernelSpec: for_remat is for plain attention (no carried sum)')
    if self.keeps_mask and not self.for_remat:
      raise ValueError('KernelSpec: keeps_mask is for a rematerialised layer (for_remat)')
    if self.mask_pass and (not self.for_remat or self.keeps_mask):
      raise ValueError('KernelSpec: mask_pass is for a rematerialised layer that keeps no mask')
    if self.generator not in GENERATORS:
      raise ValueError(f'KernelSpec.generator={self.generator!r}: one of {GENERATORS}')

  @property
  def dropout(self) -> bool:
    return self.keep_threshold > 0

  @property
  def backward_rows(self) -> int:
    """Rows per step of a Triton backward's loops (block_bwd_rows; block_bwd where 0)."""
    return self.block_bwd_rows or self.block_bwd

  @property
  def keep_prob(self) -> float:
    return self.keep_threshold / 2**MASK_BITS

"""Hopper kernels written in Pallas Mosaic GPU (`jax.experimental.pallas.mosaic_gpu`: wgmma,
TMA copies into shared memory, mbarriers): attention.py (post / pre attention, forward and
backward) and qk_attention.py (residual_carry='qk': its forward and dS kernel here, the keys
resident in shared memory; the backward's GEMMs Triton's).
This file is the backend's record; the kernels are imported when a model first runs through
them. (The folder `mosaic/` beside it is Pallas Mosaic for TPUs: another compiler.)

'auto' and 'pallas' take it on a GPU only where `python -m experiments.device_check` passed
every one of its cases on this device kind, jax version and kernel source AND the device suite
timed it faster than Triton there (analysis/device_checks.py: the record, `record_speed`,
`faster`), and otherwise Triton:
nothing here was ever run on a GPU by its authors (issue 57: it lowers and compiles for sm_90a
deviceless, and matches the einsum path in Mosaic GPU's interpret mode). `attention_impl=
'pallas_mosaic_gpu'` names it explicitly.
"""

from typing import Optional

from realformer_jax.kernels.backends.registry import largest_block, pallas_backend

# wgmma multiplies 64 rows per warpgroup; 128-byte swizzled shared-memory tiles hold 64
# 16-bit features, so the head size is padded to a multiple of 64 (BERT's 64 is one tile).
ROWS = 64
# Shared memory one Hopper block may opt into (cudaFuncAttributeMaxDynamicSharedMemorySize;
# aot/targets.py's smem_optin for H100 / H200): the qk dS kernel's resident key stack must fit.
SHARED_MEMORY = 232_448


def plan_tiles(seq_len: int, interpret: bool) -> Optional[tuple[int, int, int]]:
  """Multiples of 64: 64 query rows x 128 keys forward (64 where 128 does not divide), 64 x 64
  backward; in interpret mode (CPU tests) 64 everywhere."""
  block_k = largest_block(seq_len, ROWS if interpret else 2 * ROWS, ROWS)
  if seq_len % ROWS or block_k is None:
    return None
  return (ROWS, block_k, ROWS)


def padded_head_dim(head_dim: int) -> int:
  return -(-head_dim // ROWS) * ROWS


BACKEND = pallas_backend(
  __name__,
  'mosaic_gpu',
  platform='gpu',
  tiles=plan_tiles,
  tile_rule='a multiple of 64',
  head_dim=padded_head_dim,
  hlo_calls=('mosaic_gpu',),
  residual=False,  # no carried-sum kernels: residual attention only with residual_carry='qk'
  dtypes=('bfloat16', 'float16'),  # wgmma on 16-bit operands (float32 models take Triton)
  after_device_check=True,
)

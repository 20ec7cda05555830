"""Kernel backends as plug-ins: one folder a backend, one record (registry.Backend) in its
`__init__.py`, one registration. `<name>/attention.py` holds the attention kernels and, where
the backend has them, `<name>/qk_attention.py` those of residual_carry='qk'; the record names
them and they are imported on use: a CPU-only install never loads a lowering it does not run.
docs/extending.md walks through adding one."""

from realformer_jax.kernels.backends import cudnn, mosaic, mosaic_gpu, triton
from realformer_jax.kernels.backends.registry import (
  Backend,
  attention_impls,
  for_impl,
  get,
  hlo_calls,
  register,
  registered,
  unregister,
)

# The built-in backends, in the order 'pallas' on a CPU and the device check try them.
for _backend in (triton.BACKEND, mosaic.BACKEND, mosaic_gpu.BACKEND, cudnn.BACKEND):
  register(_backend)

"""Kernel backends, one folder each: `<name>/attention.py` (the fused post / pre / residual
attention kernels) and, where the backend has one, `<name>/qk_attention.py` (the kernels of
`residual_carry='qk'`). Imported on use: a CPU-only install never loads a lowering it does not
run."""

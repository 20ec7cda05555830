"""Measuring a model rather than running it: per-sublayer gradient diagnostics, FLOP counts,
and the kernels' self-check against the einsum path on a device (kernel_check)."""

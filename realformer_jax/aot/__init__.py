"""Compile for an accelerator on any machine and estimate what it would do.

    targets     H100 / A100 / TPU v4, v5e, v5p, v6e descriptions; compile-only devices
    hlo_text    a reader for XLA's optimized HLO text
    roofline    `estimate(compiled_or_hlo_text, target) -> Estimate`: an ESTIMATED step time
                from a kernel roofline (never a measurement)
    categories  what each kernel is for (GEMM, score-sized element-wise, dropout bits, ...)

Deviceless compilation needs the accelerator's compiler (`pip install -e '.[aot]'`) and JAX
started with JAX_PLATFORMS=cpu; the estimator itself needs neither.
"""

from realformer_jax.aot.roofline import Estimate, Kernel, estimate
from realformer_jax.aot.targets import CHIPS, Chip, Target
from realformer_jax.aot.targets import parse as parse_target

__all__ = ['CHIPS', 'Chip', 'Estimate', 'Kernel', 'Target', 'estimate', 'parse_target']

"""Before any command of this package starts JAX: the CPU on a machine without a GPU or TPU,
so that installed accelerator plugins print nothing (experiments/platform_choice.py, which
imports nothing heavy: a module's own JAX_PLATFORMS setting still applies after it)."""

from experiments.platform_choice import prefer_cpu_without_accelerator

prefer_cpu_without_accelerator()

"""Before any command of this package starts JAX: the CPU on a machine without a GPU or TPU,
so that installed accelerator plugins print nothing (realformer_jax/platform_choice.py)."""

from realformer_jax.platform_choice import prefer_cpu_without_accelerator

prefer_cpu_without_accelerator()

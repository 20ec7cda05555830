"""The benchmarks commands. The platform choice on a machine with accelerator plugins but no
accelerator happens when they import realformer_jax (realformer_jax/platform_choice.py), so a
command's own JAX_PLATFORMS setting, made before that import, still applies."""

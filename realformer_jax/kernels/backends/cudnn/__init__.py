"""jax's cuDNN flash attention (post / pre only)."""

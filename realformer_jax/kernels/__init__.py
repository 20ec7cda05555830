"""Fused attention kernels: post / pre at flash-attention traffic, residual attention reading
and writing only its carried float32 sum. See select.py for which path a config takes."""

from realformer_jax.kernels.attend import fused_self_attention
from realformer_jax.kernels.carried import CarriedScores, TopDown, initial_carry, seal
from realformer_jax.kernels.fused import fused_attention
from realformer_jax.kernels.recomputed_stack import kernel_residual_stack
from realformer_jax.kernels.select import (
  AttentionPlan,
  block_sizes,
  pair_carry,
  plan,
  platform_of,
  resolve_platform,
)
from realformer_jax.kernels.spec import KernelSpec

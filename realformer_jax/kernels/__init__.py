"""Fused attention kernels: post / pre at flash-attention traffic, residual attention reading
and writing only its carried float32 sum. score_path.py is the one interface the model uses
(which path a model call takes, how its scores are carried); select.py decides the kernels and
the carry residual_carry='auto' takes."""

from realformer_jax.kernels.fused import SAVED_FOR_BACKWARD, fused_attention
from realformer_jax.kernels.score_path import LayerStack, ScorePath, layer_path, stack_path
from realformer_jax.kernels.select import (
  AttentionPlan,
  block_sizes,
  plan,
  platform_of,
  resolve_platform,
)
from realformer_jax.kernels.spec import KernelSpec

"""Fused attention kernels: post / pre at flash-attention traffic, residual attention reading
and writing only its carried float32 sum. Four parts: score_paths/ (how a model call attends and
how its scores travel; score_paths/score_path.py is the one interface the model uses),
plumbing/ (which kernels and carry a run takes, plumbing/select.py; the custom VJP over a
backend), dropout/ (the hash, a tile's mask, whether a layer's mask is kept) and backends/ (the
kernels themselves, one folder each)."""

from realformer_jax.kernels.plumbing.fused import SAVED_FOR_BACKWARD, fused_attention
from realformer_jax.kernels.plumbing.select import (
  AttentionPlan,
  block_sizes,
  plan,
  platform_of,
  resolve_platform,
)
from realformer_jax.kernels.plumbing.spec import KernelSpec
from realformer_jax.kernels.score_paths.score_path import (
  LayerStack,
  ScorePath,
  layer_path,
  stack_path,
)

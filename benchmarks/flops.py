"""Model FLOPs of the benchmark shapes (the formula: realformer_jax/analysis/flops.py).

`hf_executed` is what Hugging Face's FlaxBertForMaskedLM actually multiplies: the same encoder,
but the MLM head at all B L positions (it returns logits everywhere).
"""

from __future__ import annotations

from realformer_jax.analysis.flops import train_step_flops


def model_flops(shape, head_positions: int | None = None) -> int:
  """Useful model FLOPs per step for a `steps.Shape` (MLM head at the masked slots, or at
  `head_positions` positions)."""
  return train_step_flops(
    batch=shape.batch,
    seq_len=shape.seq_len,
    predictions=shape.predictions,
    hidden=shape.hidden,
    mlp=shape.mlp_dim,
    layers=shape.layers,
    vocab=shape.vocab,
    head_positions=head_positions,
  )['total']


def hf_executed_flops(shape) -> int:
  """FLOPs Hugging Face's model executes per step (MLM head at every position)."""
  return model_flops(shape, head_positions=shape.tokens)


def matmul_flops(n: int) -> int:
  """An n x n by n x n matmul."""
  return 2 * n**3

"""Analytic FLOPs of one MLM train step (forward + backward), counted the way MFU papers do.

With B = batch, L = sequence length, P = masked positions per sequence, D = hidden, F = FFN
width, H = heads, N = layers, V = vocabulary:

  encoder matmuls   6 * N * (4 D^2 + 2 D F) * B L      QKV (3 D^2), output (D^2), FFN (2 D F)
  attention         3 * N * 4 * B L^2 D                 Q K^T and P V, 2 L^2 d_head MACs per head
  MLM head          6 * (D^2 + D V) * B P               transform + tied decoder, masked slots only

The factor 6 is 2 (multiply-add) x 3 (forward, grad w.r.t. inputs, grad w.r.t. weights); the
attention products have no weights but two inputs, which also gives 3x the forward. Not counted
(they are not matmuls, or are not useful work): embedding gathers and their scatter-add
gradient, biases, norms, softmax, GELU, dropout, the loss, gradient clipping and AdamW.
`hf_executed` is what Hugging Face's FlaxBertForMaskedLM actually multiplies: the same encoder,
but the MLM head at all B L positions (it returns logits everywhere).
"""

from __future__ import annotations


def encoder_matmul_params(hidden: int, mlp: int) -> int:
  """Weights that multiply activations in one layer: QKV + output + FFN in/out."""
  return 4 * hidden * hidden + 2 * hidden * mlp


def train_step_flops(*, batch: int, seq_len: int, predictions: int, hidden: int, mlp: int,
                     layers: int, vocab: int, head_positions: int | None = None) -> dict:
  """Per-step FLOPs by part. `head_positions` (default B P) is where the MLM head runs."""
  tokens = batch * seq_len
  head_positions = batch * predictions if head_positions is None else head_positions
  parts = {
      'encoder_matmuls': 6 * layers * encoder_matmul_params(hidden, mlp) * tokens,
      'attention': 3 * layers * 4 * batch * seq_len * seq_len * hidden,
      'mlm_head': 6 * (hidden * hidden + hidden * vocab) * head_positions,
  }
  parts['total'] = sum(parts.values())
  return parts


def model_flops(shape) -> int:
  """Useful model FLOPs per step for a `steps.Shape` (MLM head at the masked slots)."""
  return train_step_flops(batch=shape.batch, seq_len=shape.seq_len,
                          predictions=shape.predictions, hidden=shape.hidden,
                          mlp=shape.mlp_dim, layers=shape.layers, vocab=shape.vocab)['total']


def hf_executed_flops(shape) -> int:
  """FLOPs Hugging Face's model executes per step (MLM head at every position)."""
  return train_step_flops(batch=shape.batch, seq_len=shape.seq_len,
                          predictions=shape.predictions, hidden=shape.hidden,
                          mlp=shape.mlp_dim, layers=shape.layers, vocab=shape.vocab,
                          head_positions=shape.tokens)['total']


def matmul_flops(n: int) -> int:
  """An n x n by n x n matmul."""
  return 2 * n ** 3

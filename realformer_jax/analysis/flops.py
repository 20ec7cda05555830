"""Analytic FLOPs of one masked-LM train step (forward + backward), counted the way MFU papers
do: the useful matmul work of the model, whatever the implementation executes.

With B = batch, L = sequence length, P = masked positions per sequence, D = hidden, F = FFN
width, N = layers, V = vocabulary:

  encoder matmuls   6 * N * (4 D^2 + 2 D F) * B L      QKV (3 D^2), output (D^2), FFN (2 D F)
  attention         3 * N * 4 * B L^2 D                 Q K^T and P V, 2 L^2 d_head MACs per head
  MLM head          6 * (D^2 + D V) * B P               transform + tied decoder, masked slots only

The factor 6 is 2 (multiply-add) x 3 (forward, grad w.r.t. inputs, grad w.r.t. weights); the
attention products have no weights but two inputs, which also gives 3x the forward. Not counted
(they are not matmuls, or are not useful work): embedding gathers and their scatter-add
gradient, biases, norms, softmax, GELU, dropout, the loss, gradient clipping and AdamW, and the
forward pass that rematerialisation repeats.
"""

from __future__ import annotations

from realformer_jax.config import ModelConfig


def encoder_matmul_params(hidden: int, mlp: int) -> int:
  """Weights that multiply activations in one layer: QKV + output + FFN in/out."""
  return 4 * hidden * hidden + 2 * hidden * mlp


def train_step_flops(
  *,
  batch: int,
  seq_len: int,
  predictions: int,
  hidden: int,
  mlp: int,
  layers: int,
  vocab: int,
  head_positions: int | None = None,
) -> dict:
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


def mlm_step_flops(model: ModelConfig, *, batch: int, seq_len: int, predictions: int) -> int:
  """Model FLOPs of one pretraining step of `model` on a global batch of `batch` sequences."""
  return train_step_flops(
    batch=batch,
    seq_len=seq_len,
    predictions=predictions,
    hidden=model.hidden_size,
    mlp=model.mlp_dim,
    layers=model.num_layers,
    vocab=model.vocab_size,
  )['total']

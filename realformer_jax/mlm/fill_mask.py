"""Fill-mask on the JAX side: the masked LM's guesses for each literal `[MASK]` in a text, the
text read as the exported Hugging Face tokenizer reads it (`Tokenizer.encode_masked`), so the
same query gives the same ids here and in transformers' fill-mask pipeline.

    run = train.load_workdir('/tmp/realformer_tiny')
    fill_mask(run.model_config, run.params, run.tokenizer, 'In the beginning God [MASK] the')
    # [[('▁created', 0.41), ...]]: one list per [MASK], best first
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from realformer_jax.config import ModelConfig
from realformer_jax.data.tokenizers.base import Tokenizer
from realformer_jax.model.models import MaskedLM


def fill_mask(
  model_config: ModelConfig, params: Any, tokenizer: Tokenizer, text: str, top_k: int = 5
) -> list[list[tuple[str, float]]]:
  """For each `[MASK]` in `text`, in order, the `top_k` (piece, probability) pairs the model
  puts there, best first. ValueError for a text without `[MASK]` or longer than the model's
  positions."""
  ids = np.concatenate(
    [[tokenizer.cls_id], tokenizer.encode_masked(text), [tokenizer.sep_id]]
  ).astype(np.int32)
  positions = np.flatnonzero(ids == tokenizer.mask_id).astype(np.int32)
  if not len(positions):
    raise ValueError(f'fill_mask: no [MASK] in {text!r}')
  if len(ids) > model_config.max_len:
    raise ValueError(
      f'fill_mask: {len(ids)} tokens with [CLS] and [SEP], more than model.max_len='
      f'{model_config.max_len}'
    )
  logits_1xPxV = MaskedLM(model_config).apply(
    {'params': params}, ids[None], jnp.ones_like(ids)[None], None, positions[None]
  )
  # Over the tokenizer's pieces (an embedding table may have more rows than it has pieces).
  logits_PxV = logits_1xPxV[0, :, : tokenizer.vocab_size].astype(jnp.float32)
  probabilities_PxV = np.asarray(jax.nn.softmax(logits_PxV, axis=-1))
  answers = []
  for row in probabilities_PxV:
    best = np.argsort(-row)[:top_k]
    answers.append([(tokenizer.id_to_piece(int(i)), float(row[i])) for i in best])
  return answers

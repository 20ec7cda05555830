"""The masked-LM accuracy of a model that ignores its input.

Always predicting the single most frequent target token scores this on the eval split; a
trained model's MLM accuracy means little until it clearly beats it (in English prose,
'the' or ',' alone is several percent of the masked targets).
"""

from __future__ import annotations

import numpy as np

from realformer_jax.data import config as config_lib
from realformer_jax.data import pipeline


def most_frequent_token_baseline(data_config: config_lib.DataConfig,
                                 global_batch_size: int | None = None) -> float:
  """Accuracy of always predicting the eval split's most frequent masked target.

  Computed over exactly the sequences and masks the eval iterator yields (the first
  `eval_batches * global_batch_size` when both are set; the whole split otherwise).
  """
  sequences = pipeline.eval_sequences(data_config, global_batch_size)
  targets = sequences['masked_ids'][sequences['masked_weights'] > 0]
  return float(np.bincount(targets).max() / len(targets))

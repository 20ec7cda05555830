"""A study's scale: the model, data and schedule of its runs, as plain data.

Apart from study.py (which trains and scores with JAX) so that a plan, which declares its scale,
imports no JAX: `python -m experiments.study --plan=typo` answers in a fraction of a second, and
the tests read a plan without starting JAX (tests/studies/test_plans.py).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Scale:
  """Model, data and schedule of one study's runs (a run may override the rate or steps)."""

  layers: int
  hidden: int
  heads: int
  mlp: int
  seq_len: int
  batch: int
  steps: int
  learning_rate: float
  vocab: int
  warmup_frac: float = 0.1  # linear warmup, then linear decay to 0 at `steps`
  evals: int = 6  # evaluations per run (every steps / evals, and at the end)
  eval_batches: int = -1  # held-out batches scored; -1: the whole held-out split
  dropout: float = 0.1
  position_embedding: str = 'rope'
  # A SentencePiece file every run loads (data.vocab_file) instead of training its own: a
  # tokenizer trained again can differ in its piece scores and so in its id order (they depend
  # on floating-point detail: the training threads, the machine), which moves every run's
  # start. A study whose runs span days pins one. '': each run trains one (cached per corpus).
  tokenizer: str = ''
  # Mask draws the final scoring averages over (score_workdir): with one draw a small held-out
  # set's sampling error can exceed the seeds' (issue 66); the training evaluations keep one.
  eval_mask_draws: int = 1


# The smoke-test scale of every study's --quick (seconds a run); a study changes a field or two.
TOY = Scale(
  layers=2,
  hidden=32,
  heads=2,
  mlp=64,
  seq_len=32,
  batch=8,
  steps=4,
  learning_rate=3e-3,
  vocab=500,
  evals=2,
  eval_batches=2,
)


# The CPU studies' recipe (the layouts study's; 2 cores, ~0.5-1 s a step): 12 layers x 64, 2 heads
# of 32, FFN 256, sequence 64, batch 32, 600 steps at 2e-3, a 2,000-piece tokenizer, the first 16
# held-out batches. Every other CPU study states how its own differs (dataclasses.replace).
CPU = dataclasses.replace(
  TOY, layers=12, hidden=64, mlp=256, seq_len=64, batch=32, steps=600, learning_rate=2e-3
)
CPU = dataclasses.replace(CPU, vocab=2000, evals=6, eval_batches=16)

# The accelerator studies' recipe (not run here): BERT-Small width at BERT-Base depth,
# sequence 128, batch 256, 20,000 steps at 5e-4, an 8,000-piece tokenizer, 64 held-out batches.
ACCELERATOR = dataclasses.replace(
  CPU, hidden=512, heads=8, mlp=2048, seq_len=128, batch=256, steps=20_000, learning_rate=5e-4
)
ACCELERATOR = dataclasses.replace(ACCELERATOR, vocab=8000, eval_batches=64)

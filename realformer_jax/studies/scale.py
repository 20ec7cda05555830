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

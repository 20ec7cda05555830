"""The training errors a user can act on: the entry points print each as one line
`error: <message>` and exit 1 (commands/train.py); nothing else is reported that way."""

from typing import Optional


class TrainingError(RuntimeError):
  """Training cannot go on (e.g. a non-finite loss). The message names the step."""


class DivergenceError(TrainingError):
  """A non-finite loss or gradient stopped training; `step` is where, as data (a study records
  the divergence as a result, studies/study.py), the message says it in words.

  `dead_end`: the checkpoint every resume would diverge from again, if any: a step's loss and
  gradients depend only on the state, batch and key that the checkpoint of the step before
  restores, whatever the optimizer config (checkpointing.Checkpointer.set_aside_diverged)."""

  def __init__(self, message: str, step: int, dead_end: Optional[int] = None):
    super().__init__(message)
    self.step = step
    self.dead_end = dead_end


class CheckpointError(TrainingError):
  """A checkpoint cannot be written or none can be read. The message names the directory,
  the step, what is intact and what to do."""

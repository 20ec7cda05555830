"""The training errors a user can act on: the entry points print each as one line
`error: <message>` and exit 1 (experiments/train.py); nothing else is reported that way."""


class TrainingError(RuntimeError):
  """Training cannot go on (e.g. a non-finite loss). The message names the step."""


class DivergenceError(TrainingError):
  """A non-finite loss or gradient stopped training; `step` is where, as data (a study records
  the divergence as a result, experiments/study.py), the message says it in words."""

  def __init__(self, message: str, step: int):
    super().__init__(message)
    self.step = step


class CheckpointError(TrainingError):
  """A checkpoint cannot be written or none can be read. The message names the directory,
  the step, what is intact and what to do."""

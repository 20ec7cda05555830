"""The training errors a user can act on: the entry points print each as one line
`error: <message>` and exit 1 (experiments/train.py); nothing else is reported that way."""


class TrainingError(RuntimeError):
  """Training cannot go on (e.g. a non-finite loss). The message names the step."""


class CheckpointError(TrainingError):
  """A checkpoint cannot be written or none can be read. The message names the directory,
  the step, what is intact and what to do."""

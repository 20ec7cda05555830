"""The one exception the data pipeline raises for bad input.

The train loop builds its data before compiling the model, so every problem a user can fix
(unknown dataset, unprepared dataset with downloads off, empty split, missing text feature,
batch not divisible by the process count, bad config value) surfaces in seconds as a one-line
`DataError` whose message names the dataset, field or file involved.
"""


class DataError(ValueError):
  """Data cannot be built from this config. The message names the dataset/field/file."""

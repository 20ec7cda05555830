"""The one exception the data pipeline raises for bad input.

The train loop builds its data before compiling the model, so every problem a user can fix
(unknown dataset, unprepared dataset with downloads off, empty split, missing text feature,
batch not divisible by the process count, bad config value) surfaces in seconds as a one-line
`DataError` whose message names the dataset, field or file involved.
"""

from typing import Any, Mapping


class DataError(ValueError):
  """Data cannot be built from this config. The message names the dataset/field/file."""


def check_saved_state(what: str, state: Mapping[str, Any], mine: Mapping[str, Any], why=''):
  """Refuses, in one line, a train iterator's saved `state` whose identity fields differ from
  this iterator's (`mine`): it was saved with other data or another seed. `why`: what such a
  change can be, for the message."""
  for key, value in mine.items():
    if state.get(key) != value:
      raise DataError(
        f'{what} has {key}={state.get(key)!r}, but this iterator has {value!r}: it was '
        f'saved with other data or another seed{why}.'
      )

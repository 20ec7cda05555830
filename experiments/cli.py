"""What every command shares: one-line errors and absl flag parsing that reports a bad flag
in one line."""

import os
import re
import sys

from absl import flags


def fail(message: str):
  print(f'error: {message}', file=sys.stderr)
  sys.exit(1)


def fail_after_training(message: str):
  """`fail` for an error raised once training has started: the run has already waited for
  its saves and closed everything it opened, but a failed save can leave orbax coroutines
  behind whose teardown prints tracebacks at interpreter exit; exiting at once keeps the
  error line the last thing on stderr."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(1)  # pylint: disable=protected-access


def parse_flags(argv):
  """absl parsing, with every failure (including an unknown --config.a.b key, which
  ml_collections reports as an AttributeError) as one line."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    match = re.search(r"(\w+)\\?'", str(e))
    key = match.group(1) if match else str(e)
    names = [a.split('=')[0] for a in argv if a.startswith('--config.')]
    name = next((n for n in names if key in n.split('.')), '--config.*')
    fail(f'{name}: unknown config field ({key!r})')
  except flags.Error as e:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    fail(lines[0] if len(lines) == 1 else f'{lines[0]} {lines[-1]}')


def loaded(config):
  """The --config value, or one line naming why its file did not load (a config file that
  failed to load raises on first use, not when parsed)."""
  try:
    config.keys()
  except OSError as e:
    fail(f'--config: {str(e).strip().splitlines()[-1].strip()}')
  return config

"""Config files (`--config=configs/<file>.py[:ARG]`) and what they share: `parse_arg`, the one
reader of a config file's argument."""

from __future__ import annotations

from typing import Mapping


def parse_arg(arg: str, defaults: Mapping[str, str], positional: str = '') -> dict[str, str]:
  """A config file's argument 'key=value,...' -> `defaults` updated by it (only their keys).
  With `positional`, an item without '=' is that key's value: 'mrpc,init=DIR'."""
  values = dict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, sep, value = item.partition('=')
    if not sep and positional:
      key, sep, value = positional, '=', item
    if not sep or key not in defaults:
      alone = f' (or the {positional} alone)' if positional else ''
      raise ValueError(
        f'config arg {item!r}: expected one of {sorted(defaults)} as key=value{alone}'
      )
    values[key] = value
  return values

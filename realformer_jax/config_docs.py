"""What each config field means, read from the one place it is written: the comment beside (or
right above) the field in its frozen dataclass (ModelConfig, DataConfig, TrainConfig, ...).

    field_meanings(ModelConfig)['ln_placement']   # "'post' (BERT) | 'pre' (+ final norm) | ..."
    describe(config, {'model': ModelConfig, ...})  # the CLIs' --print_config
    did_you_mean('ln_placment', known)             # " (did you mean 'ln_placement'?)" or ''

The comments are parsed with `ast` (which lines declare a field) and `tokenize` (the comments on
and above them), so a field's documentation never has a second copy to drift.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import io
import textwrap
import tokenize
from typing import Any, Iterable, Mapping


@functools.cache
def field_meanings(cls: type) -> dict[str, str]:
  """Field name -> its comment (the trailing one, else the comment lines right above it, joined
  into one line), in field order; '' for a field without one. A field a subclass redeclares
  without a comment keeps its base class's."""
  meanings: dict[str, str] = {}
  for klass in reversed(cls.__mro__):
    if dataclasses.is_dataclass(klass):
      for name, text in _own_meanings(klass).items():
        meanings[name] = text or meanings.get(name, '')
  return {f.name: meanings.get(f.name, '') for f in dataclasses.fields(cls)}


def _own_meanings(cls: type) -> dict[str, str]:
  """The comments of the fields `cls`'s own body declares."""
  source = textwrap.dedent(inspect.getsource(cls))
  comments: dict[int, str] = {}  # line number -> comment text
  code_lines: set[int] = set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      comments[token.start[0]] = token.string.lstrip('#').strip()
    elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
      code_lines.add(token.start[0])
  class_def = ast.parse(source).body[0]
  meanings = {}
  for node in class_def.body:
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
      continue
    text = comments.get(node.end_lineno, '')
    if not text:  # a comment block right above the field
      above, line = [], node.lineno - 1
      while line in comments and line not in code_lines:
        above.insert(0, comments[line])
        line -= 1
      text = ' '.join(above)
    meanings[node.target.id] = text
  return meanings


def describe(
  config: Any,
  schemas: Mapping[str, type],
  notes: Mapping[str, str] = (),
  field_notes: Mapping[str, str] = (),
) -> str:
  """Every field of `config` (a ConfigDict) as 'section.field = value  # meaning', one a line.
  `schemas` names each section's dataclass; `notes` describes sections that have none;
  `field_notes` ('section.field': text) replaces a field's meaning (e.g. a value a command
  derives, not the one the config holds)."""
  notes, field_notes = dict(notes), dict(field_notes)
  lines = []
  for section in config.keys():
    values = config[section]
    if section not in schemas or not hasattr(values, 'items'):
      note = f'  # {notes[section]}' if section in notes else ''
      lines.append(f'{section} = {_value(values)}{note}')
      continue
    meanings = field_meanings(schemas[section])
    # The schema's order (a ConfigDict sorts its keys), then any field it does not know.
    names = [n for n in meanings if n in values] + sorted(set(values.keys()) - set(meanings))
    for name in names:
      value, meaning = values[name], meanings.get(name, '')
      meaning = field_notes.get(f'{section}.{name}', meaning)
      lines.append(f'{section}.{name} = {_value(value)}' + (f'  # {meaning}' if meaning else ''))
  return '\n'.join(lines)


def _value(value: Any) -> str:
  if hasattr(value, 'to_dict'):
    value = value.to_dict()
  return repr(value)


def did_you_mean(name: str, known: Iterable[str]) -> str:
  """' (did you mean 'x'?)' for the closest known name, '' when none is close."""
  match = difflib.get_close_matches(name, list(known), n=1)
  return f' (did you mean {match[0]!r}?)' if match else ''

"""Documents from your own files: `.txt`, `.jsonl` / `.json`, `.parquet` (optionally `.gz`).

`data.train_files` / `data.eval_files` are comma-separated globs; the format follows the file
name (a trailing `.gz` is decompressed on the way):

    .txt            BERT's convention: a line is a sentence or paragraph, a blank line ends a
                    document (the document's lines are joined with newlines)
    .jsonl / .json  one JSON object per line; the text is the field `data.text_feature`
                    ('a/b' for a nested field)
    .parquet        the string column `data.text_feature` (how Hugging Face datasets are stored)

Files are read as streams (a document at a time; Parquet a row group at a time), so memory does
not grow with the corpus. Every problem is one DataError naming the file: a glob that matches
nothing, an empty file, a binary or non-UTF-8 file (with the byte offset), a JSONL line that is
not JSON or lacks the field, a Parquet file without the column.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from typing import Iterator

from realformer_jax.data.errors import DataError

_NUL = bytes(1)
FORMATS = ('.txt', '.jsonl', '.json', '.parquet')


def expand(patterns: str, field: str) -> list[str]:
  """The sorted files matched by comma-separated globs; DataError for a glob matching nothing."""
  files = []
  for pattern in (p.strip() for p in patterns.split(',')):
    if not pattern:
      continue
    if '://' in pattern:  # gs:// and other etils.epath file systems
      from etils import epath  # pylint: disable=import-outside-toplevel

      parent, _, name = pattern.rpartition('/')
      matches = sorted(str(p) for p in epath.Path(parent).glob(name))
    else:
      matches = sorted(
        p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p)
      )
    if not matches:
      raise DataError(f'data.{field}: {pattern!r} matches no file.')
    for path in matches:
      format_of(path)  # an unknown extension fails before anything is read
    files.extend(matches)
  if not files:
    raise DataError(f'data.{field}={patterns!r} names no file.')
  return list(dict.fromkeys(files))  # in order, each once


def format_of(path: str) -> str:
  name = path[: -len('.gz')] if path.endswith('.gz') else path
  extension = os.path.splitext(name)[1].lower()
  if extension not in FORMATS:
    raise DataError(
      f'{path}: unknown file format {extension or "(no extension)"!r}; '
      f'expected one of {", ".join(FORMATS)} (optionally .gz).'
    )
  return extension


def fingerprint(path: str) -> dict:
  """Size and modification time: what tells a changed file from the one a store was built on."""
  if '://' in path:
    from etils import epath  # pylint: disable=import-outside-toplevel

    stat = epath.Path(path).stat()
    return {'path': path, 'bytes': int(stat.length), 'mtime': float(stat.mtime)}
  stat = os.stat(path)
  return {'path': os.path.abspath(path), 'bytes': stat.st_size, 'mtime_ns': stat.st_mtime_ns}


def documents(path: str, text_feature: str) -> Iterator[str]:
  """The documents of one file, in order; DataError naming the file for any bad input."""
  count = 0
  for text in _documents(path, format_of(path), text_feature):
    count += 1
    yield text
  if not count:
    raise DataError(f'{path}: the file is empty (no document in it).')


def _documents(path: str, extension: str, text_feature: str) -> Iterator[str]:
  if extension == '.parquet':
    yield from _parquet_documents(path, text_feature)
    return
  with _open_binary(path) as f:
    if extension == '.txt':
      yield from _text_documents(path, f)
    else:
      yield from _json_documents(path, f, text_feature)


def _open_binary(path: str):
  if '://' in path:
    from etils import epath  # pylint: disable=import-outside-toplevel

    raw = epath.Path(path).open('rb')
  else:
    raw = open(path, 'rb')
  return gzip.open(raw) if path.endswith('.gz') else raw


def _lines(path: str, f) -> Iterator[tuple[int, str]]:
  """(line number, decoded line without its newline); DataError at binary or non-UTF-8 bytes."""
  offset = 0
  for number, raw in enumerate(_raw_lines(path, f), 1):
    if _NUL in raw:
      raise DataError(
        f'{path}: binary data (a NUL byte) at byte offset {offset + raw.index(_NUL)}; '
        'expected UTF-8 text.'
      )
    try:
      line = raw.decode('utf-8')
    except UnicodeDecodeError as e:
      raise DataError(
        f'{path}: not UTF-8 text at byte offset {offset + e.start} (line {number}).'
      ) from None
    offset += len(raw)
    yield number, line.rstrip('\r\n')


def _raw_lines(path: str, f) -> Iterator[bytes]:
  try:
    yield from f
  except (OSError, EOFError) as e:  # a damaged or truncated .gz
    raise DataError(f'{path}: cannot be read ({e}).') from None


def _text_documents(path: str, f) -> Iterator[str]:
  lines = []
  for _, line in _lines(path, f):
    if line.strip():
      lines.append(line)
    elif lines:
      yield '\n'.join(lines)
      lines = []
  if lines:
    yield '\n'.join(lines)


def _json_documents(path: str, f, text_feature: str) -> Iterator[str]:
  for number, line in _lines(path, f):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError as e:
      raise DataError(f'{path}: line {number} is not JSON ({e.msg}).') from None
    value = record
    for key in text_feature.split('/'):
      if not isinstance(value, dict) or key not in value:
        raise DataError(
          f'{path}: line {number} has no field {text_feature!r} (data.text_feature); '
          f'its fields: {sorted(record) if isinstance(record, dict) else type(record).__name__}.'
        )
      value = value[key]
    if not isinstance(value, str):
      raise DataError(
        f'{path}: line {number} field {text_feature!r} is {type(value).__name__}, not a string.'
      )
    yield value


def _parquet_documents(path: str, text_feature: str) -> Iterator[str]:
  try:
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise DataError(f'{path}: reading Parquet needs pyarrow (pip install pyarrow).') from None
  try:
    parquet = pq.ParquetFile(path)
  except Exception as e:  # pyarrow's errors have no common base: name the file, one line
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise DataError(f'{path}: not a readable Parquet file ({first}).') from None
  columns = parquet.schema_arrow.names
  if text_feature not in columns:
    raise DataError(
      f'{path}: Parquet file has no column {text_feature!r} (data.text_feature); '
      f'its columns: {columns}.'
    )
  for batch in parquet.iter_batches(batch_size=1024, columns=[text_feature]):
    for value in batch.column(0).to_pylist():
      if value is not None:
        yield value if isinstance(value, str) else str(value)

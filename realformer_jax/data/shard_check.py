"""Damaged dataset files (a split's array_record shards) as one DataError naming the file.

A prepared TFDS dataset is not derived from anything we hold (except the embedded corpus), so
a damaged shard cannot be rebuilt here: it must be reported, in one line that names the file
and how to prepare the dataset again. Two checks:

- when a split is opened, each of its shard files must exist and open with the number of
  records TFDS wrote into it (dataset_info): this catches missing and truncated files (the
  reader then finds no valid footer) before anything is tokenized or compiled, for the cost
  of reading each file's footer;
- every read goes through `CheckedSource`, which turns the reader's error (riegeli checks a
  hash per chunk, so flipped bytes surface on the read that touches them) into the same
  DataError, naming the file that holds the record.
"""

from __future__ import annotations

import bisect
import os
from typing import Any, Sequence

from realformer_jax.data.errors import DataError


def remedy(builder, embedded: bool) -> str:
  """How to get intact files back for `builder`'s dataset (`embedded`: prepared by us)."""
  directory = os.fspath(builder.data_dir)
  if embedded:
    return f'delete {directory} and rerun (the embedded corpus is prepared again on first use)'
  data_dir = os.path.dirname(os.path.dirname(directory))
  return (
    f'prepare it again: delete {directory}, then run `tfds build {builder.name} '
    f'--data_dir={data_dir} --file_format=array_record` (or set data.download=True)'
  )


def check_files(builder, split: str, fix: str) -> list[tuple[str, int]]:
  """[(file, records it holds for `split`)] of `split`, each file checked as described above;
  DataError naming the first file that is missing or damaged, and `fix` (`remedy`)."""
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

  name = builder.info.full_name
  files = []
  for instruction in builder.info.splits[split].file_instructions:
    path = os.fspath(instruction.filename)
    if not os.path.isfile(path):
      raise DataError(f"Dataset '{name}' split '{split}': file {path} is missing; {fix}.")
    try:
      reader = array_record_module.ArrayRecordReader(path, 'readahead_buffer_size:0')
      try:
        count = reader.num_records()
      finally:
        reader.close()  # raises the reader's deferred error, e.g. a truncated file
    except (RuntimeError, ValueError, OSError) as e:
      raise DataError(
        f"Dataset '{name}' split '{split}': file {path} is damaged ({_first_line(e)}); {fix}."
      ) from None
    if count != instruction.examples_in_shard:
      raise DataError(
        f"Dataset '{name}' split '{split}': file {path} holds {count} records, "
        f'{instruction.examples_in_shard} were written; {fix}.'
      )
    files.append((path, instruction.take))
  return files


class CheckedSource:
  """A random-access data source whose read errors are one-line DataErrors naming the file."""

  def __init__(self, source: Any, files: Sequence[tuple[str, int]], what: str, fix: str):
    self._source = source
    self._files = [path for path, _ in files]
    self._ends = []  # cumulative record counts: record i is in the first file whose end > i
    total = 0
    for _, count in files:
      total += count
      self._ends.append(total)
    self._what = what
    self._fix = fix

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index):
    try:
      return self._source[index]
    except (RuntimeError, ValueError, OSError) as e:
      raise self._damaged(index, e) from None

  def __getitems__(self, indices):
    try:
      return self._source.__getitems__(indices)
    except (RuntimeError, ValueError, OSError) as e:
      for index in indices:  # which record (so which file) is damaged
        self[index]
      raise self._damaged(None, e) from None

  def _damaged(self, index, error: Exception) -> DataError:
    if index is not None and self._files:
      file = self._files[min(bisect.bisect_right(self._ends, int(index)), len(self._files) - 1)]
      where = f'file {file} (record {int(index)})'
    else:
      where = 'one of its files: ' + ', '.join(self._files)
    return DataError(f'{self._what}: {where} is damaged ({_first_line(error)}); {self._fix}.')

  def __repr__(self) -> str:
    return f'CheckedSource({self._source!r})'


def _first_line(error: Exception) -> str:
  line = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return line if len(line) <= 200 else line[:200] + '...'

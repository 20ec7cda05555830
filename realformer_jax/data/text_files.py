"""Documents from your own files: `.txt`, `.jsonl` / `.json`, `.parquet` (optionally `.gz` or
`.zst`).

`data.train_files` / `data.eval_files` are comma-separated globs or directories (a directory
means every supported file under it, sorted by path); the format follows the file name (a
trailing `.gz` or `.zst` is decompressed on the way; `.zst` needs the `zstandard` package, the
`zst` extra):

    .txt            BERT's convention: a line is a sentence or paragraph, a blank line ends a
                    document (the document's lines are joined with newlines)
    .jsonl / .json  one JSON object per line; the text is the field `data.text_feature`
                    ('a/b' for a nested field)
    .parquet        the string column `data.text_feature` (how Hugging Face datasets are stored)

Files are read as streams (a document at a time; Parquet a row group at a time), so memory does
not grow with the corpus. An uncompressed `.txt` / `.jsonl` / `.json` file is read in byte
ranges (`byte_ranges`, `CHUNK_BYTES` each, so several workers share one large file): a range's
exact bounds are moved forward to the next document boundary (`exact_range`: after a blank line
for `.txt`, a line start for JSON lines), so the ranges partition the file's documents exactly
and the documents do not depend on how the file was split. A range is read as exactly its
bytes (a local file is bounded to the end it had when hashed: `_Bounded`), so a file appended
to meanwhile gives the documents of what was hashed. Every problem is one DataError naming the
file: a glob that matches nothing, a dangling symbolic link (to a file, or to a directory where
a corpus folder or a glob's wildcard directories are walked), a FIFO, socket or device, an
empty file, a binary or non-UTF-8 file (with the byte offset and line), a JSONL line that is
not JSON or lacks the field, a Parquet file without the column, a `.zst` file without the
zstandard package. Files of other formats in a corpus folder, and directories that cannot be
listed, are named in note lines.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import gzip
import hashlib
import io
import json
import os
import re
import stat
from typing import Callable, Iterable, Iterator, Optional

from realformer_jax.data.errors import DataError
from realformer_jax.data.progress import say

_NUL = bytes(1)
FORMATS = ('.txt', '.jsonl', '.json', '.parquet')
COMPRESSIONS = ('.gz', '.zst')
# A large uncompressed file is read in ranges of this many bytes (one job each); part of every
# shard's identity (file_corpus._REVISION), so changing it re-reads corpora.
CHUNK_BYTES = 16 << 20
_HASH_BLOCK = 8 << 20
# Ranges up to this size are read and decoded in one piece (chunks are CHUNK_BYTES, plus the
# distance to the next document boundary); a larger one (a .txt without blank lines) streams.
_MAX_BLOCK_BYTES = 4 * CHUNK_BYTES


def check_entries(paths: list[str], field: str) -> list[Optional[os.stat_result]]:
  """`_check_entry` of each path, in order: one stat a file and its format (the per-file work
  of `expand`)."""
  return [_check_entry(path, field) for path in paths]


def expand(
  patterns: str, field: str, stats: Optional[dict] = None, check: Callable = check_entries
) -> list[str]:
  """The files named by comma-separated globs or directories, each in sorted order; DataError
  for a glob matching nothing, a directory holding no supported file, and for what would make
  the corpus silently smaller or never end: a dangling symbolic link (to a file or a
  directory) where the corpus is looked for, or a named pipe, socket or device where a file
  is expected. A directory that cannot be listed is named in a note line. The files found
  are checked by `check(paths, field)` (`check_entries`, or the same work run elsewhere, in
  worker processes: its result per path is None for a directory, else anything); `stats`,
  where given, receives that result for each local file."""
  files = []
  for pattern in (p.strip() for p in patterns.split(',')):
    if not pattern:
      continue
    if '://' in pattern:  # gs:// and other etils.epath file systems
      from etils import epath  # pylint: disable=import-outside-toplevel

      parent, _, name = pattern.rpartition('/')
      matches = sorted(str(p) for p in epath.Path(parent).glob(name))
    elif os.path.isdir(os.path.expanduser(pattern)):
      matches = _supported_files_under(os.path.expanduser(pattern), field, stats, check)
    else:
      pattern = os.path.expanduser(pattern)
      _check_directories_on_the_way(pattern, field)
      matches = sorted(glob.glob(pattern, recursive=True))
      infos = check(matches, field)
      if None in infos:  # less the directories the glob matched
        found = [(p, info) for p, info in zip(matches, infos) if info is not None]
        matches, infos = [p for p, _ in found], [info for _, info in found]
      if stats is not None:
        stats.update(zip(matches, infos))  # no list of pairs: ~0.05 CPU s of 100,000 files
    if not matches:
      raise DataError(f'data.{field}: {pattern!r} matches no file.')
    if '://' in pattern:  # a local file's format is checked with its entry (`check`)
      for path in matches:
        format_of(path)  # an unknown extension fails before anything is read
    files.extend(matches)
  if not files:
    raise DataError(f'data.{field}={patterns!r} names no file.')
  return list(dict.fromkeys(files))  # in order, each once


def _dangling_link_error(path: str, field: str) -> DataError:
  return DataError(
    f'data.{field}: {path} is a symbolic link to {os.readlink(path)}, which does not '
    'exist (an unmounted file system?): mount it or remove the link.'
  )


# What a path that is neither a regular file nor a directory is, for messages.
_SPECIAL_FILES = (
  (stat.S_ISFIFO, 'a named pipe (FIFO): reading it waits for a writer'),
  (stat.S_ISSOCK, 'a socket'),
  (stat.S_ISCHR, 'a character device'),
  (stat.S_ISBLK, 'a block device'),
)


def _check_entry(path: str, field: str) -> Optional[os.stat_result]:
  """The stat of `path` if it is a regular file (None: a directory); DataError for a dangling
  symbolic link or a path that is neither (a FIFO named *.txt would block the read forever,
  with no output). One stat: it runs once per file of the corpus."""
  try:
    info = os.stat(path)
  except FileNotFoundError:
    if os.path.islink(path):  # an unmounted share, say
      raise _dangling_link_error(path, field) from None
    raise
  mode = info.st_mode
  if stat.S_ISREG(mode):  # first: the rule (the loop below was ~1 us a file)
    format_of(path)  # an unknown extension fails before anything is read
    return info
  for is_kind, kind in _SPECIAL_FILES:
    if is_kind(mode):
      raise DataError(f'data.{field}: {path} is {kind}, not a regular file: give regular files.')
  return None


def _walk(directory: str, field: str):
  """os.walk following links, where a directory that cannot be listed is said in a note line
  (os.walk skips it silently; refusing it would refuse a data disk for its lost+found)."""

  def note(error: OSError):
    say(f'note: data.{field}: cannot list {error.filename} ({error.strerror}): left out.')

  return os.walk(directory, onerror=note, followlinks=True)


def _supported_files_under(
  directory: str, field: str, stats: Optional[dict] = None, check: Callable = check_entries
) -> list[str]:
  """Every file under `directory` (recursively, hidden ones skipped) in a supported format,
  each checked by `check` (`expand`); the others are named in one note line (how many, and
  the first few)."""
  found, left_out = [], []
  for root, dirs, names in _walk(directory, field):
    dirs[:] = [d for d in dirs if not d.startswith('.')]
    for name in names:
      path = os.path.join(root, name)
      if name.startswith('.'):
        continue
      if not _is_supported(path):
        if os.path.islink(path) and not os.path.exists(path):  # a file or a directory: unknown
          raise _dangling_link_error(path, field)
        left_out.append(os.path.relpath(path, directory))
        continue
      found.append(path)
  supported = f'{", ".join(FORMATS)}, optionally {" or ".join(COMPRESSIONS)}'
  if not found:
    raise DataError(
      f'data.{field}: directory {directory} holds no file in a supported format ({supported}).'
    )
  if left_out:
    left_out.sort()
    shown = ', '.join(left_out[:_NAMES_SHOWN])
    more = f' and {len(left_out) - _NAMES_SHOWN} more' if len(left_out) > _NAMES_SHOWN else ''
    say(
      f'note: data.{field}: left out {len(left_out)} file(s) under {directory} in no supported '
      f'format ({supported}): {shown}{more}'
    )
  found.sort()
  # each checked: a dangling link named like a corpus file is refused
  infos = check(found, field)
  if stats is not None:
    stats.update(zip(found, infos))
  return found


# Names a note lists of the files it left out.
_NAMES_SHOWN = 3
_MAGIC = re.compile(r'[*?[]')


def _check_directories_on_the_way(pattern: str, field: str) -> None:
  """A glob whose directories have wildcards (`corpus/*/x.txt`, `corpus/**/*.txt`) skips a
  dangling link where a directory would be, without a word: refuse one, as a dangling file
  link is refused. Walks only the directories the pattern can pass through."""
  parts = pattern.split(os.sep)
  first = next((i for i, part in enumerate(parts) if _MAGIC.search(part)), len(parts))
  if first >= len(parts) - 1:  # wildcards in the file name only: each match is checked
    return
  root = os.sep.join(parts[:first]) or (os.sep if pattern.startswith(os.sep) else os.curdir)
  if os.path.islink(root) and not os.path.exists(root):
    raise _dangling_link_error(root, field)
  if not os.path.isdir(root):
    return  # the glob matches nothing: said as such
  directories = parts[first:-1]
  for here, dirs, names in _walk(root, field):
    relative = os.path.relpath(here, root)
    inside = [] if relative == os.curdir else relative.split(os.sep)
    dirs[:] = [d for d in dirs if _on_the_way(inside + [d], directories)]
    if '**' not in directories and len(inside) + 1 >= len(directories):
      # the last directories' own entries are the glob's matches, each checked: not listed
      # here a second time (a listing of every corpus file, 100,000 of them in a benchmark)
      dirs[:] = []
    for name in names:
      # the match first: a stat per file of the corpus (the names in the last directories,
      # never on the way) was most of this walk's cost on 100,000 files
      if _on_the_way(inside + [name], directories):
        path = os.path.join(here, name)
        if os.path.islink(path) and not os.path.exists(path):
          raise _dangling_link_error(path, field)


def _on_the_way(names: list[str], patterns: list[str]) -> bool:
  """Whether the path components `names` match the first components of `patterns` as glob
  matches them ('**' any number of components; a hidden name only a pattern starting with
  '.')."""
  if not names:
    return True
  if not patterns:
    return False
  if names[0].startswith('.') and not patterns[0].startswith('.'):
    return False
  if patterns[0] == '**':
    return _on_the_way(names, patterns[1:]) or _on_the_way(names[1:], patterns)
  return fnmatch.fnmatchcase(names[0], patterns[0]) and _on_the_way(names[1:], patterns[1:])


def _is_supported(path: str) -> bool:
  try:
    format_of(path)
  except DataError:
    return False
  return True


# compression_of and format_of are asked ~13 times per file (checks, reading, the shard's
# name, the file's identity; 1-4 us a call, timed on a loaded machine, 2026-12-07): they
# remember the last paths asked (a file's questions come close together, in one process).
_PATHS_REMEMBERED = 4096


# Before a name's last dot, where the name has no stem (os.path.splitext's rule, below).
_NOT_A_STEM_END = ('.', os.sep)


@functools.lru_cache(maxsize=_PATHS_REMEMBERED)
def compression_of(path: str) -> str:
  """'.gz', '.zst' or '' (not compressed)."""
  for compression in COMPRESSIONS:  # a loop, not a generator: called per file, ~6x
    if path.endswith(compression):
      return compression
  return ''


@functools.lru_cache(maxsize=_PATHS_REMEMBERED)
def format_of(path: str) -> str:
  dot = path.rfind('.')
  extension = path[dot:]
  if extension in FORMATS and dot > 0 and path[dot - 1] not in _NOT_A_STEM_END:
    return extension  # the rule: an uncompressed lowercase name (what follows, ~3x the cost)
  compression = compression_of(path)
  name = path[: -len(compression)] if compression else path
  # os.path.splitext's rule (leading dots are not an extension), without its cost per call
  # (nor os.path.basename's: a file's name is what follows the last separator)
  stem, dot, extension = name.rpartition(os.sep)[2].rpartition('.')
  extension = '.' + extension.lower() if dot and stem.strip('.') else ''
  if extension not in FORMATS:
    raise DataError(
      f'{path}: unknown file format {extension or "(no extension)"!r}; '
      f'expected one of {", ".join(FORMATS)} (optionally {" or ".join(COMPRESSIONS)}).'
    )
  return extension


def is_splittable(path: str) -> bool:
  """Whether the file can be read in byte ranges: uncompressed, line-based, local."""
  return '://' not in path and not compression_of(path) and format_of(path) != '.parquet'


def byte_ranges(path: str, size: int) -> list[tuple[int, int]]:
  """The nominal ranges [start, end) one job each reads (`exact_range` settles their bounds)."""
  if not is_splittable(path) or size <= CHUNK_BYTES:
    return [(0, size)]
  return [(start, min(start + CHUNK_BYTES, size)) for start in range(0, size, CHUNK_BYTES)]


def exact_range(path: str, start: int, end: int, size: int) -> tuple[int, int]:
  """[start, end) moved forward to document boundaries; consecutive nominal ranges give
  consecutive exact ones, so together they cover the file exactly once."""
  if (start, end) == (0, size):
    return 0, size
  with open(path, 'rb') as f:
    return _boundary(f, path, start, size), _boundary(f, path, end, size)


def _boundary(f, path: str, offset: int, size: int) -> int:
  """The first document start at or after `offset`: for JSON lines the next line start, for
  .txt the start of the line after the next blank line (a document never spans it; blank: only
  ASCII whitespace). Scans in blocks, so a file of one huge line costs no memory."""
  if offset <= 0 or offset >= size:
    return min(max(offset, 0), size)
  line_start = _find(f, offset - 1, size, _NEWLINE)  # the line after the one holding offset - 1
  if line_start is None:
    return size
  if format_of(path) != '.txt':
    return line_start
  # A blank line starting at line_start or later: the newline before it, blanks, a newline.
  end = _find(f, line_start - 1, size, _BLANK_LINE)
  return size if end is None else end


_NEWLINE = re.compile(rb'\n')
_BLANK_LINE = re.compile(rb'\n[ \t\r\x0b\x0c]*\n')
_SCAN_BLOCK = 1 << 20


def _find(f, offset: int, size: int, pattern) -> Optional[int]:
  """The end of the first match of `pattern` in the file's bytes [offset, size), scanned in
  blocks; None if there is none. A match spans two blocks only through a newline and blanks
  ending the first, so a block keeps just that newline of the one before."""
  carry, at = b'', offset  # at: the file offset of the block
  f.seek(offset)
  while at < size and (block := f.read(min(_SCAN_BLOCK, size - at))):
    data = carry + block
    match = pattern.search(data)
    if match:
      return at + match.end() - len(carry)
    tail = data.rfind(b'\n')
    carry = b'\n' if tail >= 0 and not data[tail + 1 :].strip() else b''
    at += len(block)
  return None


def sha256_of_range(path: str, start: int, end: int) -> str:
  """SHA-256 of the file's bytes [start, end) (compressed files: of the compressed bytes)."""
  digest = hashlib.sha256()
  with _open_raw(path) as f:
    f.seek(start)
    left = end - start
    while left > 0 and (block := f.read(min(_HASH_BLOCK, left))):
      digest.update(block)
      left -= len(block)
  return digest.hexdigest()


def fingerprint(path: str, info: Optional[os.stat_result] = None) -> dict:
  """Size and modification time: what tells a changed file from the one a store was built on.
  `info`: the local file's os.stat result, where taken already (`expand`'s `stats`)."""
  if '://' in path:
    from etils import epath  # pylint: disable=import-outside-toplevel

    info = epath.Path(path).stat()
    return {'path': path, 'bytes': int(info.length), 'mtime': float(info.mtime)}
  info = info or os.stat(path)
  return {'path': os.path.abspath(path), 'bytes': info.st_size, 'mtime_ns': info.st_mtime_ns}


def read_range(path: str, start: int, end: int) -> bytes:
  """A local file's bytes [start, end) as stored, in one read (a small file is read once, then
  hashed and parsed from memory: `documents(..., data=)`); fewer where the file is shorter.
  Through os.open / os.pread, no file object: a buffered file costs ~10 us to open, read and
  close against ~4 (measured on 300-byte files, 2026-12-07), per file of a corpus of many."""
  fd = os.open(path, os.O_RDONLY)
  try:
    data = os.pread(fd, end - start, start)
    if len(data) in (0, end - start):
      return data
    parts = [data]  # a short read (a pipe-backed file system, a signal): read on to the end
    at = start + len(data)
    while at < end and (block := os.pread(fd, end - at, at)):
      parts.append(block)
      at += len(block)
    return b''.join(parts)
  finally:
    os.close(fd)


def documents(
  path: str,
  text_feature: str,
  byte_range: Optional[tuple[int, int]] = None,
  data: Optional[bytes] = None,
  group_field: str = '',
) -> Iterator:
  """The documents of one file (or of its exact `byte_range`), in order; DataError naming the
  file for any bad input. A range may hold no document; a whole file must hold one.
  `group_field` (JSON lines only): each document comes as (text, the value of that field as
  canonical JSON), DataError for a line without it.

  Only the bytes [start, end) of a local file are read, as stored (a compressed or Parquet
  file's range is the whole file as it was hashed, (0, size)): a file appended to meanwhile
  gives the documents of the bytes that were hashed, not of its new end. `data`: those bytes,
  already read (`read_range`; not for Parquet), so the documents are of exactly them."""
  if byte_range is not None and not group_field and format_of(path) == '.txt':
    # A corpus's rule (clean UTF-8 .txt, a block at a time): the documents without a chain of
    # generators per file, ~2 us of each file of a corpus of many small ones.
    text = _block_text(path, *byte_range, data)
    if text is not None:
      return iter(_text_block_documents(text))
  return _counted_documents(path, text_feature, byte_range, data, group_field)


def _counted_documents(
  path: str,
  text_feature: str,
  byte_range: Optional[tuple[int, int]],
  data: Optional[bytes],
  group_field: str,
) -> Iterator:
  """`documents` as a generator: a whole file must hold a document."""
  count = 0
  for text in _documents(path, format_of(path), text_feature, byte_range, data, group_field):
    count += 1
    yield text
  if not count and byte_range is None:
    raise DataError(f'{path}: the file is empty (no document in it).')


def _documents(
  path: str,
  extension: str,
  text_feature: str,
  byte_range,
  data: Optional[bytes] = None,
  group_field: str = '',
) -> Iterator:
  start, end = byte_range or (0, None)
  if group_field and extension in ('.txt', '.parquet'):
    raise DataError(f'{path}: documents are grouped by a JSON field, but this is {extension}.')
  if extension == '.parquet':
    yield from _parquet_documents(path, text_feature, end)
    return
  text = _block_text(path, start, end, data)
  if text is not None:
    if extension == '.txt':
      yield from _text_block_documents(text)
    else:
      yield from _json_documents(path, _numbered_lines(text), text_feature, start, group_field)
    return
  with _open_binary(path, end, data) as f:
    if start and data is None:
      f.seek(start)
    lines = _lines(path, f, start)
    if extension == '.txt':
      yield from _text_documents(lines)
    else:
      yield from _json_documents(path, lines, text_feature, start, group_field)


def _open_raw(path: str, end: Optional[int] = None):
  """The file's bytes as stored; a local file's first `end` bytes only, where given (a remote
  object is replaced whole, never appended to)."""
  if '://' in path:
    from etils import epath  # pylint: disable=import-outside-toplevel

    return epath.Path(path).open('rb')
  if end is None:
    return open(path, 'rb')
  return io.BufferedReader(_Bounded(open(path, 'rb', buffering=0), end))


class _Bounded(io.RawIOBase):
  """A file's bytes up to `end`, seekable (Parquet reads its footer from the end): what was
  hashed, whatever was appended since."""

  def __init__(self, raw, end: int):
    super().__init__()
    self._raw, self._end = raw, end

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def tell(self) -> int:
    return self._raw.tell()

  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    if whence == io.SEEK_END:
      offset, whence = self._end + offset, io.SEEK_SET
    return self._raw.seek(offset, whence)

  def readinto(self, buffer) -> int:
    left = self._end - self._raw.tell()
    return self._raw.readinto(memoryview(buffer)[:left]) if left > 0 else 0

  def close(self) -> None:
    self._raw.close()
    super().close()


def _open_binary(path: str, end: Optional[int] = None, data: Optional[bytes] = None):
  """The file's bytes decompressed; from `data` (its bytes as stored, from `start`) if given."""
  raw = _open_raw(path, end) if data is None else io.BytesIO(data)
  compression = compression_of(path)
  if compression == '.gz':
    return gzip.open(raw)
  if compression == '.zst':
    try:
      import zstandard  # pylint: disable=import-outside-toplevel
    except ImportError:
      raw.close()
      raise DataError(
        f"{path}: reading .zst needs the zstandard package: pip install 'realformer_jax[zst]' "
        '(or pip install zstandard).'
      ) from None
    return io.BufferedReader(_ZstdFrames(raw, zstandard.ZstdDecompressor()))
  return raw


class _ZstdFrames(io.RawIOBase):
  """The decompressed bytes of a .zst file's frames, one after another. A file that ends inside
  a frame (truncated) raises EOFError there: zstandard's stream_reader ends early without an
  error instead (measured, zstandard 0.25), which would silently drop the file's tail."""

  _READ_BYTES = 1 << 17  # compressed bytes per step; text expands ~3-5x

  def __init__(self, raw, decompressor):
    super().__init__()
    self._raw, self._decompressor = raw, decompressor
    self._frame = None  # the decompressobj of the frame being read, None between frames
    self._out, self._at = memoryview(b''), 0

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    while self._at == len(self._out):
      compressed = self._raw.read(self._READ_BYTES)
      if not compressed:
        if self._frame is not None:
          raise EOFError('the file ends inside a zstd frame: truncated')
        return 0
      self._out, self._at = memoryview(self._decompress(compressed)), 0
    count = min(len(buffer), len(self._out) - self._at)
    buffer[:count] = self._out[self._at : self._at + count]
    self._at += count
    return count

  def _decompress(self, compressed: bytes) -> bytes:
    out = []
    while compressed:
      if self._frame is None:
        self._frame = self._decompressor.decompressobj()
      out.append(self._frame.decompress(compressed))
      compressed = b''
      if self._frame.eof:  # the frame is complete; what follows starts the next one
        compressed, self._frame = self._frame.unused_data, None
    return b''.join(out)

  def close(self) -> None:
    self._raw.close()
    super().close()


def _lines(path: str, f, start: int = 0) -> Iterator[tuple[int, str]]:
  """(line number, decoded line without its newline) of the stream `f`, which starts at byte
  `start` of the file; DataError at binary or non-UTF-8 bytes, with the file's own byte offset
  and line number."""
  offset = start
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
        f'{path}: not UTF-8 text at byte offset {offset + e.start} '
        f'(line {_absolute_line(path, start, number)}).'
      ) from None
    offset += len(raw)
    yield number, line.rstrip('\r\n')


def _block_text(
  path: str, start: int, end: Optional[int], data: Optional[bytes] = None
) -> Optional[str]:
  """An uncompressed local file's bytes [start, end) read and decoded in one piece (~5x cheaper
  per MB than line by line, measured); None where that does not apply (a compressed or remote
  file, a range over _MAX_BLOCK_BYTES) or the bytes are not clean UTF-8 text: then `_lines`
  streams them and names the offending byte."""
  if compression_of(path) or '://' in path:
    return None
  if end is None:
    end = os.path.getsize(path)
  if end - start > _MAX_BLOCK_BYTES:
    return None
  if data is None:
    data = read_range(path, start, end)
  if _NUL in data:
    return None
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError:
    return None


def _numbered_lines(text: str):
  """(line number, line) of a decoded block, as `_lines` gives them."""
  lines = text.split('\n')
  if lines and not lines[-1]:
    lines.pop()  # the newline ending the last line starts no line
  if '\r' in text:
    lines = [line.rstrip('\r') for line in lines]
  return enumerate(lines, 1)


def _absolute_line(path: str, start: int, number: int) -> int:
  """The file's line number of a range's line `number` (error messages only: it counts the
  newlines before the range)."""
  count, offset = number, start
  if not start:
    return number
  with open(path, 'rb') as f:
    while offset > 0 and (block := f.read(min(_HASH_BLOCK, offset))):
      count += block.count(b'\n')
      offset -= len(block)
  return count


def _raw_lines(path: str, f) -> Iterator[bytes]:
  try:
    yield from f
  except (OSError, EOFError) as e:  # a damaged or truncated .gz / .zst
    raise DataError(f'{path}: cannot be read ({e}).') from None
  except Exception as e:  # zstandard.ZstdError has no common base with OSError
    if type(e).__module__.startswith('zstandard'):
      raise DataError(f'{path}: cannot be read ({e}).') from None
    raise


# Between two documents of a .txt: a newline and one or more lines of whitespace only (str's
# whitespace, as `str.strip`), each ended by a newline.
def _text_block_documents(text: str) -> Iterable[str]:
  """The documents of a decoded .txt block: split at once where it holds no carriage return
  (a corpus's rule), else line by line."""
  if '\r' in text:
    return _text_documents(_numbered_lines(text))
  return _split_text_documents(text)


_BLANK_LINES = re.compile(r'\n(?:[^\S\n]*\n)+')


def _split_text_documents(text: str) -> list[str]:
  """`_text_documents` of a block without carriage returns, split by one regular expression
  instead of line by line (~5x cheaper, measured). A piece between two separators is exactly
  one document (the greedy separator leaves no blank line inside a piece, nor an empty piece);
  the first and last pieces may hold a leading or a trailing blank line (`_edge_documents`)."""
  pieces = _BLANK_LINES.split(text)
  if len(pieces) == 1:
    return _edge_documents(text, last=True)
  return [*_edge_documents(pieces[0]), *pieces[1:-1], *_edge_documents(pieces[-1], last=True)]


def _edge_documents(piece: str, last: bool = False) -> list[str]:
  """The documents of the first or `last` piece of a split block (or of a block the split
  left whole). A blank line can only be its first line (none before it to end a separator)
  or its last, unended one (`last`; the file's final newline ends no line): where neither is
  blank the piece is one document, without a loop in Python per line (most pieces of a
  corpus of small files, ~2 a file); else line by line."""
  if last and piece.endswith('\n'):
    piece = piece[:-1]
  if not piece:
    return []
  head = piece.find('\n')
  if piece[:head].strip() if head >= 0 else piece.strip():
    if head < 0 or piece[piece.rfind('\n') + 1 :].strip():
      return [piece]
  return list(_text_documents(_numbered_lines(piece)))


def _text_documents(numbered_lines) -> Iterator[str]:
  lines = []
  for _, line in numbered_lines:
    if line.strip():
      lines.append(line)
    elif lines:
      yield '\n'.join(lines)
      lines = []
  if lines:
    yield '\n'.join(lines)


def _json_documents(
  path: str, numbered_lines, text_feature: str, start: int, group_field: str = ''
) -> Iterator:
  """Each line's `text_feature` (with its `group_field` value as canonical JSON, where
  given)."""
  for number, line in numbered_lines:
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError as e:
      number = _absolute_line(path, start, number)
      raise DataError(f'{path}: line {number} is not JSON ({e.msg}).') from None
    value = _field(path, start, number, record, text_feature, 'data.text_feature')
    if not isinstance(value, str):
      number = _absolute_line(path, start, number)
      raise DataError(
        f'{path}: line {number} field {text_feature!r} is {type(value).__name__}, not a string.'
      )
    if group_field:
      group = _field(path, start, number, record, group_field, 'data.eval_holdout_by')
      if group is None:  # every null would be one group: held out or trained on all together
        number = _absolute_line(path, start, number)
        raise DataError(
          f'{path}: line {number} has null in field {group_field!r} (data.eval_holdout_by), '
          'which would put every such document in one group: give it a value.'
        )
      yield value, json.dumps(group, sort_keys=True)
    else:
      yield value


def _field(path: str, start: int, number: int, record, name: str, setting: str):
  """The field `name` ('a/b': nested) of a JSON line's `record`; DataError naming the line."""
  value = record
  for key in name.split('/'):
    if not isinstance(value, dict) or key not in value:
      number = _absolute_line(path, start, number)
      raise DataError(
        f'{path}: line {number} has no field {name!r} ({setting}); '
        f'its fields: {sorted(record) if isinstance(record, dict) else type(record).__name__}.'
      )
    value = value[key]
  return value


def _parquet_documents(path: str, text_feature: str, end: Optional[int]) -> Iterator[str]:
  try:
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise DataError(f'{path}: reading Parquet needs pyarrow (pip install pyarrow).') from None
  with contextlib.ExitStack() as stack:
    source = path if end is None else stack.enter_context(_open_raw(path, end))
    try:
      parquet = pq.ParquetFile(source)
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

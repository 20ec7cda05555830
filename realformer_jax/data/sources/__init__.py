"""Where masked-LM text comes from: data sources behind one interface (registry.py).

    data.source='auto'   files if data.train_files is set, else embedded for bible_web,
                         else tfds (the first registered source that claims the config)
    'files'     your own .txt / .jsonl / .json / .parquet files (files.py, file_corpus.py)
    'embedded'  the bible_web corpus shipped with the package, no network (embedded.py)
    'tfds'      any TFDS text dataset prepared in array_record format (tfds.py)

A new source is one module with `open_source(config, workers) -> OpenedSource` and one
`register(Source(name, module))` (docs/extending.md walks through one). The records below are
data: a source's module (and TFDS) is imported when it is opened.

The old `data/sources.py` names (load_builder, open_split, quiet_tfds, is_embedded, text_of)
are tfds.py's, loaded on first use.
"""

from realformer_jax.data.sources.registry import (
  AUTO,
  EMBEDDED_DATASET,
  OpenedSource,
  Source,
  data_dir_of,
  for_config,
  get,
  names,
  register,
  unregister,
)
from realformer_jax.extras import public_names


def is_embedded(config) -> bool:
  return config.dataset.split(':')[0].split('/')[0] == EMBEDDED_DATASET


# The built-in sources, in the order 'auto' asks them (tfds claims every config, so last).
register(Source('files', f'{__name__}.files', claims=lambda config: bool(config.train_files)))
register(Source('embedded', f'{__name__}.embedded', claims=is_embedded, key_names_source=False))
register(Source('tfds', f'{__name__}.tfds', claims=lambda config: True, key_names_source=False))

_TFDS_NAMES = ('load_builder', 'open_split', 'quiet_tfds', 'text_of')

__all__ = [
  'AUTO',
  'EMBEDDED_DATASET',
  'OpenedSource',
  'Source',
  'data_dir_of',
  'for_config',
  'get',
  'is_embedded',
  'names',
  'register',
  'unregister',
]

__getattr__, __dir__ = public_names(globals(), dict.fromkeys(_TFDS_NAMES, '.tfds'))

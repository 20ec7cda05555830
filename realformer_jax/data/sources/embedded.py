"""The `embedded` source: the bible_web corpus shipped with the package (data/corpus.py), a
TFDS builder prepared on first use under data.data_dir with no network."""

from __future__ import annotations

from typing import Any, Optional

from realformer_jax.data.errors import DataError
from realformer_jax.data.sources import EMBEDDED_DATASET, is_embedded, tfds
from realformer_jax.data.sources.registry import OpenedSource


def open_source(config: Any, workers: Optional[int] = None) -> OpenedSource:
  if not is_embedded(config):
    raise DataError(
      f'data.source=embedded reads data.dataset={EMBEDDED_DATASET!r}, not '
      f"{config.dataset!r}: set data.source='tfds' (or 'auto') for a TFDS dataset"
    )
  return tfds.open_source(config, workers)

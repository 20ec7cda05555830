"""A data source in one module, as docs/extending.md shows it: one document per line of the
text file data.dataset names; the last tenth of the lines are held out for evaluation."""

import hashlib
import os

import grain

from realformer_jax.data import sources
from realformer_jax.data.errors import DataError


def open_source(config, workers=None):
  del workers  # one small file: read here
  path = os.path.expanduser(config.dataset)
  if not os.path.isfile(path):
    raise DataError(f'data.dataset={config.dataset!r}: no such file (the lines source)')
  with open(path, encoding='utf-8') as f:
    lines = [line.strip() for line in f if line.strip()]
  held_out = max(1, len(lines) // 10)
  records = [{config.text_feature: line} for line in lines]
  train = grain.MapDataset.source(records[:-held_out])
  name = 'lines-' + hashlib.sha256('\n'.join(lines).encode()).hexdigest()[:16]
  return sources.OpenedSource(
    train_records=train,
    eval_records=grain.MapDataset.source(records[-held_out:]),
    description=f'lines of {path}',
    dataset_name=name,
    cache_dir=os.path.join(sources.data_dir_of(config), name),
    key={'dataset': name},  # named by content: an edited file is another corpus
    train_segments=((train, 0, len(train)),),
  )


SOURCE = sources.register(sources.Source('lines', module=__name__))

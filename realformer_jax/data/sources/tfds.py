"""The `tfds` source: a TFDS text dataset as a random-access source, with fail-fast checks
(the `embedded` source, embedded.py, opens its builder through this module too).

Every check runs before any text is tokenized or any model is compiled, and each failure is a
one-line DataError naming the dataset, split, feature or directory:
  unknown dataset name; not prepared under data_dir while download=False (we never touch the
  network then); prepared in a format grain cannot read (tfrecord needs TensorFlow); unknown
  split; missing or non-text feature; split with zero records; a missing or damaged shard file
  (shard_check.py, which also names the file when a later read meets damage).
`config` below is any data section that names `dataset`, `data_dir` and `download` (the
masked-LM DataConfig, the fine-tuning one).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from typing import Any, Optional

from realformer_jax import extras
from realformer_jax.data import corpus, shard_check
from realformer_jax.data.encoding import text_of  # noqa: F401  (re-exported: its old home)
from realformer_jax.data.errors import DataError
from realformer_jax.data.sources import is_embedded
from realformer_jax.data.sources.registry import OpenedSource, data_dir_of
from realformer_jax.data.store import cache_lock

grain = extras.lazy('grain')
tfds = extras.lazy('tensorflow_datasets')

# 'huggingface:mnist' (a namespace), but not 'mnist:3.0.1' (a version).
_NAMESPACE = re.compile(r'^[A-Za-z_][\w-]*:(?!\d)')


def _verbose() -> bool:
  """Whether the user asked for library notes (--verbosity=0 or more on the command line)."""
  from absl import flags  # pylint: disable=import-outside-toplevel

  if 'verbosity' not in flags.FLAGS or not flags.FLAGS.is_parsed():
    return False
  verbosity = flags.FLAGS['verbosity']
  return bool(verbosity.present and verbosity.value >= 0)


class _DropTfdsNotes(logging.Filter):
  """TFDS's notes about its own folders ("Variant folder ... has no dataset_info.json")."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith('Variant folder')


@contextlib.contextmanager
def quiet_tfds():
  """No TFDS notes, "Downloading and preparing dataset" lines or tqdm bars while a dataset is
  opened or prepared (nothing is downloaded for the embedded corpus), unless --verbosity asks."""
  if _verbose():
    yield
    return
  from tensorflow_datasets.core.utils import tqdm_utils  # pylint: disable=import-outside-toplevel

  absl_logger, note_filter = logging.getLogger('absl'), _DropTfdsNotes()
  was_active = tqdm_utils._active  # pylint: disable=protected-access
  absl_logger.addFilter(note_filter)
  tqdm_utils.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    tqdm_utils.display_progress_bar(was_active)
    absl_logger.removeFilter(note_filter)


def load_builder(config: Any) -> tfds.core.DatasetBuilder:
  """The dataset's builder, prepared (embedded corpus or download=True) or checked prepared."""
  with quiet_tfds():
    return _load_builder(config)


def _load_builder(config: Any) -> tfds.core.DatasetBuilder:
  name, data_dir = config.dataset, data_dir_of(config)
  builder = _make_builder(config)
  if not builder.is_prepared():
    if not (is_embedded(config) or config.download):
      raise DataError(
        f"Dataset '{name}' is not prepared under data_dir {data_dir} and "
        f'download=False: prepare it in array_record format '
        f'(tfds build --file_format=array_record) or set download=True.'
      )
    os.makedirs(data_dir, exist_ok=True)
    with cache_lock.exclusive_lock(data_dir, f'prepare-{name}'):
      # A new builder: one made before another process prepared the dataset keeps the empty
      # info it read then (no splits).
      builder = _make_builder(config)
      if not builder.is_prepared():
        builder.download_and_prepare(file_format='array_record')
  if 'array_record' not in {f.value for f in builder.info.available_file_formats()}:
    raise DataError(
      f"Dataset '{name}' under {builder.data_dir} is stored as "
      f'{builder.info.file_format.value}; grain needs array_record '
      f'(re-prepare with tfds build --file_format=array_record).'
    )
  return builder


def _make_builder(config: Any) -> tfds.core.DatasetBuilder:
  name, data_dir = config.dataset, data_dir_of(config)
  if is_embedded(config):
    return corpus.BibleWeb(data_dir=data_dir)
  if _NAMESPACE.match(name) and not config.download:
    raise DataError(
      f"Dataset '{name}' is a community (namespaced) dataset, which TFDS looks "
      f'up online: set download=True or use a local catalog name.'
    )
  try:
    # Local only: tfds.builder reads the catalog code and data_dir; no network.
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise DataError(
      f"Unknown dataset '{name}': not in the TFDS catalog and not prepared "
      f'under data_dir {data_dir}.'
    ) from None
  except (ValueError, KeyError) as e:  # E.g. unknown config or version.
    raise DataError(
      f"Dataset '{name}' cannot be opened from data_dir {data_dir}: {_first_line(e)}"
    ) from None


def open_split(
  builder: tfds.core.DatasetBuilder, split: str, text_feature: str, max_documents: int = -1
) -> grain.MapDataset:
  """The records of `split` (the first `max_documents` if > 0), checked non-empty and textual."""
  name = builder.info.full_name
  _check_text_feature(builder, text_feature)
  try:
    num_records = builder.info.splits[split].num_examples
  except (ValueError, KeyError) as e:  # Unknown split or bad slice syntax.
    raise DataError(
      f"Dataset '{name}' has no split '{split}' (available: "
      f'{sorted(builder.info.splits)}): {_first_line(e)}'
    ) from None
  if num_records == 0:  # Checked first: as_data_source fails obscurely on empty slices.
    raise DataError(f"Dataset '{name}' split '{split}' has zero records.")
  # Missing or damaged files fail here or on the read that meets them, naming the file.
  fix = shard_check.remedy(builder, embedded=builder.name == corpus.BibleWeb.name)
  files = shard_check.check_files(builder, split, fix)
  records = grain.MapDataset.source(
    shard_check.CheckedSource(
      builder.as_data_source(split), files, f"Dataset '{name}' split '{split}'", fix
    )
  )
  return records[:max_documents] if max_documents > 0 else records


def _check_text_feature(builder: tfds.core.DatasetBuilder, text_feature: str) -> None:
  feature = builder.info.features
  for key in text_feature.split('/'):
    if not isinstance(feature, tfds.features.FeaturesDict) or key not in feature.keys():
      available = sorted(feature.keys()) if isinstance(feature, tfds.features.FeaturesDict) else []
      raise DataError(
        f"Dataset '{builder.info.full_name}' has no text feature "
        f"'{text_feature}' (top-level features: "
        f'{sorted(builder.info.features.keys())}; at {key!r}: {available}).'
      )
    feature = feature[key]
  if not isinstance(feature, tfds.features.Text):
    raise DataError(
      f"Feature '{text_feature}' of dataset '{builder.info.full_name}' is "
      f'{type(feature).__name__}, not Text.'
    )


def _first_line(error: Exception) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0]


def open_source(config: Any, workers: Optional[int] = None) -> OpenedSource:
  """The train and eval splits of data.dataset (prepared under data.data_dir, or prepared now:
  the embedded corpus, or download=True)."""
  del workers  # TFDS reads its shards itself
  builder = load_builder(config)
  name = builder.info.full_name
  train_records, eval_records = (
    open_split(builder, split, config.text_feature, config.max_documents)
    for split in (config.train_split, config.eval_split)
  )
  return OpenedSource(
    train_records=train_records,
    eval_records=eval_records,
    description=f"dataset '{name}'",
    dataset_name=name,
    # Beside the dataset's version directories (TFDS ignores names that are not versions).
    cache_dir=os.path.dirname(os.fspath(builder.data_dir)),
    key={'dataset': name, 'split': config.train_split},
    split_names=(config.train_split, config.eval_split),
    train_segments=((train_records, 0, len(train_records)),),
  )

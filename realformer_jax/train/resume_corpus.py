"""A resume whose file corpus changed since its newest step is refused before any preparation.

The steps of a run record the packed store their data position reads (its data state's
'store'); that store's corpus directory records the files it was read from
(data/corpus_changes.py). A file added to, removed from or resized in the corpus makes another
corpus digest, so preparing it would train another tokenizer and pack another store, minutes to
hours of work whose end is a refusal anyway (the tokenizer check or the data position's). Here
the listing of the files alone (a stat each) says so first, in one line naming the files.
"""

from __future__ import annotations

import contextlib
import os

from realformer_jax.config import ConfigError
from realformer_jax.data import corpus_changes
from realformer_jax.train import checkpoint_record
from realformer_jax.train.checkpointing import committed_steps
from realformer_jax.train.config import RunSpec
from realformer_jax.workdir_layout import checkpoints_dir

# The data fields that name the corpus's files: where the resume changed them, the user chose
# other files, and the remedy is the config the run was trained with.
_FILE_FIELDS = ('train_files', 'eval_files')


def check_corpus(spec: RunSpec, workdir: str) -> None:
  """ConfigError where the file corpus of `spec` certainly differs from the one the newest
  committed step of `workdir` was trained on (corpus_changes.since_prepared); None otherwise,
  also for a fresh run, a TFDS corpus, or a step whose store's corpus is not found under
  data.data_dir."""
  committed = committed_steps(checkpoints_dir(workdir))
  if not committed:
    return
  step = committed[-1]
  step_dir = os.path.join(checkpoints_dir(workdir), str(step))
  changes = corpus_changes.since_prepared(spec.data, checkpoint_record.recorded_store(step_dir))
  if changes is None:
    return
  record = None
  with contextlib.suppress(ConfigError):  # a damaged record: no recorded config to compare
    record = checkpoint_record.read(step_dir)
  recorded = ((record or {}).get('config') or {}).get('data') or {}
  current = spec.to_dict()['data']
  moved = [f for f in _FILE_FIELDS if f in recorded and recorded[f] != current[f]]
  remedy = corpus_changes.REMEDY
  if moved:
    given = ', '.join(f'data.{f}={recorded[f]!r}' for f in moved)
    remedy = f'resume with the files it was trained with ({given}), or use a new --workdir'
  raise ConfigError(
    f'the corpus of the run in {workdir} {changes.describe(since=f"checkpoint step {step}")}; '
    'resuming would prepare another corpus (its own tokenizer and packed store) and train on '
    f'text the checkpoints were not trained on: {remedy}'
  )

"""The names inside a training run's workdir, in one place: train/ writes them; the export
(interop/hf_export.py), fine-tuning's starting points and the studies read them. Old workdirs
must keep working, so a name here changes only with a reader for the old one."""

import os

CONFIG_FILE = 'config.json'  # the validated spec's sections (train/loop.py writes it)
CHECKPOINTS = 'checkpoints'  # orbax steps, one folder each (train/checkpointing.py)
BEST = 'best'  # the best evaluated step, kept apart from the rotated ones
LOCK_FILE = 'run.lock'  # who holds the workdir (train/workdir_lock.py)
STEP_RECORD = (
  'run_record.json'  # in each checkpoint step: the run's config (train/checkpoint_record.py)
)
TENSORBOARD = 'tensorboard'  # event files (train/loop.py: MetricWriter)

# What marks a directory as a training run's: an export must not write over one.
RUN_MARKERS = (CHECKPOINTS, LOCK_FILE, CONFIG_FILE)
# Directories whose contents the run manages (rotates, renames, appends to): nothing else may
# be written inside them (checkpoint rotation would delete an export put there).
MANAGED_DIRS = (CHECKPOINTS, BEST, TENSORBOARD)


def checkpoints_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINTS)


def best_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), BEST)

r"""Masked-LM pretraining. The guide (configs, resuming, several hosts, faults): docs/training.md.

    python -m experiments.train --config=configs/tiny.py --workdir=/tmp/realformer_tiny
    realformer-train --config=configs/tiny.py --workdir=/tmp/realformer_tiny   # any directory
    python -m experiments.train --config=configs/realformer_large.py --workdir=DIR \
        --config.train.global_batch_size=256 --config.mesh.shape='(1,-1,1)'

--print_config prints the resolved config, every field with its one-line meaning (the comments
beside the fields in their dataclasses), and exits.
Re-running with the same --workdir resumes from its latest checkpoint. Ctrl-C or SIGTERM saves a
checkpoint at the step in progress and exits 130 (Ctrl-C) or 143 (SIGTERM); the status is 0
only when the run finished, so `realformer-train ... && realformer-export ...` never exports a
half-trained model. Bad flags, configs and
data exit with status 1 and one line `error: <message>` on stderr, before any compilation; so
do the faults of a long run (a damaged checkpoint or data file, a full disk, a workdir that
another run holds: docs/training.md "Reliability").
On CPU, --malloc=retain makes the process re-execute itself (same PID) with glibc settings that
stop XLA's per-step temporaries from being page-faulted afresh every step (~20% faster BERT-Base
steps on 2 cores; realformer_jax/malloc.py).
"""

# The logic lives in realformer_jax/train/: this entry point stays short.
import sys

from absl import app, flags
from ml_collections import config_flags

from realformer_jax import malloc, train
from realformer_jax.commands.cli import (
  CONFIG_HELP,
  define_print_config,
  fail,
  fail_after_training,
  loaded,
  parse_flags,
  print_config,
  quiet_logs,
)
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.data import DataConfig, DataError
from realformer_jax.train import config as train_config
from realformer_jax.train import preemption, workdir_lock
from realformer_jax.train.checkpointing import committed_steps
from realformer_jax.workdir_layout import checkpoints_dir

_CONFIG = config_flags.DEFINE_config_file('config', None, CONFIG_HELP, lock_config=True)
_PRINT_CONFIG = define_print_config()
_WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints, TensorBoard logs, config.json.')
_MALLOC = flags.DEFINE_enum(
  'malloc',
  'default',
  list(malloc.TUNABLES),
  'glibc malloc settings; the process re-executes itself with them '
  '(realformer_jax/malloc.py). retain: fastest XLA:CPU steps.',
)
flags.mark_flags_as_required(['config'])

# Each section's schema, whose field comments --print_config shows (train/config.py).
SCHEMAS = {
  'model': ModelConfig,
  'data': DataConfig,
  'train': train_config.TrainConfig,
  'mesh': train_config.MeshConfig,
  'distributed': train_config.DistributedConfig,
}
NOTES = {'logical_axis_rules': "the model's logical axis names -> mesh axes (first match wins)"}


def run_job(argv, job, schemas=SCHEMAS, as_run=None):
  """The checks and settings every entry point shares, then `job(config, workdir)`; a user
  error (ConfigError, DataError, TrainingError) exits 1 with one line. --print_config prints
  the config instead (`schemas`: each section's dataclass), as it runs: `as_run(config)` gives
  (config, {'section.field': note}) with the values the command derives (fine-tuning's
  schedule)."""
  if len(argv) > 1:
    fail(f'unexpected arguments: {argv[1:]}')
  if _PRINT_CONFIG.value:
    config, field_notes = loaded(_CONFIG.value), {}
    if as_run is not None:
      try:
        config, field_notes = as_run(config)
      except (ConfigError, DataError) as e:
        fail(str(e))
    print_config(config, schemas, NOTES, field_notes)
    return
  if _WORKDIR.value is None:
    fail('flag --workdir must have a value other than None')
  try:  # before any data is built: an empty, file or read-only workdir is one line
    workdir_lock.check_usable(_WORKDIR.value)
  except train.TrainingError as e:
    fail(str(e))
  malloc.reexec_with(_MALLOC.value)  # before any work: only the PID survives an exec
  quiet_logs(libraries=True)
  config = loaded(_CONFIG.value)
  result = None
  try:
    # SIGTERM or Ctrl-C in the loop: save, return, exit 143 / 130 below; SIGTERM while the data
    # is prepared unwinds as a Ctrl-C does (the workers stopped, nothing half-written left).
    with preemption.return_on_preemption(), preemption.sigterm_unwinds():
      result = job(config, _WORKDIR.value)
  except (ConfigError, DataError) as e:
    fail(str(e))
  except train.TrainingError as e:  # a failed save, a busy workdir, a non-finite loss...
    fail_after_training(str(e))
  except preemption.SecondInterrupt:  # the first Ctrl-C saves and exits 130
    fail_after_training(
      f'interrupted twice: stopped without saving; {_rerun(_WORKDIR.value)}', status=130
    )
  except preemption.Terminated:  # outside the loop (data being prepared): no step to save
    # sys.exit, not os._exit: the exit handlers stop the data worker processes.
    fail(
      f'SIGTERM while no step was running (nothing to save); {_rerun(_WORKDIR.value)}',
      status=preemption.exit_status('SIGTERM'),
    )
  except KeyboardInterrupt:  # while data was built or the workdir opened: no step to save yet
    fail_after_training(
      'interrupted before training started (nothing to save); a rerun starts, or resumes, '
      'as this one would have',
      status=130,
    )
  if isinstance(result, dict) and result.get('preempted'):  # saved (the loop said so): not done
    sys.exit(preemption.exit_status(result['signal']))


def _rerun(workdir: str) -> str:
  """What a rerun on `workdir` starts from, by the checkpoints committed there."""
  steps = committed_steps(checkpoints_dir(workdir))
  if steps:
    return f'a rerun resumes from the checkpoint at step {steps[-1]}'
  return 'no checkpoint was saved yet: a rerun starts from step 0'


def main(argv):
  run_job(argv, train.train_and_evaluate)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

r"""Fine-tuning: GLUE-style classification / regression, SQuAD-style span extraction, and the
embedded labelled tasks, or your own labelled files, from a pretraining workdir, Hugging Face
BERT weights or random init, on the pretraining loop (checkpoints, resume, one-line errors).

    python -m experiments.finetune --config=configs/finetune/bible_sections.py --workdir=DIR \
        --config.finetune.init=/tmp/realformer_tiny
    python -m experiments.finetune --config=configs/finetune/glue.py:mrpc --workdir=DIR \
        --config.finetune.init=/path/to/bert/model.safetensors
    realformer-finetune --train_file=train.csv --validation_file=dev.csv --workdir=DIR \
        --config=configs/finetune/files.py:init=/tmp/realformer_tiny

Your own labelled files (--train_file, --validation_file, --test_file): CSV, TSV or JSON Lines
with a text column (--text_column, a second one for pairs: --text_pair_column) and a label
column (--label_column), the classes being the train file's labels; or SQuAD-format JSON for
span extraction. --train_file alone picks configs/finetune/files.py.

Takes the same flags as experiments.train (--config, --workdir, --malloc, --print_config,
--config.a.b=v);
re-running with the same --workdir resumes; bad flags, configs and data exit with status 1 and
one line `error: <message>`, before any compilation. Ctrl-C or SIGTERM saves a checkpoint and
exits 130 or 143 (no results.json); 0 only when the run finished. The run prints the eval
metric each epoch, keeps the best checkpoint (by the dataset's metric) in DIR/best, evaluates
it on the test split where the dataset has a labelled one, and writes DIR/results.json (every
split's metrics, the classes of your own files, and what the starting weights came from).
"""

# The logic lives in realformer_jax/finetune/ (the loop: realformer_jax/train/).
import os

from absl import app, flags
from ml_collections import config_flags

from realformer_jax import finetune
from realformer_jax.commands import (
  train as train_cli,
)  # its flags: --config, --workdir, --malloc, ...
from realformer_jax.commands.cli import quiet_logs
from realformer_jax.configs.finetune import tiny_model
from realformer_jax.finetune import config as finetune_config
from realformer_jax.finetune import files
from realformer_jax.finetune.run import config_as_run

flags.adopt_module_key_flags(train_cli)  # --help lists them here too
# Your own files, named as run_glue / run_qa name them: each flag sets its data.<field>.
_FILE_FLAGS = {
  name: flags.DEFINE_string(name, None, f'{meaning} (sets data.{name}).')
  for name, meaning in (
    (
      'train_file',
      'Your own training file: .csv, .tsv, .jsonl (classes: its labels) or SQuAD-format .json',
    ),
    ('validation_file', 'Your own validation file (evaluated each epoch)'),
    ('test_file', 'Your own test file (evaluated once, with the best checkpoint)'),
    ('text_column', "The text column of your .csv / .tsv / .jsonl files (default 'text')"),
    ('text_pair_column', 'The second text of a pair (default: one text)'),
    ('label_column', "The label column (default 'label')"),
  )
}
# The config --train_file picks when --config is not given.
FILES_CONFIG = 'configs/finetune/files.py'
SCHEMAS = dict(
  train_cli.SCHEMAS,
  data=finetune_config.FinetuneDataConfig,
  finetune=finetune_config.FinetuneConfig,
)


def parse_flags(argv):
  """train's parsing, with configs/finetune/files.py as the config of a --train_file run that
  names none."""
  given = [a.split('=')[0] for a in argv[1:]]
  if '--train_file' in given and '--config' not in given:
    argv = argv[:1] + [f'--config={FILES_CONFIG}'] + argv[1:]
  return train_cli.parse_flags(argv)


def checkpoint_model_for_init_flag(config) -> None:
  """--config.finetune.init=PATH after a config file read without `init=`: that file gave the
  model section configs/tiny.py's architecture (a random init's); the starting checkpoint's
  own replaces it, as with the file's `:init=PATH`. Fields the user set with --config.model.*
  stay set (and are compared with the checkpoint's)."""
  overrides = config_flags.get_override_values(flags.FLAGS['config'])
  if not overrides.get('finetune.init'):
    return
  random_init = tiny_model()
  unset = [name for name in random_init if f'model.{name}' not in overrides]
  if any(config.model[name] != random_init[name] for name in unset):
    return  # the file's argument had init= (its model unset) or the file set its own model
  for name in unset:
    config.model[name] = None
  if 'data.vocab_size' not in overrides and config.data.vocab_size == random_init['vocab_size']:
    config.data.vocab_size = finetune_config.FinetuneDataConfig.vocab_size


def main(argv):
  if flags.FLAGS.print_config:  # the config alone on stdout, no library's log line before it
    quiet_logs(libraries=True)
  config = train_cli.loaded(flags.FLAGS.config)
  checkpoint_model_for_init_flag(config)
  for name, flag in _FILE_FLAGS.items():
    if flag.value is not None:
      # Files as absolute paths: config.json names them for a resume from anywhere.
      is_file = name.endswith('_file') and flag.value
      config.data[name] = os.path.abspath(flag.value) if is_file else flag.value
  if _FILE_FLAGS['train_file'].value is not None:
    config.data.dataset = files.NAME
  # --print_config shows the schedule that runs (derived from finetune.num_epochs).
  train_cli.run_job(argv, finetune.run, SCHEMAS, as_run=config_as_run)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

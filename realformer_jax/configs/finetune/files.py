r"""Your own labelled files: CSV / TSV / JSON Lines (classification) or SQuAD-format JSON (span
extraction), as Hugging Face's run_glue / run_qa take them (realformer_jax/finetune/files.py).

    realformer-finetune --train_file=train.csv --validation_file=dev.csv --test_file=test.csv \
        --config=configs/finetune/files.py:init=/tmp/realformer_tiny --workdir=DIR
    python -m experiments.finetune --config=configs/finetune/files.py --workdir=DIR \
        --train_file=realformer_jax/configs/finetune/example_files/train.csv \
        --validation_file=realformer_jax/configs/finetune/example_files/dev.csv \
        --test_file=realformer_jax/configs/finetune/example_files/test.csv

The example files (from the repository root) are ASV verses of three sections of the canon
(law, gospels_acts, letters_revelation; 120 / 30 / 30, chapters shared by no two files), in
the format your own files take. --train_file alone picks this config (without `init=`:
configs/tiny.py's model, randomly initialised). Tables name their columns with --text_column
(default 'text'), --text_pair_column (a second text, default none) and --label_column (default
'label'); the classes are the train file's labels. Sequences of 128 tokens, 3 epochs at batch
32 (BERT's recipe).
"""

from realformer_jax.configs.finetune import start_from_arg
from realformer_jax.finetune import config as finetune_config
from realformer_jax.finetune import files


def get_config(arg: str = ''):
  config = finetune_config.default_config()
  start_from_arg(config, arg)
  config.data.dataset = files.NAME  # the files themselves come from --train_file etc.
  config.model.dropout_rate = 0.1
  config.model.attention_dropout_rate = 0.1
  config.train.learning_rate = 1e-4
  config.train.log_every_steps = 100
  return config

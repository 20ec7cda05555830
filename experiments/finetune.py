r"""Fine-tuning: GLUE-style classification / regression, SQuAD-style span extraction, and the
embedded labelled tasks, from a pretraining workdir, Hugging Face BERT weights or random init.
This file is intentionally kept short: the logic lives in realformer_jax/finetune/ and the
training loop is the pretraining one (realformer_jax/train/).

    python -m experiments.finetune --config=configs/finetune/bible_sections.py --workdir=DIR \
        --config.finetune.init=/tmp/realformer_tiny
    python -m experiments.finetune --config=configs/finetune/glue.py:mrpc --workdir=DIR \
        --config.finetune.init=/path/to/bert/model.safetensors

Takes the same flags as experiments.train (--config, --workdir, --malloc, --print_config,
--config.a.b=v);
re-running with the same --workdir resumes; bad flags, configs and data exit with status 1 and
one line `error: <message>`, before any compilation. The run prints the eval metric each epoch,
keeps the best checkpoint (by the dataset's metric) in DIR/best, evaluates it on the test split
where the dataset has a labelled one, and writes DIR/results.json.
"""

from absl import app, flags

from experiments import train as train_cli  # its flags: --config, --workdir, --malloc, ...
from realformer_jax import finetune
from realformer_jax.finetune import config as finetune_config
from realformer_jax.finetune.run import config_as_run

flags.adopt_module_key_flags(train_cli)  # --help lists them here too
SCHEMAS = dict(
  train_cli.SCHEMAS,
  data=finetune_config.FinetuneDataConfig,
  finetune=finetune_config.FinetuneConfig,
)


def main(argv):
  # --print_config shows the schedule that runs (derived from finetune.num_epochs).
  train_cli.run_job(argv, finetune.run, SCHEMAS, as_run=config_as_run)


if __name__ == '__main__':
  app.run(main, flags_parser=train_cli.parse_flags)

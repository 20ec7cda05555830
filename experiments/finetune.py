r"""Fine-tuning (classification, regression, spans; GLUE, SQuAD or your own files):

    python -m experiments.finetune --config=configs/finetune/bible_sections.py --workdir=DIR \
        --config.finetune.init=/tmp/realformer_tiny

The command is realformer_jax/commands/finetune.py (its docstring, or --help, gives every flag);
this entry point only runs it. Installed, the same command is `realformer-finetune`."""

from realformer_jax.commands import scripts

if __name__ == '__main__':
  scripts.finetune()

"""Masked-LM pretraining:

    python -m experiments.train --config=configs/tiny.py --workdir=/tmp/realformer_tiny

The command is realformer_jax/commands/train.py (its docstring, or --help, gives every flag);
this entry point only runs it. Installed, the same command is `realformer-train`."""

from realformer_jax.commands import scripts

if __name__ == '__main__':
  scripts.train()

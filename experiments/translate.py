"""Merged attention vs the standard decoder on WEB -> BBE:

    python -m experiments.translate --config=configs/translate.py

The command is realformer_jax/commands/translate.py (its docstring, or --help, gives every flag);
this entry point only runs it. Installed, the same command is `realformer-translate`."""

from realformer_jax.commands import scripts

if __name__ == '__main__':
  scripts.translate()

"""A config compiled for a GPU or TPU on any machine: memory, fit, time estimate:

    python -m experiments.compile --config=configs/realformer_large.py --target=h100:8

The command is realformer_jax/commands/compile.py (its docstring, or --help, gives every flag);
this entry point only runs it. Installed, the same command is `realformer-compile`."""

from realformer_jax.commands import scripts

if __name__ == '__main__':
  scripts.compile_for()

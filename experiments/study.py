"""A declared study plan (realformer_jax/studies/plans/NAME.py) trained, then reported:

    python -m experiments.study --plan=tuned_rates

The command is realformer_jax/commands/study.py (its docstring, or --help, gives every flag);
this entry point only runs it."""

from realformer_jax.commands import scripts

if __name__ == '__main__':
  scripts.study()

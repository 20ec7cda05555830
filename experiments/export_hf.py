"""A pretraining or fine-tuning workdir as a Hugging Face directory:

    python -m experiments.export_hf --workdir=/tmp/realformer_tiny --out=/tmp/realformer_tiny_hf

The command is realformer_jax/commands/export_hf.py (its docstring, or --help, gives every flag);
this entry point only runs it. Installed, the same command is `realformer-export`."""

from realformer_jax.commands import scripts

if __name__ == '__main__':
  scripts.export()

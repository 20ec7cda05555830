"""Is this project correct and fast on this machine? One report:

    python -m experiments.device_check --out=report.json

The command is realformer_jax/commands/device_check.py (its docstring, or --help, gives every flag);
this entry point only runs it. Installed, the same command is `realformer-device-check`."""

from realformer_jax.commands import scripts

if __name__ == '__main__':
  scripts.device_check()

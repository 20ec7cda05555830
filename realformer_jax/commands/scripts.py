"""The console scripts the package installs (pyproject.toml [project.scripts]): each runs its
command's module (commands/<module>.py) as `__main__`, exactly as `python -m experiments.<module>`
does in a clone (same flags, same exit status: those entry points call these), from any directory. A
shipped config is named as in the docs, `--config=configs/tiny.py`, wherever the command runs
(commands/cli.py `shipped_config`)."""

import runpy
from typing import Callable


def _command(module: str) -> Callable[[], None]:
  def run() -> None:
    runpy.run_module(module, run_name='__main__', alter_sys=True)

  run.module = module  # what it runs, for the tests and for reading
  run.__doc__ = f'python -m {module}'
  return run


train = _command('realformer_jax.commands.train')
finetune = _command('realformer_jax.commands.finetune')
prepare = _command('realformer_jax.commands.prepare_data')
export = _command('realformer_jax.commands.export_hf')
translate = _command('realformer_jax.commands.translate')
compile_for = _command('realformer_jax.commands.compile')
device_check = _command('realformer_jax.commands.device_check')
# `python -m experiments.study` only: a study's report goes to the clone's docs/results.
study = _command('realformer_jax.commands.study')

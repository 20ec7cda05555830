"""The console scripts the package installs (pyproject.toml [project.scripts]): each runs its
command's module exactly as `python -m experiments.<module>` does (same flags, same exit
status), from any directory. A shipped config is named as in the docs, `--config=configs/tiny.py`,
wherever the command runs (experiments/cli.py `shipped_config`)."""

import runpy
from typing import Callable


def _command(module: str) -> Callable[[], None]:
  def run() -> None:
    runpy.run_module(module, run_name='__main__', alter_sys=True)

  run.module = module  # what it runs, for the tests and for reading
  run.__doc__ = f'python -m {module}'
  return run


train = _command('experiments.train')
finetune = _command('experiments.finetune')
prepare = _command('experiments.prepare_data')
export = _command('experiments.export_hf')
translate = _command('experiments.translate')
compile_for = _command('experiments.compile')
device_check = _command('experiments.device_check')

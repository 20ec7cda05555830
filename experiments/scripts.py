"""The console scripts the package installs (pyproject.toml [project.scripts]): each runs its
command's module exactly as `python -m experiments.<module>` does (same flags, same exit
status), from any directory. A shipped config is named as in the docs, `--config=configs/tiny.py`,
wherever the command runs (experiments/cli.py `shipped_config`)."""

import runpy


def _run(module: str) -> None:
  runpy.run_module(module, run_name='__main__', alter_sys=True)


def train() -> None:
  _run('experiments.train')


def finetune() -> None:
  _run('experiments.finetune')


def prepare() -> None:
  _run('experiments.prepare_data')


def export() -> None:
  _run('experiments.export_hf')


def translate() -> None:
  _run('experiments.translate')


def compile_for() -> None:
  _run('experiments.compile')


def device_check() -> None:
  _run('experiments.device_check')

"""The entry points a user calls, for the task given or else the default task (task.py:
masked-LM pretraining, realformer_jax/mlm). `realformer_jax.train` exports them; the modules
behind them (config.py, loop.py, accumulation.py) always take a task.

    spec = train.validate_config(config)              # the default task
    spec = train.validate_config(config, task=task)   # any other task
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax
import ml_collections

from realformer_jax.train import accumulation, loop
from realformer_jax.train import config as train_config
from realformer_jax.train.config import RunSpec
from realformer_jax.train.task import Task, default_task


def validate_config(
  config: ml_collections.ConfigDict,
  *,
  task: Optional[Task] = None,
  device_count: Optional[int] = None,
  process_count: Optional[int] = None,
) -> RunSpec:
  """train/config.py's validate_config, for `task` or the default task."""
  return train_config.validate_config(
    config, task=task or default_task(), device_count=device_count, process_count=process_count
  )


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  on_log: Optional[Callable[[int, int, dict], None]] = None,
  task: Optional[Task] = None,
) -> dict[str, Any]:
  """loop.train_and_evaluate, for `task` or the default task."""
  return loop.train_and_evaluate(config, workdir, on_log=on_log, task=task or default_task())


def compile_train_step(
  config: Union[ml_collections.ConfigDict, RunSpec], task: Optional[Task] = None
) -> jax.stages.Compiled:
  """The compiled train step of a config (validated here, for `task` or the default task) or
  spec, on this host's devices, with 'auto' accumulation resolved:
  `compile_train_step(config).memory_analysis()`."""
  spec = (
    config
    if isinstance(config, RunSpec)
    else validate_config(
      config, task=task, device_count=jax.device_count(), process_count=jax.process_count()
    )
  )
  return accumulation.compile_train_step(spec)

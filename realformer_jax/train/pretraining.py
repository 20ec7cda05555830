"""Masked-LM pretraining, the project's default job: the generic entry points (validation.py,
loop.py, accumulation.py take the task they are given and know no task) with MaskedLMTask
unless another task is given. `realformer_jax.train` exports these.

    spec = pretraining.validate_config(config)              # masked LM
    spec = pretraining.validate_config(config, task=task)   # any other task
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax
import ml_collections

from realformer_jax.train import accumulation, loop, validation
from realformer_jax.train.mlm_task import MaskedLMTask
from realformer_jax.train.spec import RunSpec
from realformer_jax.train.task import Task


def validate_config(
  config: ml_collections.ConfigDict,
  *,
  task: Optional[Task] = None,
  device_count: Optional[int] = None,
  process_count: Optional[int] = None,
) -> RunSpec:
  """validation.validate_config, for `task` or masked-LM pretraining."""
  return validation.validate_config(
    config, task=task or MaskedLMTask(), device_count=device_count, process_count=process_count
  )


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  on_log: Optional[Callable[[int, int, dict], None]] = None,
  task: Optional[Task] = None,
) -> dict[str, Any]:
  """loop.train_and_evaluate, for `task` or masked-LM pretraining."""
  return loop.train_and_evaluate(config, workdir, on_log=on_log, task=task or MaskedLMTask())


def compile_train_step(
  config: Union[ml_collections.ConfigDict, RunSpec], task: Optional[Task] = None
) -> jax.stages.Compiled:
  """The compiled train step of a config (validated here, for `task` or masked LM) or spec,
  on this host's devices, with 'auto' accumulation resolved:
  `compile_train_step(config).memory_analysis()`."""
  spec = (
    config
    if isinstance(config, RunSpec)
    else validate_config(
      config, task=task, device_count=jax.device_count(), process_count=jax.process_count()
    )
  )
  return accumulation.compile_train_step(spec)

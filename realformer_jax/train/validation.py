"""Moved to train/config.py (ConfigDict in, RunSpec out); this name keeps old imports
working."""

from realformer_jax.train.config import (  # noqa: F401
  check_batch_layout,
  check_devices,
  check_optimizer_dtypes,
  check_param_layout,
  validate_config,
)

"""Moved to train/config.py (the editable defaults); this name keeps old imports working."""

from realformer_jax.train.config import (  # noqa: F401
  DEFAULT_LOGICAL_AXIS_RULES,
  LOGICAL_AXES,
  PARAM_AXIS_FIELDS,
  default_config,
  default_distributed_config,
  default_mesh_config,
  default_model_config,
  default_train_config,
)

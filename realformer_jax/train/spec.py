"""Moved to train/config.py (the run's sections and RunSpec); this name keeps old imports
working."""

from realformer_jax.train.config import (  # noqa: F401
  AUTO,
  DistributedConfig,
  MeshConfig,
  Rules,
  RunSpec,
  TrainConfig,
  _require,
)

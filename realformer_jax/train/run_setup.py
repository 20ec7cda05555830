"""What a run derives from its spec before its data is built, in one place and once.

`derive(spec, workdir)` checks the spec against this run's devices (train/config.py
`check_devices`: the mesh, the batch and parameter layouts, a ring's carried rows against one
device's memory budget) and a resume against the steps in its workdir and their file corpus
(resume_checks.py), before any data is prepared, and returns what the rest of the run reads
instead of asking the spec again: config.json's sections, the memory budget (train/memory.py),
the mesh and this process's data shard (data_shards.py). train/loop.py builds the data from it
and hands the mesh and the budget to `build.resolve`, which decides the rest (the attention
plan and its kernel self-check, the remat masks, 'auto' accumulation) and compiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import Mesh

from realformer_jax.train import build, data_shards, memory, resume_checks
from realformer_jax.train import config as train_config
from realformer_jax.train.checkpointing import committed_steps
from realformer_jax.train.config import RunSpec
from realformer_jax.workdir_layout import checkpoints_dir


@dataclasses.dataclass(frozen=True)
class Derived:
  """What a run derives from its spec before its data, once."""

  # config.json and every step's record hold the spec as validated ('auto' stays 'auto'; a
  # resume resolves it again).
  config_json: dict[str, Any]
  budget: tuple[int, str]  # one device's memory budget, and where the figure came from
  mesh: Mesh
  data_shard: tuple[int, int]  # (this process's data-parallel group, the number of groups)


def derive(spec: RunSpec, workdir: str) -> Derived:
  """The spec and the workdir checked before the data is built; what the run derives from them."""
  budget = memory.memory_budget(spec.train)
  config_json = spec.to_dict()
  train_config.check_devices(spec, jax.device_count(), jax.process_count(), budget)
  # The workdir before the data: a resume that is refused costs no data preparation (hours on
  # a big corpus). Checked again by the loop, once the run holds the workdir.
  resume_checks.check_workdir(spec, workdir, committed_steps(checkpoints_dir(workdir)))
  resume_checks.check_corpus(spec, workdir)  # a changed file corpus: before its preparation
  mesh = build.make_mesh(spec.mesh)
  # Rows per data-parallel process group: processes of one group read the same rows.
  shard = data_shards.data_shard(mesh, spec.rules, jax.process_index())
  return Derived(config_json, budget, mesh, shard)

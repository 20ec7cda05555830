"""Device mesh, logical-axis rules and shardings: everything that decides where arrays live.

The model names only logical axes (`batch`, `embed`, `heads`, ...); `config.logical_axis_rules`
maps them onto the mesh axes of `config.mesh`, so data parallel, FSDP and tensor parallel are
config changes. Rules are applied in order and a mesh axis is used at most once per array.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from realformer_jax.train import validation

Rules = tuple[tuple[str, Any], ...]


def make_mesh(mesh_config: ml_collections.ConfigDict,
              devices: Optional[Sequence[Any]] = None) -> Mesh:
  """The global mesh over `devices` (default: all of this job's devices; a compile target's
  devices for a deviceless compile); Auto axis types, which Flax's logical partitioning
  expects."""
  count = len(devices) if devices is not None else jax.device_count()
  shape = validation.resolve_mesh_shape(mesh_config, count)
  axes = tuple(mesh_config.axes)
  return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes), devices=devices)


def logical_rules(config: ml_collections.ConfigDict) -> Rules:
  return tuple((logical, tuple(t) if isinstance(t, (list, tuple)) else t)
               for logical, t in config.logical_axis_rules)


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Rules) -> Iterator[None]:
  """Mesh and rules in scope, as tracing `nn.with_logical_constraint` needs."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def to_mesh_shardings(logical_specs: Any, mesh: Mesh, rules: Rules) -> Any:
  """A tree of logical PartitionSpecs -> a tree of NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """Leading (batch) dimension split over the mesh axes the `batch` rule names."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(('batch',), rules))


def data_parallel_size(mesh: Mesh, rules: Rules) -> int:
  axes = validation.batch_mesh_axes(rules)
  return int(np.prod([mesh.shape[a] for a in axes], dtype=int))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def global_batch(local_batch: Mapping[str, np.ndarray],
                 sharding: NamedSharding) -> dict[str, jax.Array]:
  """This process's rows -> global arrays (each process feeds only its own devices)."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}

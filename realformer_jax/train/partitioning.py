"""Device mesh, logical-axis rules and shardings: everything that decides where arrays live.

The model names only logical axes (`batch`, `embed`, `heads`, ...); the run's logical axis rules
(`spec.rules`, from `config.logical_axis_rules`) map them onto the mesh axes of `spec.mesh`, so
data parallel, FSDP and tensor parallel are config changes. Rules are applied in order and a
mesh axis is used at most once per array.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from realformer_jax.train.config import MeshConfig, Rules


def make_mesh(mesh_config: MeshConfig, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """The mesh over `devices` (default: every device of every process); Auto axis types, which
  Flax's logical partitioning expects. Other devices than the default are, e.g., the devices of
  an accelerator topology that a deviceless compile targets."""
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_config.resolve(len(devices))
  return jax.make_mesh(
    shape, mesh_config.axes, axis_types=(AxisType.Auto,) * len(shape), devices=devices
  )


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
  """How many groups of `mesh`'s devices the batch is split over under `rules`."""
  axes = batch_sharding(mesh, rules).spec[0]  # the mesh axes of the batch dimension
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return int(np.prod([mesh.shape[a] for a in axes], dtype=int))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def global_batch(
  local_batch: Mapping[str, np.ndarray], sharding: NamedSharding
) -> dict[str, jax.Array]:
  """This process's rows -> global arrays (each process feeds only its own devices)."""
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in local_batch.items()
  }

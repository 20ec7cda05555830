"""Which rows of each global batch a process reads: its data shard.

A batch's rows are split over the mesh axes that the `batch` rule names; every other axis
(tensor, sequence) holds copies. So the processes do not each read their own rows: they form
data-parallel process groups, one per distinct block of rows their devices hold, and the
processes of one group read identical data. On a sequence axis that spans hosts (a million-token
sequence on 2 hosts x 4 chips, mesh (1,1,1,8)) every process is in the one group and reads the
whole batch; with data 2 x sequence 4 over those hosts each host is its own group.

`data_shard` returns (index, count) = (this process's group, the number of groups), which is
what the data iterators take for (process_index, process_count): group g reads block g of
`global_batch_size // count` rows (data/pipeline.py), where
`jax.make_array_from_process_local_data` (build.global_batch) puts them, because a group's
devices hold exactly that block, in order.
"""

from __future__ import annotations

from jax.sharding import Mesh

from realformer_jax.config import ConfigError
from realformer_jax.train import build
from realformer_jax.train.config import Rules


def data_shard(mesh: Mesh, rules: Rules, process_index: int) -> tuple[int, int]:
  """(group, groups): the data-parallel process group of `process_index` on `mesh` and how many
  there are. ConfigError where a process's devices do not hold one aligned block of the batch
  shards (a mesh whose devices are not in process order on the batch axes)."""
  shards = build.data_parallel_size(mesh, rules)
  held = _shards_by_process(mesh, rules, shards)
  block = len(held[process_index])
  for process, indices in sorted(held.items()):
    first = indices[0]
    if len(indices) != block or indices != list(range(first, first + block)) or first % block:
      raise ConfigError(
        f'mesh.shape={tuple(mesh.shape.values())}: process {process} holds batch shards '
        f'{indices} of {shards}; each process must hold one aligned block of {block} '
        'consecutive ones, so that its rows are one slice of the global batch (order the '
        'devices by process on the batch axes)'
      )
  return held[process_index][0] // block, shards // block


def _shards_by_process(mesh: Mesh, rules: Rules, shards: int) -> dict[int, list[int]]:
  """The sorted batch-shard indices that each process's devices hold."""
  # A global batch of one row per shard: each device's slice start is its shard's index.
  indices = build.batch_sharding(mesh, rules).devices_indices_map((shards,))
  held: dict[int, set[int]] = {}
  for device, index in indices.items():
    held.setdefault(device.process_index, set()).add(index[0].start or 0)
  return {process: sorted(starts) for process, starts in held.items()}

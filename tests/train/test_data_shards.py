"""Which rows each process reads (train/data_shards.py), on the devices of a deviceless
2-host target (h100:16: 2 hosts of 8 GPUs, jax's own process indices): the processes of a
data-parallel group read the same block of rows, and a mesh whose batch shards are not whole
blocks per process is one line."""

import numpy as np
import pytest
from jax.sharding import AxisType, Mesh
from train_fixtures import tiny_config

from realformer_jax import train
from realformer_jax.aot import targets
from realformer_jax.config import ConfigError
from realformer_jax.train import build, data_shards


@pytest.fixture(scope='module')
def two_hosts():
  devices = targets.parse('h100:16').devices()
  assert [d.process_index for d in devices] == [0] * 8 + [1] * 8
  return devices


def _spec(shape):
  config = tiny_config(mesh__shape=shape, train__global_batch_size=16, model__num_heads=8)
  return train.validate_config(config, device_count=16, process_count=2)


def _shards(spec, mesh):
  return [data_shards.data_shard(mesh, spec.rules, p) for p in (0, 1)]


@pytest.mark.parametrize(
  'shape, expected',
  [
    ((1, 1, 1, 16), [(0, 1), (0, 1)]),  # one sequence over both hosts: both read every row
    ((1, 1, 8, 2), [(0, 1), (0, 1)]),  # tensor parallelism across the hosts, the same
    ((2, 1, 1, 8), [(0, 2), (1, 2)]),  # data 2 x sequence 8: a host per row block
    ((16, 1, 1, 1), [(0, 2), (1, 2)]),  # 8 batch shards per host, read as one block
    ((4, 1, 1, 4), [(0, 2), (1, 2)]),
  ],
)
def test_processes_read_their_group_block(two_hosts, shape, expected):
  spec = _spec(shape)
  assert _shards(spec, build.make_mesh(spec.mesh, two_hosts)) == expected


def test_a_mesh_that_interleaves_the_hosts_on_the_batch_is_one_line(two_hosts):
  # Pairs of devices from host 0, host 1, host 0, ...: host 0 holds batch shards 0, 2, 4, 6.
  # (jax.make_mesh would put them back in order: the mesh is built by hand.)
  interleaved = np.array(two_hosts).reshape(2, 4, 2).transpose(1, 0, 2).reshape(8, 1, 1, 2)
  spec = _spec((8, 1, 1, 2))
  with pytest.raises(
    ConfigError,
    match=r'^mesh\.shape=\(8, 1, 1, 2\): process \d holds batch shards \[\d, \d, \d, \d\] of 8; '
    r'each process must hold one aligned block of 4 consecutive ones',
  ) as error:
    _shards(spec, Mesh(interleaved, spec.mesh.axes, axis_types=(AxisType.Auto,) * 4))
  assert '\n' not in str(error.value)

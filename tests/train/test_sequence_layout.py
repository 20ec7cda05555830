"""The `sequence` mesh axis in the config: a shape written before it existed keeps its meaning,
the length dimension maps to it by the logical rules, and bad layouts are one line."""

from train_fixtures import tiny_config

from realformer_jax.train import validate_config


def test_a_shape_without_the_sequence_axis_means_size_1():
  spec = validate_config(tiny_config(mesh__shape=(1, -1, 1)), device_count=8, process_count=1)
  assert spec.mesh.axes == ('data', 'fsdp', 'tensor', 'sequence')
  assert spec.mesh.shape == (1, -1, 1, 1)
  assert spec.mesh.resolve(8) == (1, 8, 1, 1)
  assert dict(spec.rules)['length'] == 'sequence'
  # The spec written to config.json validates to itself.
  assert spec.to_dict()['mesh'] == {'axes': spec.mesh.axes, 'shape': (1, -1, 1, 1)}

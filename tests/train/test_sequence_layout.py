"""The `sequence` mesh axis in the config: a shape written before it existed keeps its meaning,
the length dimension maps to it by the logical rules, and a layout the ring cannot run is one
`error:` line naming the field, before anything is compiled."""

import compile_settings
import pytest
from train_fixtures import cli_flags, run_train_cli, tiny_config

from realformer_jax import kernels
from realformer_jax.config import ConfigError
from realformer_jax.kernels.score_paths import ring_attention
from realformer_jax.train import validate_config

pytestmark = pytest.mark.sequence_parallel


def test_a_shape_without_the_sequence_axis_means_size_1():
  spec = validate_config(tiny_config(mesh__shape=(1, -1, 1)), device_count=8, process_count=1)
  assert spec.mesh.axes == ('data', 'fsdp', 'tensor', 'sequence')
  assert spec.mesh.shape == (1, -1, 1, 1)
  assert spec.mesh.resolve(8) == (1, 8, 1, 1)
  assert dict(spec.rules)['length'] == 'sequence'
  # The spec written to config.json validates to itself.
  assert spec.to_dict()['mesh'] == {'axes': spec.mesh.axes, 'shape': (1, -1, 1, 1)}
  spec = validate_config(tiny_config(mesh__shape=(2, 1, 1, 4)), device_count=8, process_count=1)
  assert (spec.data_parallel_size(8), spec.sequence_parallel_size(8)) == (2, 4)


@pytest.mark.parametrize(
  'devices, overrides, message',
  [
    (
      3,
      dict(mesh__shape=(1, 1, 1, 3)),
      r'^data\.max_len=32: must be divisible by 3, the size of mesh sequence that '
      r"logical_axis_rules split 'length' over \(mesh\.shape=\(1, 1, 1, 3\) on 3 devices\)$",
    ),
    (
      2,
      dict(mesh__shape=(1, 1, 1, 2), model__attention_impl='pallas'),
      r"^model\.attention_impl='pallas': a sequence axis of 2 devices \(mesh\.shape=\(1, 1, 1, "
      r"2\)\) runs ring attention, whose per-block op is the einsum path; use 'auto' or 'xla'",
    ),
    (
      4,
      dict(
        mesh__shape=(2, 1, 1, 2),
        logical_axis_rules=(('batch', ('data', 'fsdp')), ('length', ('sequence', 'data'))),
      ),
      r"^logical_axis_rules: data splits both 'batch' and 'length'",
    ),
  ],
)
def test_a_layout_the_ring_cannot_run_is_one_line(devices, overrides, message):
  config = tiny_config()
  for key, value in overrides.items():
    if key == 'logical_axis_rules':
      config.logical_axis_rules = value
    else:
      section, field = key.split('__')
      config[section][field] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config, device_count=devices, process_count=1)


# BERT-Base's heads at 2**20 tokens on 8 devices (rope: no position table to size).
_MILLION = dict(
  model__num_heads=12,
  model__hidden_size=96,
  model__position_embedding='rope',
  data__max_len=2**20,
  mesh__shape=(1, 1, 1, 8),
)


@pytest.mark.parametrize(
  'overrides, message',
  [
    (
      # One device's row block: 4 B x 12 x 131,072 x 1,048,576 = 6.6 TB, against an H200.
      dict(_MILLION, model__residual_carry='scores', train__device_memory_bytes=141 * 10**9),
      r"^model\.residual_carry='scores': each device of the ring \(mesh\.shape=\(1, 1, 1, 8\)\) "
      r'holds its row block of the carried sum, \[12, 131072, 1048576\] float32 = 6\.6 TB '
      r'\(6597069766656 bytes\) per layer for one sequence, over its budget of 126900000000 '
      r"bytes \(train\.device_memory_bytes: .*\); use residual_carry='qk' or 'auto'$",
    ),
    (
      # 2**17 - 1 positions a device (a prime) over the 341 columns a sub-block may have.
      dict(_MILLION, data__max_len=8 * (2**17 - 1)),
      r'^data\.max_len=1048568: each of the 8 devices of the ring \(mesh\.shape=\(1, 1, 1, '
      r'8\)\) holds 131071 positions, which no sub-block width from 2 to 341 divides: ring '
      r'attention would attend 1-column sub-blocks',
    ),
    (
      dict(_MILLION, train__global_batch_size=344),
      r'^train\.global_batch_size=344 / train\.grad_accum_steps=1: a microbatch of 344 '
      r'sequences x 12 heads x 1048576 positions = 4328521728 attention rows, at or above '
      r"2\*\*32: the ring's dropout hash .* at most 341 sequences$",
    ),
  ],
)
def test_a_ring_too_big_for_its_device_or_hash_is_one_line(overrides, message):
  with pytest.raises(ConfigError, match=message):
    validate_config(tiny_config(**overrides), device_count=8, process_count=1)


def test_the_row_block_is_held_against_the_budget_the_caller_gives():
  """A deviceless compile (aot/train_step.py) passes its target's budget, not this host's."""
  config = tiny_config(**dict(_MILLION, model__residual_carry='scores'))
  asked = []
  budget = lambda train: asked.append(train) or (7 * 10**12, 'a 7 TB target')
  spec = validate_config(config, device_count=8, process_count=1, memory_budget=budget)
  assert asked == [spec.train]
  with pytest.raises(ConfigError, match=r'over its budget of 6000000000000 bytes \(a 6 TB'):
    validate_config(
      config, device_count=8, process_count=1, memory_budget=lambda t: (6 * 10**12, 'a 6 TB')
    )


def test_the_million_token_ring_passes_with_the_qk_carry_or_fewer_sequences():
  for overrides in (
    dict(_MILLION, model__residual_carry='qk'),
    dict(_MILLION, train__global_batch_size=344, train__grad_accum_steps=43),
  ):
    spec = validate_config(tiny_config(**overrides), device_count=8, process_count=1)
    assert spec.sequence_parallel_size(8) == 8


def test_the_qk_ring_takes_the_triton_block_kernel_where_its_tiles_are_whole_hash_words():
  fused = dict(model__residual_carry='qk', model__attention_impl='pallas_triton')
  spec = validate_config(
    tiny_config(mesh__shape=(1, 1, 1, 2), **fused), device_count=2, process_count=1
  )
  assert ring_attention.block_backend(spec.model) == 'triton'
  assert ring_attention.block_op(spec.model).startswith('the triton qk block kernel')
  assert ring_attention.block_backend(spec.replace(model=spec.model.replace(
    residual_carry='scores')).model) is None  # fmt: skip
  with pytest.raises(
    ConfigError,
    match=r'^data\.max_len=32: each of the 8 devices of the ring \(mesh\.shape=\(1, 1, 1, 8\)\) '
    r'holds 4 positions, not whole threefry hash words \(8 columns\) for the triton qk block '
    r'kernel; use a multiple of 64$',
  ):
    validate_config(tiny_config(mesh__shape=(1, 1, 1, 8), **fused), device_count=8, process_count=1)


def test_the_ring_refusal_runs_at_validation_and_never_at_trace_time(monkeypatch):
  calls = []
  real_check = ring_attention.check_config
  monkeypatch.setattr(
    ring_attention, 'check_config', lambda *a, **k: calls.append(a) or real_check(*a, **k)
  )
  config = tiny_config(mesh__shape=(1, 1, 1, 2))
  spec = validate_config(config, device_count=2, process_count=1)
  assert len(calls) == 1
  # A traced model on a split sequence takes the ring without asking again.
  split = ring_attention.SequenceShards(('sequence',), 2)
  monkeypatch.setattr(ring_attention, 'sequence_shards', lambda: split)
  for path in (
    kernels.stack_path(spec.model, 32, einsum=None),
    kernels.layer_path(spec.model, 32, einsum=None),
  ):
    assert type(path).__name__.endswith('RingPath') and path.shards == split
  assert len(calls) == 1


@pytest.mark.slow  # the training CLI on 2 forced devices in a subprocess (~5 s CPU)
def test_cli_refuses_an_indivisible_length_before_compiling(tmp_path):
  proc = run_train_cli(
    tmp_path,
    *cli_flags(mesh__shape='(1,1,1,2)', data__max_len=31),
    env={
      'XLA_FLAGS': compile_settings.xla_flags('--xla_force_host_platform_device_count=2'),
      'JAX_PLATFORMS': 'cpu',
    },
  )
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 1
  errors = [line for line in stderr.splitlines() if line.startswith('error:')]
  assert errors == [
    'error: data.max_len=31: must be divisible by 2, the size of mesh sequence that '
    "logical_axis_rules split 'length' over (mesh.shape=(1, 1, 1, 2) on 2 devices)"
  ], stderr
  assert 'Traceback' not in stderr
  assert not (tmp_path / 'checkpoints').exists()


@pytest.mark.slow  # the training CLI on 2 forced devices in a subprocess (~5 s CPU)
def test_cli_refuses_a_scores_carry_whose_row_block_outgrows_the_device(tmp_path):
  """2**20 tokens on 2 CPU devices: [2, 524288, 1048576] float32 = 4.4 TB each, over the host's
  memory, refused from the host's own budget before anything is compiled."""
  proc = run_train_cli(
    tmp_path,
    *cli_flags(
      mesh__shape='(1,1,1,2)',
      data__max_len=2**20,
      model__position_embedding='rope',
      model__residual_carry='scores',
    ),
    env={
      'XLA_FLAGS': compile_settings.xla_flags('--xla_force_host_platform_device_count=2'),
      'JAX_PLATFORMS': 'cpu',
    },
  )
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 1
  errors = [line for line in stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1, stderr
  assert errors[0].startswith(
    "error: model.residual_carry='scores': each device of the ring (mesh.shape=(1, 1, 1, 2)) "
    'holds its row block of the carried sum, [2, 524288, 1048576] float32 = 4.4 TB '
    '(4398046511104 bytes) per layer for one sequence, over its budget of '
  ), errors
  assert 'available host memory' in errors[0], errors
  assert 'Traceback' not in stderr
  assert not (tmp_path / 'checkpoints').exists()


def test_a_mesh_for_fewer_devices_names_the_shape_that_fits():
  """mesh.shape=(1,1,1,2) on 4 devices: the line names (-1,1,1,2), not just the count."""
  spec = validate_config(tiny_config(mesh__shape=(1, 1, 1, 2)))
  with pytest.raises(
    ConfigError, match=r'needs 2 devices, found 4; e\.g\. mesh\.shape=\(-1,1,1,2\)'
  ):
    spec.mesh.resolve(4)

"""Accelerator target descriptions (realformer_jax/aot/targets.py): parsing, the memory budget
'auto' accumulation gets for a target, and one-line errors. No compiler needed."""

import pytest

from realformer_jax.aot import targets, train_step
from realformer_jax.config import ConfigError
from realformer_jax.train.config import TrainConfig
from realformer_jax.units import GiB


@pytest.mark.parametrize(
  'spec, devices, topology',
  [
    ('h100:8', 8, '1x1x8'),
    ('h100', 1, '1x1x1'),
    ('a100-40g:16', 16, '1x2x8'),
    ('a100-80g:4', 4, '1x1x4'),
    ('v5e:2x4', 8, 'v5e:2x4'),
    ('v4:2x2x1', 4, 'v4:2x2x1'),
    ('v5p:4x4x4', 64, 'v5p:4x4x4'),
    ('v6e:1x1', 1, 'v6e:1x1'),
  ],
)
def test_targets_parse_into_a_device_count_and_a_topology(spec, devices, topology):
  target = targets.parse(spec)
  assert target.num_devices == devices and target.topology == topology


@pytest.mark.parametrize(
  'spec, message',
  [
    ('b200:8', r"--target=b200:8: unknown accelerator 'b200' \(known: h100, h200, a100-40g"),
    ('h100:12', r'--target=h100:12: more than 8 GPUs must be whole hosts of 8'),
    ('h100:x', r'--target=h100:x: a GPU target is NAME:COUNT, e.g. h100:8'),
    ('v5e:8', r'--target=v5e:8: a TPU target is v5e:TOPOLOGY in chips, e.g. v5e:2x2'),
    ('v4', r'--target=v4: a TPU target is v4:TOPOLOGY in chips, e.g. v4:2x2x1'),
  ],
)
def test_a_bad_target_is_one_line_naming_it(spec, message):
  with pytest.raises(ConfigError, match=message) as error:
    targets.parse(spec)
  assert '\n' not in str(error.value)


def test_the_memory_budget_is_what_xla_may_use_on_the_target_times_memory_fraction():
  h100 = targets.parse('h100:8')
  budget, source = train_step.memory_budget(TrainConfig(memory_fraction=0.9), h100)
  # JAX preallocates 75 % of a GPU; the driver reports 79.1 GiB on an H100 80GB.
  assert budget == int(int(84_929_347_584 * 0.75) * 0.9)
  assert source.startswith('NVIDIA H100 SXM 80GB: 59.32 GiB usable (75% of 79.10 GiB')
  # On a TPU: the HBM XLA:TPU reports as available (v5e: 15.75 of 16 GiB).
  budget, source = train_step.memory_budget(TrainConfig(), targets.parse('v5e:2x2'))
  assert budget == int(15.75 * GiB * 0.9)
  assert source == ('TPU v5e: 15.75 GiB of 16 GiB HBM available to XLA x memory_fraction 0.9')
  # An explicit train.device_memory_bytes wins.
  budget, source = train_step.memory_budget(
    TrainConfig(device_memory_bytes=10 * GiB, memory_fraction=0.5), h100
  )
  assert budget == 5 * GiB and source.startswith('train.device_memory_bytes')


def test_matmul_peaks_by_arithmetic():
  h100, v5e = targets.CHIPS['h100'], targets.CHIPS['v5e']
  assert targets.dtype_class('bf16', None, 'cuda') == 'bf16'
  assert targets.dtype_class('f32', None, 'cuda') == 'tf32'  # a GPU's float32 default
  assert targets.dtype_class('f32', '{highest,highest}', 'cuda') == 'f32'
  assert targets.dtype_class('f32', None, 'tpu') == 'bf16'  # one bf16 pass on the MXU
  assert h100.matmul_flops['bf16'] == 989.4e12 and v5e.matmul_flops['bf16'] == 197e12
  assert h100.roofline_matmul_flops['bf16'] == pytest.approx(805e12)
  assert h100.roofline_hbm_bytes_per_s == pytest.approx(3.015e12)

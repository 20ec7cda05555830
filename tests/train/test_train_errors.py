"""Bad input fails before anything is compiled, with one line naming the problem."""

import compile_settings
import pytest
from train_fixtures import cli_flags, run_train_cli, tiny_config

from realformer_jax import train
from realformer_jax.config import ConfigError
from realformer_jax.data import DataError
from realformer_jax.train import loop


@pytest.fixture
def nothing_compiles(monkeypatch):
  """Fails the test if the loop gets as far as building the model or compiling."""

  def forbidden(*args, **kwargs):
    raise AssertionError('reached model construction / compilation')

  monkeypatch.setattr(loop.build, 'make_setup', forbidden)
  monkeypatch.setattr(loop.build, 'compile_train_step', forbidden)


@pytest.mark.parametrize(
  'overrides, error, message',
  [
    (
      dict(model__ln_placement='sideways'),
      ConfigError,
      r"^model\.ln_placement='sideways': must be one of post, pre, realformer, none$",
    ),
    (
      dict(model__num_heads=3),
      ConfigError,
      r'^model\.num_heads=3: must divide model\.hidden_size=32$',
    ),
    (
      dict(data__max_len=64),
      ConfigError,
      r'^data\.max_len=64: sequence longer than the position table model\.max_len=32$',
    ),
    (
      dict(train__global_batch_size=6, train__grad_accum_steps=4),
      ConfigError,
      r'^train\.global_batch_size=6: must be divisible by the data-parallel size 1 '
      r'\(mesh data\*fsdp\) times train\.grad_accum_steps=4$',
    ),
    (dict(data__dataset='no_such_dataset_xyz'), DataError, r"^Unknown dataset 'no_such_data"),
    (dict(data__eval_split='train[:0]'), DataError, r"split 'train\[:0\]' has zero records"),
    (dict(train__warmup_steps=100), ConfigError, r'^train\.warmup_steps=100: must be in'),
    (
      dict(train__adam_eps=1e-50),
      ConfigError,
      r'^train\.adam_eps=1e-50: is 0\.0 in float32, the dtype training computes it in$',
    ),
    (
      dict(train__clip_grad_norm=1e-50),
      ConfigError,
      r'^train\.clip_grad_norm=1e-50: is 0\.0 in float32, the dtype training computes it in$',
    ),
    (
      dict(train__learning_rate=1e39),
      ConfigError,
      r'^train\.learning_rate=1e\+39: is inf in float32, the dtype training computes it in$',
    ),
    (
      dict(mesh__shape=(1, 1, 2)),
      ConfigError,
      r'^mesh\.shape=\(1, 1, 2, 1\): needs 2 devices, '
      r'found 1$',
    ),
  ],
)
def test_bad_config_fails_before_compilation(tmp_path, nothing_compiles, overrides, error, message):
  with pytest.raises(error, match=message) as raised:
    train.train_and_evaluate(tiny_config(**overrides), str(tmp_path))
  assert '\n' not in str(raised.value)
  assert not (tmp_path / 'checkpoints').exists()


def test_unprepared_tfds_dataset_with_downloads_off(tmp_path, nothing_compiles):
  config = tiny_config(data__dataset='tiny_shakespeare', data__data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(DataError, match=r"'tiny_shakespeare' is not prepared .*download=False"):
    train.train_and_evaluate(config, str(tmp_path))


@pytest.mark.parametrize(
  'section, field', [('train', 'lerning_rate'), ('mesh', 'axis'), ('distributed', 'workers')]
)
def test_unknown_fields_are_rejected(section, field):
  config = tiny_config()
  with config.unlocked():
    config[section][field] = 1
  with pytest.raises(
    ConfigError, match=rf'^{section}\.{field}: unknown config field( \(did.*\))?$'
  ):
    train.validate_config(config)


def test_rules_must_name_known_axes():
  config = tiny_config()
  config.logical_axis_rules = (('batch', 'data'), ('heads', 'model'))
  with pytest.raises(ConfigError, match=r"mesh axis 'model' \(for 'heads'\) is not in mesh"):
    train.validate_config(config)
  config.logical_axis_rules = (('batch', 'data'), ('embd', 'fsdp'))
  with pytest.raises(ConfigError, match=r"unknown logical axis 'embd'"):
    train.validate_config(config)


def _validate_on_8_devices(processes: int, batch: int, mesh: tuple, **overrides):
  """Validate tiny_config with that batch and mesh as `processes` processes of 8 devices."""
  config = tiny_config(train__global_batch_size=batch, mesh__shape=mesh, **overrides)
  return train.validate_config(config, device_count=8, process_count=processes)


def test_batch_must_split_over_data_parallel_devices():
  with pytest.raises(
    ConfigError,
    match=r'global_batch_size=12: must be divisible by the '
    r'data-parallel size 8 \(mesh data\*fsdp\)',
  ):
    _validate_on_8_devices(1, 12, (2, 4, 1))
  # Tensor parallelism does not split the batch: 12 rows over data*fsdp = 2 is fine.
  _validate_on_8_devices(1, 12, (2, 1, 4), model__num_heads=8)


def _cli(tmp_path, *flags, env=None) -> tuple[int, str]:
  """(exit status, stderr) of the training CLI."""
  proc = run_train_cli(tmp_path, *flags, env=env)
  _, stderr = proc.communicate(timeout=120)
  return proc.returncode, stderr


@pytest.mark.slow  # a training CLI on 8 forced devices in a subprocess (~3 s CPU)
def test_cli_reports_one_line_and_exit_status_1(tmp_path):
  """On 8 devices, a batch of 12 cannot split over data parallelism 8: one line, no trace."""
  status, stderr = _cli(
    tmp_path,
    *cli_flags(train__global_batch_size=12),
    env={
      'XLA_FLAGS': compile_settings.xla_flags('--xla_force_host_platform_device_count=8'),
      'JAX_PLATFORMS': 'cpu',
    },
  )  # 8 forced CPU devices on any machine
  assert status == 1
  errors = [line for line in stderr.splitlines() if line.startswith('error:')]
  assert errors == [
    'error: train.global_batch_size=12: must be divisible by the data-parallel '
    'size 8 (mesh data*fsdp) times train.grad_accum_steps=1'
  ]
  assert 'Traceback' not in stderr
  assert not (tmp_path / 'checkpoints').exists()


@pytest.mark.slow  # a training CLI in a subprocess (3-7 s CPU); test_cli_config.py: the same check
def test_cli_rejects_unknown_override(tmp_path):
  status, stderr = _cli(tmp_path, '--config.train.lerning_rate=0.1')
  assert status == 1
  assert stderr.strip().splitlines()[-1] == (
    "error: --config.train.lerning_rate: unknown config field ('lerning_rate') "
    "(did you mean 'learning_rate'?)"
  )
  assert 'Traceback' not in stderr


def test_processes_that_share_a_data_shard_read_the_same_rows():
  # 2 processes on a tensor or sequence axis alone: one data-parallel group, both processes
  # read the whole batch (train/data_shards.py), down to one sequence a step.
  _validate_on_8_devices(2, 8, (1, 1, 8), model__num_heads=8)
  _validate_on_8_devices(2, 1, (1, 1, 1, 8))
  _validate_on_8_devices(2, 2, (2, 1, 1, 4))  # a group per process, its sequence on 4 devices


def test_a_batch_the_process_groups_cannot_share_is_one_line():
  # data 2 x sequence 4 over 2 processes: 2 groups of rows, so one row cannot be fed.
  with pytest.raises(
    ConfigError,
    match=r'^train\.global_batch_size=1: must be divisible by the data-parallel size 2 ',
  ):
    _validate_on_8_devices(2, 1, (2, 1, 1, 4))
  # 12 devices of 3 processes, batch in 2 groups of 6: a group would be 1.5 processes.
  config = tiny_config(train__global_batch_size=6, mesh__shape=(2, 1, 1, 6))
  with pytest.raises(
    ConfigError,
    match=r'^mesh\.shape=\(2, 1, 1, 6\): the batch is split over 2 device group\(s\) '
    r'\(mesh data\*fsdp\), which must divide or be a multiple of the process count 3$',
  ):
    train.validate_config(config, device_count=12, process_count=3)

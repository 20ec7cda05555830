"""A sequence split over the devices of two processes (two hosts' worth): both processes read the
same rows (train/data_shards.py), so 2 processes x 4 forced CPU devices on a sequence axis of 8
train like one process with 8 devices on the same mesh. The real `python -m experiments.train`
(RealFormer with RoPE, hidden and attention dropout, configs/tiny.py at toy size) in
subprocesses, gloo collectives over localhost; float32 on the CPU, whose matmuls are full
float32 (no reduced-precision passes)."""

import pytest

from tests import scale_out_support as support

pytestmark = pytest.mark.sequence_parallel

# Two steps, no warmup (the first update of a warmup from 0 is at learning rate 0): the second
# step's loss is taken after a real update and the parameters after two, as three steps with
# TINY_SHARDED's warmup of 2 did.
STEPS = 2
TOLERANCE = 1e-5  # relative, on every step's loss and on the parameters after the last step


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """Embedded corpus + tokenizer prepared once for the runs of this module."""
  return support.prepare_tiny_data(str(tmp_path_factory.mktemp('tfds')))


def _command(workdir, data_dir, *extra: str) -> list[str]:
  return support.train_command(
    str(workdir),
    data_dir,
    '(1,1,1,8)',
    '--config.train.global_batch_size=1',
    f'--config.train.num_train_steps={STEPS}',
    '--config.train.warmup_steps=0',
    f'--config.train.checkpoint_every_steps={STEPS}',
    '--config.data.eval_batches=1',
    *extra,
  )


@pytest.mark.slow
def test_two_processes_on_one_sequence_axis_train_like_one(data_dir, tmp_path):
  """One sequence per step (global_batch_size=1: was refused as not divisible by the process
  count) split over both processes' devices."""
  single, multi = tmp_path / 'single', tmp_path / 'multi'
  processes = support.process_jobs(lambda *flags: _command(multi, data_dir, *flags), 2, 4)
  first, _ = support.run_all(processes, parallel=2)
  assert "'sequence': 8}, 2 process(es)" in first.stdout, first.stdout
  assert 'ring attention per-block op: the einsum formula' in first.stdout, first.stdout
  support.run_all([(_command(single, data_dir), support.train_env(8))])
  one, two = support.train_losses(str(single)), support.train_losses(str(multi))
  assert sorted(two) == sorted(one) == list(range(1, STEPS + 1))
  for step in one:
    assert abs(two[step] - one[step]) <= TOLERANCE * abs(one[step]), (step, two[step], one[step])
  params = support.restore_params(str(multi), data_dir, STEPS)
  reference = support.restore_params(str(single), data_dir, STEPS)
  assert support.relative_difference(params, reference) <= TOLERANCE

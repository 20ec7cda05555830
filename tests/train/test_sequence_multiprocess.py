"""A sequence split over the devices of two processes (two hosts' worth): both processes read the
same rows (train/data_shards.py), so 2 processes x 4 forced CPU devices on a sequence axis of 8
train like one process with 8 devices on the same mesh. The real `python -m experiments.train`
(RealFormer with RoPE, hidden and attention dropout, configs/tiny.py at toy size) in
subprocesses, gloo collectives over localhost; float32 on the CPU, whose matmuls are full
float32 (no reduced-precision passes)."""

import pytest

from tests import scale_out_support as support

pytestmark = pytest.mark.sequence_parallel

STEPS = 3
TOLERANCE = 1e-5  # relative, on every step's loss and on the parameters after the last step


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """Embedded corpus + tokenizer prepared once for the runs of this module."""
  return support.prepare_tiny_data(str(tmp_path_factory.mktemp('tfds')))


def _command(workdir, data_dir, batch: int, *extra: str) -> list[str]:
  return support.train_command(
    str(workdir),
    data_dir,
    '(1,1,1,8)',
    f'--config.train.global_batch_size={batch}',
    f'--config.train.num_train_steps={STEPS}',
    f'--config.train.checkpoint_every_steps={STEPS}',
    '--config.data.eval_batches=1',
    *extra,
  )


@pytest.mark.slow
@pytest.mark.parametrize('batch', [1, 2])
def test_two_processes_on_one_sequence_axis_train_like_one(data_dir, tmp_path, batch):
  single, multi = tmp_path / 'single', tmp_path / 'multi'
  processes = support.process_jobs(lambda *flags: _command(multi, data_dir, batch, *flags), 2, 4)
  first, _ = support.run_all(processes, parallel=2)
  assert "'sequence': 8}, 2 process(es)" in first.stdout, first.stdout
  assert 'ring attention per-block op: the einsum formula' in first.stdout, first.stdout
  support.run_all([(_command(single, data_dir, batch), support.train_env(8))])
  one, two = support.train_losses(str(single)), support.train_losses(str(multi))
  assert sorted(two) == sorted(one) == list(range(1, STEPS + 1))
  for step in one:
    assert abs(two[step] - one[step]) <= TOLERANCE * abs(one[step]), (step, two[step], one[step])
  params = support.restore_params(str(multi), data_dir, STEPS)
  reference = support.restore_params(str(single), data_dir, STEPS)
  assert support.relative_difference(params, reference) <= TOLERANCE

"""Checkpoints do not depend on the sequence axis: a run stopped at step 3 on a sequence axis of
2 devices resumes on one of 4 like the uninterrupted run. No parameter has a length dimension,
so the checkpoint's layout is the same; the real `python -m experiments.train` in
subprocesses with forced CPU devices (RealFormer with RoPE and dropout, configs/tiny.py)."""

import pytest

from tests import scale_out_support as support

pytestmark = pytest.mark.sequence_parallel

STEPS = 5


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """Embedded corpus + tokenizer prepared once for the runs of this module."""
  return support.prepare_tiny_data(str(tmp_path_factory.mktemp('tfds')))


@pytest.mark.slow
def test_a_run_resumes_on_another_sequence_axis_size(data_dir, tmp_path):
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  support.run_all(
    [
      (support.train_command(straight, data_dir, '(1,1,1,2)'), support.train_env(2)),
      (
        support.train_command(resumed, data_dir, '(1,1,1,2)', '--config.train.stop_at_step=3'),
        support.train_env(2),
      ),
    ]
  )
  second = support.run_all(
    [(support.train_command(resumed, data_dir, '(1,1,1,4)'), support.train_env(4))]
  )[0]
  assert 'resumed from the checkpoint at step 3' in second.stdout, second.stdout
  assert "'sequence': 4" in second.stdout, second.stdout
  assert 'ring attention per-block op: the einsum formula' in second.stdout, second.stdout
  one, two = support.train_losses(straight), support.train_losses(resumed)
  assert sorted(two) == list(range(1, STEPS + 1))
  for step in range(1, STEPS + 1):
    assert abs(two[step] - one[step]) <= 1e-5 * abs(one[step]), (step, two[step], one[step])
  params = support.restore_params(resumed, data_dir, STEPS)
  reference = support.restore_params(straight, data_dir, STEPS)
  assert support.relative_difference(params, reference) <= 1e-5

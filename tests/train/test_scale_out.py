"""Sharded training: same numbers on any mesh, checkpoints that move between meshes and
process counts, and the partition specs of the scanned model.

Every run is the real `python -m experiments.train` in a subprocess with forced CPU devices.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import repo_paths

from tests import scale_out_support as support

STEPS = 5
# name: (devices, mesh shape over (data, fsdp, tensor))
MESHES = {
  '1x1': (1, '(1,1,1)'),
  '8x1_data': (8, '(8,1,1)'),
  '2x4_data_tensor': (8, '(2,1,4)'),
  '1x8_fsdp': (8, '(1,8,1)'),
  '1x8_tensor': (8, '(1,1,8)'),
}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """Embedded corpus + tokenizer prepared once for every run of this module."""
  return support.prepare_tiny_data(str(tmp_path_factory.mktemp('tfds')))


@pytest.fixture(scope='module')
def mesh_runs(data_dir, tmp_path_factory):
  """5 steps from the same seed on every mesh, plus a run stopped at step 3 on 8x1 and resumed
  on 2x4 in the same workdir."""
  root = tmp_path_factory.mktemp('meshes')
  jobs, workdirs = [], {}
  for name, (devices, shape) in MESHES.items():
    workdirs[name] = str(root / name)
    jobs.append(
      (
        support.train_command(
          workdirs[name], data_dir, shape, '--config.train.checkpoint_every_steps=5'
        ),
        support.train_env(devices),
      )
    )
  workdirs['resumed'] = str(root / 'resumed')
  jobs.append(
    (
      support.train_command(
        workdirs['resumed'], data_dir, '(8,1,1)', '--config.train.stop_at_step=3'
      ),
      support.train_env(8),
    )
  )
  support.run_all(jobs)
  resumed = support.run_all(
    [(support.train_command(workdirs['resumed'], data_dir, '(2,1,4)'), support.train_env(8))]
  )[0]
  assert 'resumed from the checkpoint at step 3' in resumed.stdout, resumed.stdout
  return workdirs


@pytest.mark.slow
def test_every_mesh_gives_the_same_losses(mesh_runs):
  reference = support.train_losses(mesh_runs['1x1'])
  assert sorted(reference) == list(range(1, STEPS + 1))
  for name in MESHES:
    losses = support.train_losses(mesh_runs[name])
    assert sorted(losses) == sorted(reference), name
    for step, loss in reference.items():
      assert abs(losses[step] - loss) <= 1e-4 * abs(loss), (name, step, losses[step], loss)


@pytest.mark.slow
def test_every_mesh_gives_the_same_params(mesh_runs, data_dir):
  reference = support.restore_params(mesh_runs['1x1'], data_dir, STEPS)
  for name in MESHES:
    params = support.restore_params(mesh_runs[name], data_dir, STEPS)
    assert support.relative_difference(params, reference) <= 1e-4, name


@pytest.mark.slow
def test_checkpoint_from_8x1_resumes_on_2x4_like_an_uninterrupted_run(mesh_runs, data_dir):
  straight = support.train_losses(mesh_runs['8x1_data'])
  resumed = support.train_losses(mesh_runs['resumed'])
  for step in range(1, STEPS + 1):
    assert abs(resumed[step] - straight[step]) <= 1e-4 * abs(straight[step]), step
  params = support.restore_params(mesh_runs['resumed'], data_dir, STEPS)
  reference = support.restore_params(mesh_runs['8x1_data'], data_dir, STEPS)
  assert support.relative_difference(params, reference) <= 1e-4


@pytest.mark.slow
def test_two_processes_match_one_process_and_their_checkpoint_restores_in_one(data_dir, tmp_path):
  """2 processes x 2 CPU devices (gloo collectives over localhost) == 1 process x 4 devices;
  the 2-process checkpoint then resumes in a single 4-device process."""
  single, multi = str(tmp_path / 'single'), str(tmp_path / 'multi')
  stop = ('--config.train.stop_at_step=3',)
  jobs = support.process_jobs(
    lambda *flags: support.train_command(multi, data_dir, '(4,1,1)', *stop, *flags), 2, 2
  )
  first, second = support.run_all(jobs, parallel=2)
  assert "mesh {'data': 4, 'fsdp': 1, 'tensor': 1, 'sequence': 1}, 2 process(es)" in first.stdout
  assert 'final eval MLM accuracy' in first.stdout
  # Logs, metrics and progress come from process 0 only.
  assert 'final eval' not in second.stdout and 'step 2/' not in second.stdout
  support.run_all([(support.train_command(single, data_dir, '(4,1,1)'), support.train_env(4))])
  # Continue the 2-process run to the end in ONE process with 4 devices.
  resumed = support.run_all(
    [(support.train_command(multi, data_dir, '(4,1,1)'), support.train_env(4))]
  )[0]
  assert 'resumed from the checkpoint at step 3' in resumed.stdout, resumed.stdout
  one, two = support.train_losses(single), support.train_losses(multi)
  for step in range(1, STEPS + 1):
    assert abs(two[step] - one[step]) <= 1e-4 * abs(one[step]), (step, two[step], one[step])
  params = support.restore_params(multi, data_dir, STEPS)
  reference = support.restore_params(single, data_dir, STEPS)
  assert support.relative_difference(params, reference) <= 1e-4


GOLDEN = os.path.join(repo_paths.TESTS, 'golden', 'partition_specs.json')


@pytest.mark.slow
def test_partition_specs_match_golden_tree():
  """Params and optimizer-state specs of the scanned realformer on 8 devices, for the data,
  FSDP and tensor layouts. Regenerate (after an intended change) with
      python -m tests.partition_specs > tests/golden/partition_specs.json
  """
  result = subprocess.run(
    [sys.executable, '-m', 'tests.partition_specs'],
    cwd=support.REPO,
    env=support.device_env(8),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr
  with open(GOLDEN) as f:
    golden = json.load(f)
  assert json.loads(result.stdout) == golden

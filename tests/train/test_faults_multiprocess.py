"""Fault injection with two processes: every process must reach the same decision, or one
would wait forever in a collective the other never joins. Process 0 checks the damaged step,
renames it and tells the other; both resume from the previous step; only process 0 speaks.

Two processes x one CPU device each (gloo collectives over localhost), the real CLI.
"""

import os
import re

import fault_support as fs
import pytest

from tests import scale_out_support as support


def _two_processes(workdir, data_dir, *flags):
  port = support.free_port()
  return [
    (
      support.train_command(
        workdir,
        data_dir,
        '(2,1,1)',
        '--config.train.checkpoint_every_steps=1',
        '--config.distributed.num_processes=2',
        f'--config.distributed.process_id={i}',
        f'--config.distributed.coordinator_address=127.0.0.1:{port}',
        *flags,
      ),
      support.train_env(1),
    )
    for i in range(2)
  ]


@pytest.mark.slow
def test_two_processes_set_a_damaged_step_aside_together_and_resume(tmp_path):
  from realformer_jax import data  # pylint: disable=import-outside-toplevel
  from realformer_jax.configs import tiny  # pylint: disable=import-outside-toplevel

  data_dir, workdir = str(tmp_path / 'tfds'), str(tmp_path / 'w')
  config = tiny.get_config()
  config.data.data_dir, config.data.vocab_size, config.data.max_len = data_dir, 1000, 32
  data.prepare(config.data)
  # Steps 1 and 2 from one process (a checkpoint restores with any process count).
  one_process = support.train_command(
    workdir,
    data_dir,
    '(1,1,1)',
    '--config.train.checkpoint_every_steps=1',
    '--config.train.stop_at_step=2',
  )
  support.run_all([(one_process, support.train_env(1))])
  step_dir = os.path.join(workdir, 'checkpoints', '2')
  fs.flip_bytes(fs.largest_file(os.path.join(step_dir, 'state')), 5000)

  first, second = support.run_all(
    _two_processes(workdir, data_dir, '--config.train.stop_at_step=3')
  )

  warnings = re.findall(r'^warning: .*$', first.stdout, re.M)
  assert len(warnings) == 1, first.stdout
  assert re.fullmatch(
    rf'warning: checkpoint step 2 in {re.escape(workdir)}/checkpoints is damaged \(state/\S+ '
    r'does not match its saved checksum \(its bytes changed\)\): moved aside to 2\.damaged; '
    r'trying the next older step',
    warnings[0],
  )
  assert 'resumed from the checkpoint at step 1' in first.stdout
  assert 'warning' not in second.stdout and 'resumed' not in second.stdout  # process 0 speaks
  assert fs.checkpoint_entries(workdir) == ['1', '2', '2.damaged', '3']

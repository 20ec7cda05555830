"""Two training processes (localhost, one CPU device each) start on a fresh data_dir with a
file corpus: one reads, tokenizes and packs it, the other waits on the cache locks and then
finds the same stores; both train and evaluate, each reading its half of every global batch."""

import os
import re

import pytest
from data_fixtures import write_corpus

from tests import scale_out_support as support


@pytest.mark.slow
def test_two_processes_share_one_preparation_of_a_file_corpus(tmp_path):
  corpus = str(tmp_path / 'corpus')
  write_corpus(corpus)
  data_dir, workdir = str(tmp_path / 'fresh'), str(tmp_path / 'w')
  port = support.free_port()
  jobs = [
    (
      support.train_command(
        workdir,
        data_dir,
        '(2,1,1)',
        f'--config.data.train_files={corpus}/train-*.txt',
        f'--config.data.eval_files={corpus}/eval.txt',
        '--config.train.num_train_steps=2',
        '--config.distributed.num_processes=2',
        f'--config.distributed.process_id={i}',
        f'--config.distributed.coordinator_address=127.0.0.1:{port}',
      ),
      support.train_env(1),
    )
    for i in range(2)
  ]
  first, second = support.run_all(jobs)
  assert 'final eval MLM accuracy' in first.stdout, first.stdout
  # One corpus directory, one tokenizer, one packed store: built once, found by the other.
  (corpus_dir,) = [d for d in os.listdir(data_dir) if d.startswith('files-')]
  packed = os.listdir(os.path.join(data_dir, corpus_dir, 'packed'))
  assert len([f for f in packed if re.fullmatch(r'packed-L32-\w+\.int32', f)]) == 1
  assert support.train_losses(workdir), 'no train loss logged'

"""Preparation is quiet by default: no TFDS notes or progress bars on a fresh data_dir (the
embedded corpus "downloads" nothing), only the preparation's own plain lines; its files are
written with the user's umask."""

import logging
import os
import stat

import pytest
from data_fixtures import files_config, write_corpus

from realformer_jax import data
from realformer_jax.data import preparation


@pytest.mark.slow
def test_a_fresh_data_dir_prepares_the_embedded_corpus_without_tfds_noise(tmp_path, capfd, caplog):
  config = data.default_data_config()
  config.data_dir = str(tmp_path / 'fresh')
  with caplog.at_level(logging.INFO):
    data.prepare(config)
  out, err = capfd.readouterr()
  printed = out + err + caplog.text
  for noise in ('Variant folder', 'Downloading and preparing', 'Generating splits', 'examples/s'):
    assert noise not in printed, noise
  assert '\r' not in out + err and '\x1b' not in out + err  # no bars, no escape codes


def test_prepared_files_follow_the_umask(tmp_path):
  write_corpus(tmp_path)
  config = files_config(
    tmp_path, train_files=str(tmp_path / 'train-*.txt'), eval_files=str(tmp_path / 'eval.txt')
  )
  previous = os.umask(0o027)
  try:
    preparation.packed_train_store(config)
  finally:
    os.umask(previous)
  modes = {}
  for root, _, names in os.walk(config.data_dir):
    for name in names:
      if not name.endswith('.lock'):
        modes[os.path.join(root, name)] = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
  assert len(modes) > 8
  assert all(mode == 0o640 for mode in modes.values()), {
    os.path.relpath(p, config.data_dir): oct(m) for p, m in modes.items() if m != 0o640
  }

"""train.load_workdir: a trained workdir's config, parameters and tokenizer come back as saved."""

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_fixtures import tiny_config

from realformer_jax import MaskedLM, train
from realformer_jax.config import ConfigError

pytestmark = pytest.mark.slow  # every test uses the trained workdir (~12 s to build)


@pytest.fixture(scope='module')
def trained_workdir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('pretrained'))
  train.train_and_evaluate(
    tiny_config(
      train__num_train_steps=4, train__checkpoint_every_steps=2, model__ln_placement='post'
    ),
    workdir,
  )
  return workdir


def test_load_workdir_restores_the_latest_checkpoint(trained_workdir):
  run = train.load_workdir(trained_workdir)
  assert run.step == 4
  assert run.model_config.ln_placement == 'post' and run.model_config.hidden_size == 32
  assert run.config.train.num_train_steps == 4
  saved = ocp.StandardCheckpointer().restore(
    os.path.join(trained_workdir, 'checkpoints', '4', 'state')
  )['params']
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(run.params), saved)
  earlier = train.load_workdir(trained_workdir, step=2)
  assert earlier.step == 2
  assert not np.array_equal(
    jax.device_get(earlier.params['encoder']['layers']['mlp']['wi']['kernel']),
    saved['encoder']['layers']['mlp']['wi']['kernel'],
  )

  # The run copied its tokenizer into the workdir: no data preparation needed to use it.
  assert run.tokenizer.source == os.path.join(trained_workdir, 'tokenizer.model')
  ids = np.asarray([run.tokenizer.encode('In the beginning God created the heavens')])
  logits = MaskedLM(run.model_config).apply({'params': run.params}, ids, np.ones_like(ids))
  assert logits.shape == ids.shape + (run.model_config.vocab_size,)


def test_load_workdir_errors_name_the_problem(trained_workdir, tmp_path):
  with pytest.raises(ConfigError, match=r'no checkpoint at that step .* \(have \[2, 4\]\)'):
    train.load_workdir(trained_workdir, step=3)
  with pytest.raises(ConfigError, match='config.json: no such file'):
    train.load_workdir(str(tmp_path))
  saved = json.load(open(os.path.join(trained_workdir, 'config.json')))
  saved['train']['warp_factor'] = 9
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  with pytest.raises(ConfigError, match='unknown config field train.warp_factor'):
    train.load_workdir(str(tmp_path))

"""Checkpoints written before the code moved still load: parameter names are a contract.

tests/golden/pretraining_workdir_v1 is a tiny pretraining workdir (config.json and the orbax
checkpoint at step 2) written by the code as it stood before the restructuring of issue 23
(commit 4de0a73: translation spread over three packages, configs passed as ConfigDicts);
tests/golden/seq2seq_params_v1.json lists that code's Seq2Seq parameter paths and shapes.
Also here: the rule for which norms a layer has (placement.py), which encoder and decoder
share, and the embeddings' norm, which every placement keeps.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import pytest
import repo_paths
from model_fixtures import seq2seq_config
from train_fixtures import tiny_config

from realformer_jax import ModelConfig, Seq2Seq, train
from realformer_jax.model.params import unbox
from realformer_jax.model.placement import placement
from realformer_jax.seq2seq import Seq2SeqModelConfig

GOLDEN = os.path.join(repo_paths.TESTS, 'golden')


@pytest.mark.slow
def test_a_workdir_written_before_the_restructuring_resumes_and_loads(tmp_path, capsys):
  workdir = str(tmp_path / 'workdir')
  shutil.copytree(os.path.join(GOLDEN, 'pretraining_workdir_v1'), workdir)
  with open(os.path.join(workdir, 'config.json')) as f:
    saved = json.load(f)
  # The run's own settings, on this session's prepared corpus (data_dir is machine-specific).
  config = tiny_config()
  for section in ('model', 'train'):
    config[section].update(saved[section])
  config.data.update({k: v for k, v in saved['data'].items() if k != 'data_dir'})
  config.train.stop_at_step = 3
  result = train.train_and_evaluate(config, workdir)
  assert 'resumed from the checkpoint at step 2' in capsys.readouterr().out
  assert result['step'] == 3
  run = train.load_workdir(workdir, step=2)  # the old checkpoint, through today's loader
  assert run.spec.model.ln_placement == 'realformer' and run.step == 2
  layers = run.params['encoder']['layers']
  assert layers['attention']['qkv']['kernel'].shape == (2, 32, 3, 2, 16)


def _seq2seq_paths(**overrides) -> list[str]:
  # The golden file's sizes (parameter shapes are part of it); dropout changes no parameter.
  cfg = seq2seq_config(hidden_size=16, num_heads=2, mlp_dim=32, **overrides)
  ids = jnp.ones((1, 8), jnp.int32)
  params = jax.eval_shape(
    lambda: unbox(Seq2Seq(cfg).init(jax.random.key(0), ids, ids, ids)['params'])
  )
  return sorted(
    '/'.join(str(getattr(k, 'key', k)) for k in path) + ':' + 'x'.join(map(str, leaf.shape))
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
  )


@pytest.mark.parametrize('kind', ['standard', 'aan', 'merged'])
@pytest.mark.parametrize('ln', ['post', 'pre', 'none'])
def test_seq2seq_parameter_names_are_those_of_the_old_layout(kind, ln):
  with open(os.path.join(GOLDEN, 'seq2seq_params_v1.json')) as f:
    golden = json.load(f)[f'{kind}-{ln}']
  paths = _seq2seq_paths(decoder_attention=kind, ln_placement=ln)
  # The one deliberate change: under ln_placement='none' the decoder's embeddings now have
  # their norm, as the encoder's always had (placement.py).
  added = (
    {'decoder/embedding_norm/bias:16', 'decoder/embedding_norm/scale:16'} if ln == 'none' else set()
  )
  assert set(paths) == set(golden) | added


@pytest.mark.parametrize('ln', ['post', 'pre', 'realformer', 'none'])
@pytest.mark.parametrize('branch', ['plain', 'rezero', 'skipinit'])
def test_the_embeddings_norm_exists_for_every_placement_in_encoder_and_decoder(ln, branch):
  paths = _seq2seq_paths(ln_placement=ln, residual_branch=branch)
  assert 'encoder/embeddings/norm/scale:16' in paths
  assert 'decoder/embedding_norm/scale:16' in paths
  final = placement(ModelConfig(ln_placement=ln)).final_norm
  assert ('encoder/final_norm/scale:16' in paths) == final == (ln == 'pre')
  assert ('decoder/final_norm/scale:16' in paths) == final


# (placement, branch) -> (post, layer norms, trained gate): the module docstring's table.
_RULE = {
  ('post', 'plain'): (True, True, False),
  ('pre', 'plain'): (False, True, False),
  ('none', 'plain'): (False, False, False),
  ('realformer', 'plain'): (True, True, False),
  ('post', 'rezero'): (True, False, True),
  ('pre', 'rezero'): (False, False, True),
  ('post', 'skipinit'): (True, True, True),
  ('pre', 'skipinit'): (False, False, True),
  ('none', 'skipinit'): (False, False, True),
  ('post', 'fixed_schedule'): (True, True, False),
  ('pre', 'fixed_schedule'): (False, True, False),
}


@pytest.mark.parametrize('key', sorted(_RULE))
def test_placement_rule(key):
  ln, branch = key
  layout = placement(ModelConfig(ln_placement=ln, residual_branch=branch))
  assert (layout.post, layout.layer_norms, layout.trained_gate) == _RULE[key]
  # The decoder's layers follow the same rule: a layer norm exists iff the rule says so.
  paths = (
    _seq2seq_paths(ln_placement=ln, residual_branch=branch) if branch != 'fixed_schedule' else None
  )
  if paths is not None:
    assert any('layers_0/mlp_norm' in p for p in paths) == layout.layer_norms
    assert any('layers_0/mlp_gate' in p for p in paths) == layout.trained_gate

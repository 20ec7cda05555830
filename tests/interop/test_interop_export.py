"""experiments.export_hf: an exported directory loads in transformers (Flax and PyTorch) and its
float32 masked-LM logits equal ours on a padded batch; the tokenizer keeps our ids.

Matmuls at float32 'highest' here (conftest); torch on CPU computes float32 matmuls in float32.
Tolerance: 2e-5 absolute on logits of order 1 (measured differences ~1e-6: summation order).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import repo_paths
import subprocesses
import train_fixtures
from model_fixtures import init_params, padded_batch, tiny_config

from realformer_jax import MaskedLM, train
from realformer_jax.config import ConfigError
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.data.tokenizers import wordpiece
from realformer_jax.interop import hf_export

ATOL = 2e-5
REPO = repo_paths.REPO
VOCAB = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + [f'w{i}' for i in range(45)]


def _wordpiece() -> wordpiece.WordPieceTokenizer:
  return wordpiece.WordPieceTokenizer('\n'.join(VOCAB).encode() + b'\n', lower_case=True)


def _ours(cfg, params, ids, mask, segments):
  return np.asarray(MaskedLM(cfg).apply({'params': params}, ids, mask, segments))


def _real(logits, mask):
  return logits[np.asarray(mask) > 0]  # padding positions are not compared


def _export(tmp_path, **overrides):
  cfg = tiny_config(**overrides)
  ids, mask, segments = padded_batch()
  params = init_params(cfg, ids, mask, segments)
  # Non-trivial norms and biases, so a wrong mapping of any of them shows.
  params = jax.tree.map(
    lambda p: p + 0.1 * np.random.default_rng(p.size).standard_normal(p.shape, np.float32), params
  )
  out = str(tmp_path / 'export')
  architecture = hf_export.export(cfg, params, _wordpiece(), out)
  return cfg, params, (ids, mask, segments), out, architecture


@pytest.mark.slow  # ~30 s: Flax BERT's first compile
def test_post_ln_is_a_standard_flax_bert(tmp_path):
  from transformers import FlaxAutoModelForMaskedLM  # pylint: disable=import-outside-toplevel

  cfg, params, (ids, mask, segments), out, architecture = _export(tmp_path)
  assert architecture == 'BertForMaskedLM'
  assert json.load(open(os.path.join(out, 'config.json')))['model_type'] == 'bert'
  model = FlaxAutoModelForMaskedLM.from_pretrained(out)
  theirs = model(np.asarray(ids), np.asarray(mask), np.asarray(segments)).logits
  ours = _ours(cfg, params, ids, mask, segments)
  np.testing.assert_allclose(_real(theirs, mask), _real(ours, mask), atol=ATOL)


@pytest.mark.slow  # torch import + export: 12 s CPU at load ~25 (2026-11-26)
def test_post_ln_is_a_standard_torch_bert(tmp_path):
  torch = pytest.importorskip('torch')
  from transformers import AutoModelForMaskedLM  # pylint: disable=import-outside-toplevel

  cfg, params, batch, out, _ = _export(tmp_path, activation='gelu_tanh')
  model = AutoModelForMaskedLM.from_pretrained(out).eval()
  assert type(model).__name__ == 'BertForMaskedLM'
  ids, mask, segments = (torch.as_tensor(np.array(x), dtype=torch.long) for x in batch)
  with torch.no_grad():
    theirs = model(input_ids=ids, attention_mask=mask, token_type_ids=segments).logits.numpy()
  ours = _ours(cfg, params, *batch)
  np.testing.assert_allclose(_real(theirs, batch[1]), _real(ours, batch[1]), atol=ATOL)


@pytest.mark.slow  # 5.6-7.5 s CPU each at load ~25 (2026-11-26)
@pytest.mark.parametrize(
  'overrides',
  [
    dict(ln_placement='realformer'),
    dict(ln_placement='realformer', running_mean=True, position_embedding='rope'),
    dict(ln_placement='pre', attention_scale='t5', activation='relu'),
    dict(ln_placement='pre', residual_attention=True, position_embedding='none'),
  ],
  ids=['realformer', 'realformer-running-mean-rope', 'pre-t5-relu', 'pre-residual-nopos'],
)
def test_the_shipped_torch_module_equals_ours(tmp_path, overrides):
  torch = pytest.importorskip('torch')
  from transformers import AutoModelForMaskedLM  # pylint: disable=import-outside-toplevel

  cfg, params, batch, out, architecture = _export(tmp_path, **overrides)
  assert architecture == 'RealFormerForMaskedLM'
  assert os.path.isfile(os.path.join(out, 'modeling_realformer.py'))
  model = AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
  ids, mask, segments = (torch.as_tensor(np.array(x), dtype=torch.long) for x in batch)
  with torch.no_grad():
    theirs = model(input_ids=ids, attention_mask=mask, token_type_ids=segments).logits.numpy()
  ours = _ours(cfg, params, *batch)
  np.testing.assert_allclose(_real(theirs, batch[1]), _real(ours, batch[1]), atol=ATOL)


@pytest.mark.slow  # imports transformers: ~7 s CPU (it pulls torch)
def test_wordpiece_tokenizer_keeps_our_ids(tmp_path):
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

  ours = _wordpiece()
  hf_export.write_tokenizer(ours, str(tmp_path))
  theirs = AutoTokenizer.from_pretrained(str(tmp_path))
  text = 'W3 w17 w4, w44 unknown'
  assert theirs(text)['input_ids'] == [ours.cls_id, *ours.encode(text).tolist(), ours.sep_id]
  assert (theirs.pad_token_id, theirs.mask_token_id) == (ours.pad_id, ours.mask_id)


@pytest.mark.slow  # imports transformers: ~7 s CPU (it pulls torch)
def test_sentencepiece_tokenizer_keeps_our_ids(tmp_path):
  from finetune_fixtures import tokenizer_file  # pylint: disable=import-outside-toplevel
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

  ours = tokenizer_lib.load(tokenizer_file())
  hf_export.write_tokenizer(ours, str(tmp_path))
  theirs = AutoTokenizer.from_pretrained(str(tmp_path))
  text = 'In the beginning, God  created the heavens and the earth. 12,3 Ünïcode naïve'
  assert theirs(text)['input_ids'] == [ours.cls_id, *ours.encode(text).tolist(), ours.sep_id]
  specials = (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id)
  assert (
    theirs.pad_token_id,
    theirs.unk_token_id,
    theirs.cls_token_id,
    theirs.sep_token_id,
    theirs.mask_token_id,
  ) == specials


@pytest.mark.parametrize(
  'overrides, field',
  [
    (dict(attention_scale='entropy_invariant'), 'attention_scale'),
    (dict(norm='rmsnorm'), 'norm'),
    (dict(residual_branch='rezero'), 'residual_branch'),
    (dict(ln_placement='none'), 'ln_placement'),
    (dict(use_bias=False), 'use_bias'),
    (dict(parameterization='ntk'), 'parameterization'),
  ],
)
def test_refuses_what_it_cannot_export_exactly(tmp_path, overrides, field):
  with pytest.raises(ConfigError, match=f'^model.{field}=.*cannot export it exactly'):
    hf_export.check_exportable(tiny_config(**overrides))


def test_every_model_field_is_either_exported_or_irrelevant():
  hf_export.check_exportable(tiny_config())  # raises on a ModelConfig field it does not know


def _run_export(*args):
  return subprocesses.module(
    'experiments.export_hf', *args, env=dict(os.environ, JAX_PLATFORMS='cpu')
  )


@pytest.mark.slow  # trains 2 steps, then the CLI in a subprocess
def test_a_trained_workdir_exports_and_loads_in_torch(tmp_path):
  torch = pytest.importorskip('torch')
  from transformers import AutoModelForMaskedLM, AutoTokenizer  # pylint: disable=import-outside-toplevel

  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'hf')
  config = train_fixtures.tiny_config(
    train__num_train_steps=2, train__checkpoint_every_steps=2, train__eval_every_steps=2
  )
  train.train_and_evaluate(config, workdir)
  result = _run_export(f'--workdir={workdir}', f'--out={out}')
  assert result.returncode == 0, result.stderr
  assert 'RealFormerForMaskedLM' in result.stdout and 'at step 2' in result.stdout

  run = train.load_workdir(workdir)
  text = 'In the beginning God created the heavens and the earth.'
  tokens = AutoTokenizer.from_pretrained(out)([text, 'And God said'], padding=True)
  ids = np.asarray(tokens['input_ids'])
  assert ids[0].tolist() == [
    run.tokenizer.cls_id,
    *run.tokenizer.encode(text),
    run.tokenizer.sep_id,
  ]
  mask = np.asarray(tokens['attention_mask'])
  model = AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).logits
  ours = _ours(run.model_config, run.params, ids, mask, np.zeros_like(ids))
  np.testing.assert_allclose(_real(theirs.numpy(), mask), _real(ours, mask), atol=ATOL)


@pytest.mark.slow
def test_the_cli_refuses_before_restoring(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text(json.dumps({'model': {'norm': 'rmsnorm'}}))
  result = _run_export(f'--workdir={workdir}', f'--out={tmp_path / "hf"}')
  assert result.returncode == 1
  assert result.stderr.strip().splitlines() == [
    "error: model.norm='rmsnorm': experiments.export_hf cannot export it exactly "
    "(exported: 'layernorm'; docs/interop.md)"
  ]
  assert not (tmp_path / 'hf').exists()

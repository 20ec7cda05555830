"""Hugging Face import -> fine-tune: a .safetensors file written from a randomly initialised
transformers BERT starts a fine-tuning run whose encoder and pooler reproduce Hugging Face's
(float32 matmuls: conftest.py)."""

import importlib.util

import jax
import numpy as np
import pytest
from finetune_fixtures import toy_config
from hf_fixtures import toy_bert_config

from realformer_jax import SequenceClassifier, finetune, train
from realformer_jax.train import build, checkpointing

# Looked up, not imported: importing transformers costs ~6 s CPU (it pulls torch) in every
# collection of the suite, this module's tests being slow or not. The tests import it.
if importlib.util.find_spec('transformers') is None:
  pytest.skip('transformers is not installed', allow_module_level=True)
# slow: the module's transformers BERT fixture alone took 17 s CPU (2026-11-26), and the
# second test fine-tunes end to end.
pytestmark = pytest.mark.slow

_WORDS = (
  'in the beginning god created heavens and earth was waste void darkness upon face '
  'of deep spirit moved waters said let there be light'
).split()


@pytest.fixture(scope='module')
def hf_checkpoint(tmp_path_factory):
  """model.safetensors + config.json (save_pretrained) + a WordPiece vocab.txt."""
  import transformers  # pylint: disable=import-outside-toplevel

  directory = tmp_path_factory.mktemp('hf_bert')
  vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + _WORDS + ['##s', '##ed', '.', ',']
  (directory / 'vocab.txt').write_text('\n'.join(vocab) + '\n')
  hf_config = toy_bert_config(
    vocab_size=len(vocab) + 3,
    num_hidden_layers=2,
    max_position_embeddings=64,
    num_labels=3,
    hidden_dropout_prob=0.1,  # BertConfig's defaults: the file is saved as trained models are
    attention_probs_dropout_prob=0.1,
  )
  model = transformers.FlaxBertForSequenceClassification(hf_config, seed=4)
  model.save_pretrained(str(directory), safe_serialization=True)
  return directory, hf_config, model


def _from_the_file(directory, task: str):
  """The toy fine-tuning config of `task` whose model and vocabulary are the checkpoint's."""
  return toy_config(
    task, model=False, data__vocab_file='', finetune__init=str(directory / 'model.safetensors')
  )


def test_imported_encoder_and_pooler_match_hugging_face(hf_checkpoint):
  import transformers  # pylint: disable=import-outside-toplevel

  directory, hf_config, model = hf_checkpoint
  config = _from_the_file(directory, 'bible_sections')
  spec = train.validate_config(config, task=finetune.make_task(config))
  source = spec.task.starting_point
  model_config = spec.model
  assert (model_config.hidden_size, model_config.vocab_size) == (48, hf_config.vocab_size)
  tokenizer = source.tokenizer(spec.data)
  assert tokenizer.source.endswith('vocab.txt') and tokenizer.cls_id == 2
  params = source.load_encoder(model_config)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, hf_config.vocab_size, (2, 12)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  segments = (np.arange(12) >= 6).astype(np.int32)[None].repeat(2, 0) * mask
  expected = transformers.FlaxBertModel(hf_config, seed=4)(
    ids, attention_mask=mask, token_type_ids=segments, params=model.params['bert']
  )
  ours = SequenceClassifier(model_config, 3)
  variables = {
    'params': dict(
      params,
      classifier={
        'classifier': {'kernel': np.zeros((48, 3), np.float32), 'bias': np.zeros(3, np.float32)}
      },
    )
  }
  _, state = ours.apply(
    variables, ids, mask, segments, capture_intermediates=True, mutable=['intermediates']
  )
  hidden = state['intermediates']['encoder']['__call__'][0]
  pooled = state['intermediates']['pooler']['__call__'][0]
  real = mask.astype(bool)
  np.testing.assert_allclose(
    np.asarray(hidden)[real], np.asarray(expected.last_hidden_state)[real], atol=1e-4, rtol=1e-4
  )
  np.testing.assert_allclose(pooled, expected.pooler_output, atol=1e-4, rtol=1e-4)


def test_fine_tuning_starts_from_a_safetensors_file(hf_checkpoint, tmp_path):
  directory, _, model = hf_checkpoint
  config = _from_the_file(directory, 'bible_pairs')
  config.model.ln_placement = 'realformer'  # BERT's weights also start a RealFormer
  task = finetune.make_task(config)
  assert train.validate_config(config, task=task).model.use_residual_attention
  result = finetune.run(config, str(tmp_path))
  assert result['step'] == 2 and np.isfinite(result['test/accuracy'])
  # The run began from the file: its best checkpoint's word embeddings are Hugging Face's
  # moved by at most two AdamW steps (each at most ~lr = 1e-3 per weight).
  hf_words = np.asarray(model.params['bert']['embeddings']['word_embeddings']['embedding'])
  setup = build.make_setup(train.validate_config(config, task=task))
  params, _, _ = checkpointing.restore_best_params(str(tmp_path), setup.layout.abstract.params)
  words = np.asarray(jax.device_get(params['encoder']['embeddings']['word']['embedding']))
  assert 0 < np.abs(words - hf_words).max() <= 2 * 1e-3 + 1e-6

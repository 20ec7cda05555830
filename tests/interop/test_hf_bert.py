"""`post` with weights imported from Hugging Face BERT reproduces its MLM logits (float32
matmuls on both sides: the suite pins jax_default_matmul_precision='highest', conftest.py)."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# Looked up, not imported: importing transformers costs ~6 s CPU (it pulls torch) in every
# collection of the suite, this module's tests being slow or not. The tests import it.
if importlib.util.find_spec('transformers') is None:
  pytest.skip('transformers is not installed', allow_module_level=True)
# slow: building and compiling the Flax BERTs took 20 s CPU for the module (2026-11-26).
pytestmark = pytest.mark.slow

from hf_fixtures import toy_bert_config  # noqa: E402 (after the importorskip)

from realformer_jax import MaskedLM  # noqa: E402
from realformer_jax.interop import hf_convert  # noqa: E402
from realformer_jax.model import params as params_lib  # noqa: E402


def _hf_model():
  import transformers  # pylint: disable=import-outside-toplevel

  config = toy_bert_config(type_vocab_size=2)
  model = transformers.FlaxBertForMaskedLM(config, seed=3)
  return config, model, _perturbed(model.params, seed=0)


def _perturbed(params, seed):
  """Random biases and LayerNorm offsets (HF initialises them to 0/1) so all weights matter."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda x: np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params
  )


def _batch():
  rng = np.random.default_rng(1)
  ids = rng.integers(1, 97, size=(3, 16)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 11:] = 0
  mask[2, 5:] = 0
  ids = ids * mask
  segments = np.zeros_like(ids)
  segments[:, 8:] = 1
  positions = np.array([[0, 5, 15], [2, 3, 10], [1, 4, 4]], np.int32)
  return ids, mask, segments * mask, positions


def _torch_style_state_dict(flax_params):
  """The PyTorch BertForMaskedLM naming: Linear '.weight' stored [out, in], LayerNorm weight."""
  flat = {}

  def visit(tree, prefix):
    for key, value in tree.items():
      name = f'{prefix}{key}'
      if isinstance(value, dict):
        visit(value, name + '.')
      elif key == 'kernel':
        flat[f'{prefix}weight'] = np.asarray(value).T
      elif key in ('scale', 'embedding'):
        flat[f'{prefix}weight'] = np.asarray(value)
      else:
        flat[name] = np.asarray(value)

  visit(flax_params, '')
  flat['cls.predictions.decoder.weight'] = flat['bert.embeddings.word_embeddings.weight']
  return flat


@pytest.mark.parametrize('source', ['flax', 'torch_state_dict'])
@pytest.mark.parametrize('scan_layers', [True, False])
def test_post_matches_hugging_face_mlm_logits(source, scan_layers):
  hf_config, hf_model, hf_params = _hf_model()
  ids, mask, segments, positions = _batch()
  expected = np.asarray(
    hf_model(ids, attention_mask=mask, token_type_ids=segments, params=hf_params).logits
  )
  expected = np.take_along_axis(expected, positions[:, :, None], axis=1)

  config = hf_convert.config_from_hf(hf_config, scan_layers=scan_layers)
  weights = hf_params if source == 'flax' else _torch_style_state_dict(hf_params)
  params = hf_convert.from_hf_bert(weights, config)
  ours = MaskedLM(config).apply(
    {'params': params},
    jnp.asarray(ids),
    jnp.asarray(mask),
    jnp.asarray(segments),
    jnp.asarray(positions),
  )
  np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4, rtol=1e-4)
  # The imported tree has exactly the shapes our own init produces.
  own = jax.eval_shape(lambda: MaskedLM(config).init(jax.random.key(0), ids[:, :4]))['params']
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, params_lib.unbox(own))


def test_import_rejects_layouts_bert_cannot_fill():
  hf_config, _, hf_params = _hf_model()
  with pytest.raises(ValueError, match='ln_placement'):
    hf_convert.from_hf_bert(hf_params, hf_convert.config_from_hf(hf_config, ln_placement='pre'))
  assert hf_convert.config_from_hf(hf_config).position_embedding == 'learned'
  with pytest.raises(ValueError, match="position_embedding='rope' has none"):
    hf_convert.from_hf_bert(
      hf_params, hf_convert.config_from_hf(hf_config, position_embedding='rope')
    )


def test_sequence_classifier_matches_hugging_face_classifier():
  import transformers  # pylint: disable=import-outside-toplevel

  from realformer_jax import SequenceClassifier

  hf_config = toy_bert_config(num_hidden_layers=2, num_labels=3)
  hf_model = transformers.FlaxBertForSequenceClassification(hf_config, seed=5)
  hf_params = _perturbed(hf_model.params, seed=2)
  ids, mask, segments, _ = _batch()
  expected = hf_model(ids, attention_mask=mask, token_type_ids=segments, params=hf_params).logits
  config = hf_convert.config_from_hf(hf_config)
  params = hf_convert.from_hf_bert(hf_params, config)
  ours = SequenceClassifier(config, num_classes=3).apply({'params': params}, ids, mask, segments)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), atol=1e-4, rtol=1e-4)

"""ModelConfig's fields by concern (config.FIELD_CONCERNS): every field has exactly one, and the
field sets that fine-tuning and the export allow to differ are derived from them."""

import dataclasses

import pytest

from realformer_jax import config as config_lib
from realformer_jax.finetune.config import FINETUNE_MODEL_FIELDS
from realformer_jax.finetune.starting_point import StartingPoint
from realformer_jax.interop import hf_export
from realformer_jax.seq2seq.model_config import DECODER_FIELDS, Seq2SeqModelConfig


def test_every_model_field_has_exactly_one_concern():
  declared = [name for names in config_lib.FIELD_CONCERNS.values() for name in names]
  fields = [f.name for f in dataclasses.fields(config_lib.ModelConfig)]
  assert sorted(declared) == sorted(fields)  # none missing, none twice, none unknown
  # Each concern is one dataclass that ModelConfig is made of.
  for concern, cls in config_lib.CONCERNS.items():
    assert issubclass(config_lib.ModelConfig, cls), concern


def test_the_decoder_is_seq2seqs_concern_not_the_encoders():
  fields = {f.name for f in dataclasses.fields(config_lib.ModelConfig)}
  assert not fields & set(DECODER_FIELDS)
  seq2seq = Seq2SeqModelConfig(num_decoder_layers=2, decoder_attention='aan')
  assert seq2seq.replace(num_layers=3).num_decoder_layers == 2
  with pytest.raises(config_lib.ConfigError, match='model.decoder_attention'):
    Seq2SeqModelConfig(decoder_attention='fused')


def test_a_saved_encoder_config_with_the_old_decoder_fields_still_loads():
  # config.json of a pretraining run before the decoder moved to seq2seq/ (tests/golden).
  saved = {'num_layers': 2, 'num_decoder_layers': 6, 'decoder_attention': 'standard'}
  assert config_lib.ModelConfig.from_mapping(saved).num_layers == 2
  assert Seq2SeqModelConfig.from_mapping(saved).num_decoder_layers == 6
  with pytest.raises(config_lib.ConfigError, match='model.num_decoder_layer: unknown'):
    config_lib.ModelConfig.from_mapping({'num_decoder_layer': 6})


def test_fine_tuning_may_change_the_attention_kernels_of_a_checkpoint():
  # A checkpoint saved with attention_impl='auto', fine-tuned with 'xla': allowed (execution).
  source = StartingPoint(kind='workdir', path='/ckpt', checkpoint_model=config_lib.ModelConfig())
  model = source.model_config({'attention_impl': 'xla', 'dropout_rate': 0.0})
  assert model.attention_impl == 'xla' and model.dropout_rate == 0.0
  with pytest.raises(config_lib.ConfigError, match='model.num_layers=3: the starting checkpoint'):
    source.model_config({'num_layers': 3})


def test_fine_tuning_may_change_how_the_model_runs_never_its_architecture():
  architecture = set(config_lib.fields_of('architecture'))
  assert not architecture & set(FINETUNE_MODEL_FIELDS)
  assert {'attention_impl', 'attention_platform', 'attention_check', 'dropout_rate'} <= set(
    FINETUNE_MODEL_FIELDS
  )
  # The stored dtype is the checkpoint's: its weights are restored as saved.
  assert 'param_dtype' not in FINETUNE_MODEL_FIELDS


def test_export_ignores_exactly_what_does_not_change_inference():
  irrelevant = set(hf_export.INFERENCE_IRRELEVANT)
  assert set(FINETUNE_MODEL_FIELDS) <= irrelevant
  assert set(config_lib.fields_of('initialisation', 'storage')) <= irrelevant
  # Every field is covered by the export's check: exportable, a size, or irrelevant.
  hf_export.check_exportable(config_lib.ModelConfig())


def test_a_hugging_face_config_json_that_leaves_fields_out_is_bert_base(tmp_path):
  # transformers' BertConfig defaults are BERT-Base, as ModelConfig's are: a config.json of one
  # field reads as BERT-Base with that field changed.
  from realformer_jax.finetune import starting_point

  path = tmp_path / 'config.json'
  path.write_text('{"num_hidden_layers": 2, "model_type": "bert"}')
  config = starting_point._read_hf_config(str(path))
  assert (config.num_layers, config.hidden_size, config.num_heads) == (2, 768, 12)
  assert (config.mlp_dim, config.vocab_size, config.max_len) == (3072, 30522, 512)
  assert (config.norm_epsilon, config.init_std, config.activation) == (1e-12, 0.02, 'gelu')
  assert (config.dropout_rate, config.attention_dropout_rate) == (0.1, 0.1)

"""ModelConfig's fields by concern (config.FIELD_CONCERNS): every field has exactly one, and the
field sets that fine-tuning and the export allow to differ are derived from them."""

import dataclasses

from realformer_jax import config as config_lib
from realformer_jax.finetune.config import FINETUNE_MODEL_FIELDS
from realformer_jax.interop import hf_export


def test_every_model_field_has_exactly_one_concern():
  declared = [name for names in config_lib.FIELD_CONCERNS.values() for name in names]
  fields = [f.name for f in dataclasses.fields(config_lib.ModelConfig)]
  assert sorted(declared) == sorted(fields)  # none missing, none twice, none unknown


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
  assert set(config_lib.fields_of('initialisation', 'storage', 'decoder')) <= irrelevant
  # Every field is covered by the export's check: exportable, a size, or irrelevant.
  hf_export.check_exportable(config_lib.ModelConfig())

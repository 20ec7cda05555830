"""The full training config with its defaults: every field a run can set, in one place.

Experiment files in `configs/` start from `default_config()` and change what they need;
`validate_config` rejects any field that is not in this schema. Each section is generated from
the frozen dataclass that is its schema (defaults and a comment per field live there):

    model                ModelConfig (realformer_jax/config.py)
    data                 DataConfig (realformer_jax/data/config.py)
    train                TrainConfig (train/spec.py): optimisation, schedule, checkpoints, seed
    mesh                 MeshConfig (train/spec.py): axis names and shape (-1 = the rest)
    logical_axis_rules   model's logical axis names -> mesh axes (first matching rule wins)
    distributed          DistributedConfig (train/spec.py): jax.distributed.initialize
"""

import ml_collections

from realformer_jax.config import ModelConfig, to_config_dict
from realformer_jax.data import default_data_config
from realformer_jax.train import spec

# Logical names the model puts on parameters and activations (models.py and friends).
LOGICAL_AXES = ('batch', 'length', 'kv_length', 'embed', 'heads', 'kv', 'mlp', 'vocab', 'layers')
# The model field that sizes each logical axis of the parameters, which every mesh axis that a
# rule maps the logical axis to must divide (validation.check_devices). Each of these logical
# names is the first or only dimension of some parameter, so its whole rule applies there.
PARAM_AXIS_FIELDS = {
  'embed': 'hidden_size',
  'heads': 'num_heads',
  'mlp': 'mlp_dim',
  'vocab': 'vocab_size',
  'layers': 'num_layers',  # stacked on axis 0 under scan_layers only
}

# Data parallel over ('data', 'fsdp') on the batch; FSDP shards every big matrix on `embed`;
# tensor parallel splits heads, FFN and vocabulary. Order matters: a mesh axis is used once per
# array, so activations, which name `batch` before `embed`, keep `embed` unsharded.
DEFAULT_LOGICAL_AXIS_RULES = (
  ('batch', ('data', 'fsdp')),
  ('vocab', 'tensor'),
  ('heads', 'tensor'),
  ('mlp', 'tensor'),
  ('embed', 'fsdp'),
  ('kv', None),
  ('layers', None),
  ('length', None),
  ('kv_length', None),
)


def default_model_config(model: ModelConfig = ModelConfig()) -> ml_collections.ConfigDict:
  """ModelConfig as a ConfigDict; `residual_attention` (None by default) is a typed placeholder
  so that `--config.model.residual_attention=True` still parses."""
  return to_config_dict(model, field_types={'residual_attention': bool})


def default_train_config() -> ml_collections.ConfigDict:
  # grad_accum_steps holds an int or 'auto'.
  return to_config_dict(spec.TrainConfig(), field_types={'grad_accum_steps': object})


def default_mesh_config() -> ml_collections.ConfigDict:
  return to_config_dict(spec.MeshConfig())


def default_distributed_config() -> ml_collections.ConfigDict:
  return to_config_dict(spec.DistributedConfig())


def default_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.data = default_data_config()
  config.model = default_model_config()
  # One vocabulary: the model's table follows the tokenizer's size unless set explicitly.
  config.model.vocab_size = config.data.get_ref('vocab_size')
  config.train = default_train_config()
  config.mesh = default_mesh_config()
  config.logical_axis_rules = DEFAULT_LOGICAL_AXIS_RULES
  config.distributed = default_distributed_config()
  return config

"""The full training config with its defaults: every field a run can set, in one place.

Experiment files in `configs/` start from `default_config()` and change what they need;
`validate_config` rejects any field that is not in this schema. Sections:

    model                ModelConfig fields (realformer_jax/config.py)
    data                 data pipeline (realformer_jax/data/config.py)
    train                optimisation, schedule, intervals, checkpoints, seed
    mesh                 device mesh: axis names and shape (-1 = the remaining devices)
    logical_axis_rules   model's logical axis names -> mesh axes (first matching rule wins)
    distributed          multi-process start-up (jax.distributed.initialize)
"""

import dataclasses

import ml_collections
from ml_collections import config_dict

from realformer_jax.config import ModelConfig
from realformer_jax.data import default_data_config

# Logical names the model puts on parameters and activations (models.py and friends).
LOGICAL_AXES = ('batch', 'length', 'kv_length', 'embed', 'heads', 'kv', 'mlp', 'vocab', 'layers')

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
  """ModelConfig as a ConfigDict; None-valued fields become typed placeholders so that
  `--config.model.residual_attention=True` still parses."""
  c = ml_collections.ConfigDict()
  for field in dataclasses.fields(ModelConfig):
    value = getattr(model, field.name)
    if value is None and field.name == 'residual_attention':
      value = config_dict.placeholder(bool)
    c[field.name] = value
  return c


def default_train_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.global_batch_size = 512  # sequences per optimizer step, summed over all devices
  c.num_train_steps = 1_000_000  # length of the learning-rate schedule
  c.stop_at_step = -1  # end this run at this step (resume later); -1 = num_train_steps
  c.learning_rate = 1e-4  # peak AdamW learning rate
  c.warmup_steps = 10_000  # linear warmup from 0, then linear decay to 0 at num_train_steps
  c.weight_decay = 0.01  # decoupled (AdamW); not applied to biases or norm scales
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.adam_eps = 1e-6  # BERT's value
  c.clip_grad_norm = 1.0  # global-norm clipping; 0 = off
  # Microbatches per step (lax.scan inside the compiled step), or 'auto': the fewest whose
  # compiled step fits the device memory (train/accumulation.py).
  c.grad_accum_steps = config_dict.FieldReference(1, field_type=object)
  c.device_memory_bytes = -1  # 'auto' budget per device; -1 = ask the device (CPU: host RAM)
  c.memory_fraction = 0.9  # 'auto' keeps the step within this fraction of that budget
  c.log_layer_grad_norms = False  # also log each layer's sublayer gradient norms (diagnostics)
  c.prefetch_batches = 2  # batches placed on the devices ahead of their step (prefetch.py)
  c.log_every_steps = 100  # console line + TensorBoard train scalars (and the first step)
  c.eval_every_steps = 10_000  # held-out MLM loss/accuracy (also at the last step)
  c.checkpoint_every_steps = 10_000  # orbax checkpoint (also at the last step and on SIGTERM)
  c.keep_checkpoints = 3  # keep the last K checkpoints
  c.seed = 0  # params init, dropout and data order
  return c


def default_mesh_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.axes = ('data', 'fsdp', 'tensor')
  c.shape = (-1, 1, 1)  # one entry may be -1: all remaining devices
  return c


def default_distributed_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.coordinator_address = ''  # 'host:port' of process 0; needed when num_processes > 1
  c.num_processes = 1  # > 1: jax.distributed.initialize with these three values
  c.process_id = 0
  c.auto_detect = False  # jax.distributed.initialize() from the cluster environment
  return c


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

r"""The embedded task: which section of the canon is an ASV verse from (7 classes, no download).

    python -m experiments.finetune --config=configs/finetune/bible_sections.py --workdir=DIR

As written the model is configs/tiny.py's, randomly initialised (runs anywhere). From a
pretraining workdir (its sizes, LN placement and residual attention; README: the tiny run):
`--config=configs/finetune/bible_sections.py:init=/tmp/realformer_tiny`. Verses are short (99%
under ~75 tokens): 64-token sequences; 3 epochs of ~770 steps at batch 32.
"""

from realformer_jax.configs.finetune import start_from_arg
from realformer_jax.finetune import config as finetune_config


def get_config(arg: str = ''):
  config = finetune_config.default_config()
  start_from_arg(config, arg)
  config.data.dataset = 'bible_sections'
  config.data.max_len = 64
  config.model.dropout_rate = 0.1
  config.model.attention_dropout_rate = 0.1
  config.train.learning_rate = 1e-4  # batch 32, 3 epochs: BERT's recipe (finetune/config.py)
  config.train.log_every_steps = 100
  return config

r"""SQuAD through TFDS: squad.py:v1.1 or squad.py:v2.0 (unanswerable questions).

    python -m experiments.finetune --config=configs/finetune/squad.py:v1.1 --workdir=DIR

The dataset must be prepared as array_record under data.data_dir (`tfds build squad/v1.1
--file_format=array_record`, or --config.data.download=True). BERT's recipe: sequences of 384
in context windows 128 tokens apart, questions up to 64 tokens, answers up to 30, batch 32,
learning rate 5e-5 (here 3e-5), 2 epochs. Add `,init=/path/model.safetensors` (Hugging Face
BERT) or `,init=DIR` (a pretraining workdir); without it configs/tiny.py's model, randomly
initialised. Metrics: the official exact match and F1 (best checkpoint by F1).
"""

from realformer_jax.configs.finetune import tfds_config

VERSIONS = ('v1.1', 'v2.0')


def get_config(arg: str = 'v1.1'):
  config = tfds_config(arg, 'squad', 'version', VERSIONS, default='v1.1')
  if not config.finetune.init:  # random init: a position table for 384-token windows
    config.model.max_len = 512
  config.data.max_len = 384
  config.data.doc_stride = 128
  config.data.max_query_len = 64
  config.data.max_answer_len = 30
  config.finetune.num_epochs = 2
  config.train.learning_rate = 3e-5  # batch 32: BERT's recipe (finetune/config.py)
  return config

r"""GLUE through TFDS: glue.py:TASK with TASK in cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli.

    python -m experiments.finetune --config=configs/finetune/glue.py:mrpc --workdir=DIR

The dataset must be prepared as array_record under data.data_dir (`tfds build glue/mrpc
--file_format=array_record`, or --config.data.download=True). BERT's recipe: batch 32, 3
epochs, learning rate 2e-5 .. 5e-5 (here 5e-5), 10% warmup, sequences of 128. From Hugging Face
BERT weights: `glue.py:mrpc,init=/path/model.safetensors` (its config.json and vocab.txt
beside it); from a pretraining workdir: `init=DIR`. Without init, configs/tiny.py's model,
randomly initialised. Metrics: accuracy, F1 (MRPC, QQP), Matthews correlation (CoLA),
Pearson / Spearman (STS-B); the best checkpoint by the task's GLUE metric.
"""

from realformer_jax.configs.finetune import tfds_config

TASKS = ('cola', 'sst2', 'mrpc', 'qqp', 'stsb', 'mnli', 'qnli', 'rte', 'wnli')


def get_config(arg: str = 'mrpc'):
  config = tfds_config(arg, 'glue', 'task', TASKS, default='mrpc')
  config.data.max_len = 128  # the rest is the default: BERT's recipe (finetune/config.py)
  return config

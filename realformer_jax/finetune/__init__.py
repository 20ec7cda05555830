"""Fine-tuning from our pretraining checkpoints or Hugging Face BERT weights.

    python -m experiments.finetune --config=configs/finetune/bible_sections.py --workdir=DIR

    from realformer_jax import finetune
    finetune.run(config, workdir)        # config: finetune.default_config() + changes

Tasks run in the pretraining loop (realformer_jax/train, generic over tasks): GLUE-style
classification and regression, SQuAD-style span extraction, and embedded labelled tasks that
need no download (bible.py). Files: config (schema), datasets (specs, TFDS reading), bible,
encoding, squad (windows, post-processing), metrics, starting_point (random / workdir /
Hugging Face), batches (train stream, eval batches), tasks (the loop's Task objects), run.
"""

from realformer_jax.finetune.config import default_config
from realformer_jax.finetune.datasets import DATASETS
from realformer_jax.finetune.run import evaluate_best, run, with_schedule
from realformer_jax.finetune.tasks import make_task

__all__ = ['DATASETS', 'default_config', 'evaluate_best', 'make_task', 'run', 'with_schedule']

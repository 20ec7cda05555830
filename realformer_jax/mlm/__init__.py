"""Masked-LM pretraining, the project's main job, as a task of the generic trainer
(realformer_jax/train) on the masked-LM data pipeline (realformer_jax/data), beside finetune/
and seq2seq/.

    python -m experiments.train --config=configs/tiny.py --workdir=/tmp/realformer_tiny

    from realformer_jax import mlm, train
    train.train_and_evaluate(config, workdir)                       # the default task: this one
    train.train_and_evaluate(config, workdir, task=mlm.MaskedLMTask())

Files: task (MaskedLMTask: model, batch, loss, console lines, data), metrics (loss and accuracy
split by what the model saw at each predicted position; the one definition of a run that learned
nothing), fill_mask (a trained model's guesses for each literal [MASK] in a text). It is the
trainer's default task (train/config.py names it by import path).
"""

from realformer_jax.mlm import metrics
from realformer_jax.mlm.fill_mask import fill_mask
from realformer_jax.mlm.task import MaskedLMTask

__all__ = ['MaskedLMTask', 'fill_mask', 'metrics']

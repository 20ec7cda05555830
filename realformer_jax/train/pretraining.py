"""Old name of the entry points that default to the registered task, kept so that
`from realformer_jax.train import pretraining` still works."""

from realformer_jax.train.config import validate_config
from realformer_jax.train.loop import compile_train_step, train_and_evaluate

__all__ = ['compile_train_step', 'train_and_evaluate', 'validate_config']

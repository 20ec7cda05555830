"""Old name of entry.py (the entry points that default to the registered task), kept so that
`from realformer_jax.train import pretraining` still works."""

from realformer_jax.train.entry import compile_train_step, train_and_evaluate, validate_config

__all__ = ['compile_train_step', 'train_and_evaluate', 'validate_config']

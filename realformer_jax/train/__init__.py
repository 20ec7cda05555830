"""Masked-LM pretraining: sharded from the start (mesh + logical axis rules + jax.jit).

    from realformer_jax import train
    train.train_and_evaluate(config, workdir)      # the whole job; resumes from workdir
    train.validate_config(config)                  # one-line ConfigError / DataError
    train.compile_train_step(config)               # AOT-compiled step: .memory_analysis()
    train.load_workdir(workdir)                    # config, params, tokenizer of a trained run

Files: defaults (config schema), validation, partitioning (mesh, rules, shardings), state
(TrainState, optimizer, sharded init), step (train/eval steps), build (setup + compilation),
checkpointing (orbax), metrics (TensorBoard, console, event reader), distributed, loop.
"""

from realformer_jax.train.build import TrainSetup, compile_eval_step, compile_train_step
from realformer_jax.train.build import make_setup
from realformer_jax.train.defaults import default_config
from realformer_jax.train.loop import TrainingError, evaluate, train_and_evaluate
from realformer_jax.train.metrics import read_scalars
from realformer_jax.train.pretrained import Pretrained, load_workdir
from realformer_jax.train.state import TrainState
from realformer_jax.train.validation import validate_config

__all__ = [
    'Pretrained', 'TrainSetup', 'TrainState', 'TrainingError', 'compile_eval_step',
    'compile_train_step', 'default_config', 'evaluate', 'load_workdir', 'make_setup',
    'read_scalars', 'train_and_evaluate', 'validate_config',
]

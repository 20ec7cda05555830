"""Training any task, sharded from the start (mesh + logical axis rules + jax.jit). The tasks
live above this package (realformer_jax/mlm, finetune, seq2seq); without `task=` the entry
points train the default one (task.py: masked-LM pretraining, registered by realformer_jax/mlm).

    from realformer_jax import train
    train.train_and_evaluate(config, workdir)      # the whole job; resumes from workdir
    spec = train.validate_config(config)           # RunSpec, or one-line ConfigError / DataError
    train.compile_train_step(config)               # AOT-compiled step: .memory_analysis()
    train.load_workdir(workdir)                    # config, params, tokenizer of a trained run

The path from a config to a step, one module per stop:
  config (the editable ConfigDict, checked once into a RunSpec of frozen sections) ->
  build (setup: mesh, rules and shardings; model; optimizer and sharded state init; compiled
  steps; 'auto' accumulation resolved by compiling) -> step (TrainState and the pure train /
  eval step) -> loop (processes, data, checkpoints, metrics out: TensorBoard, console, event
  reader). Beside them: task (the interface a task implements; config.py names the default task
  that the entry points take unless given one), checkpointing (orbax), preemption (SIGTERM and
  Ctrl-C), prefetch, pretrained (a trained workdir). pretraining is an old name, kept for old
  imports.
"""

from realformer_jax.train.build import TrainSetup, compile_eval_step, make_setup
from realformer_jax.train.config import RunSpec, default_config, validate_config
from realformer_jax.train.errors import DivergenceError, TrainingError
from realformer_jax.train.loop import compile_train_step, evaluate, read_scalars, train_and_evaluate
from realformer_jax.train.pretrained import Pretrained, load_workdir
from realformer_jax.train.step import TrainState

__all__ = [
  'DivergenceError',
  'Pretrained',
  'RunSpec',
  'TrainSetup',
  'TrainState',
  'TrainingError',
  'compile_eval_step',
  'compile_train_step',
  'default_config',
  'evaluate',
  'load_workdir',
  'make_setup',
  'read_scalars',
  'train_and_evaluate',
  'validate_config',
]

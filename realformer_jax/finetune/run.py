"""A fine-tuning job: the schedule from epochs, the generic training loop, the test split.

    from realformer_jax import finetune
    result = finetune.run(config, workdir)   # config: configs/finetune/*.py

1. The config is checked once (one-line ConfigError / DataError) into a RunSpec and the train
   split encoded, which fixes the steps per epoch: train.num_train_steps = ceil(num_epochs *
   steps_per_epoch), warmup the first finetune.warmup_fraction of them, evaluation and a
   checkpoint every epoch (derived into the spec; the user's config is not changed).
2. The training loop (realformer_jax/train/loop.py) trains the task (sharding, resume, TensorBoard,
   progress line, SIGTERM, the best checkpoint by the task's metric under <workdir>/best).
3. If the dataset has a labelled test split, the best checkpoint is evaluated on it once.
4. <workdir>/results.json holds the final and best eval metrics, the test metrics, the
   baselines, the class names of your own files (`labels`, in class-id order) and the identity
   of the starting point (starting_point.json: the pretraining
   workdir's step, checksum verdict, config and corpus digests, or the weights' digests).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections

from realformer_jax import train
from realformer_jax.finetune import datasets, starting_point
from realformer_jax.finetune.tasks import make_task
from realformer_jax.train import build, checkpointing, data_shards, loop
from realformer_jax.train import config as train_config
from realformer_jax.train import step as step_lib
from realformer_jax.train.step import TrainState
from realformer_jax.train.task import prefixed

RESULTS_FILE = 'results.json'


def schedule(spec: train.RunSpec) -> tuple[dict, dict]:
  """(train fields, how each is derived): the step counts a fine-tuning run uses, from
  finetune.num_epochs and the size of the train split (the config's own are not used)."""
  finetune = spec.sections['finetune']
  examples = spec.task.train_size(spec.data)
  batch = spec.train.global_batch_size
  steps_per_epoch = math.ceil(examples / batch)
  total = max(1, math.ceil(finetune.num_epochs * steps_per_epoch))
  epoch = f'{examples} train examples / batch {batch}, rounded up'
  fields = dict(
    num_train_steps=total,
    warmup_steps=int(finetune.warmup_fraction * total),
    eval_every_steps=steps_per_epoch,
    checkpoint_every_steps=steps_per_epoch,
  )
  how = dict(
    num_train_steps=f'derived: finetune.num_epochs={finetune.num_epochs} x {steps_per_epoch} '
    f'steps an epoch ({epoch})',
    warmup_steps=f'derived: finetune.warmup_fraction={finetune.warmup_fraction} of the steps',
    eval_every_steps=f'derived: one epoch ({epoch})',
    checkpoint_every_steps=f'derived: one epoch ({epoch})',
  )
  return fields, how


def with_schedule(spec: train.RunSpec) -> train.RunSpec:
  """The spec with its train section's step counts derived from finetune.num_epochs and the
  size of the train split (`schedule`; the user's train.num_train_steps etc. are not used)."""
  return spec.replace(train=spec.train.replace(**schedule(spec)[0]))


def config_as_run(config: ml_collections.ConfigDict) -> tuple[ml_collections.ConfigDict, dict]:
  """`config` with the train fields a run derives (`schedule`), and a note for each
  ('train.<field>': how it is derived): what --print_config shows."""
  fields, how = schedule(train_config.validate_config(config, task=make_task(config)))
  shown = ml_collections.ConfigDict(config.to_dict())
  for name, value in fields.items():
    shown.train[name] = value
  return shown, {f'train.{name}': note for name, note in how.items()}


def run(
  config: ml_collections.ConfigDict,
  workdir: str,
  on_log: Optional[Callable[[int, int, dict], None]] = None,
) -> dict[str, Any]:
  """Fine-tunes as the config says; returns (and writes to results.json) the metrics."""
  spec = with_schedule(train_config.validate_config(config, task=make_task(config)))
  # Where the run starts, pinned to one checked step and recorded (a resume keeps its own),
  # with the tokenizer it actually uses (data.vocab_file, if given).
  source, identity = spec.task.starting_point.pinned()
  spec.task.starting_point = source
  if identity is not None:
    identity = dict(identity, **starting_point.tokenizer_used(source, spec.data))
  identity = starting_point.record_or_check(workdir, identity, spec.sections['finetune'].init_step)
  if jax.process_index() == 0:
    print(starting_point.describe_start(source, identity), flush=True)
  result = loop.run(spec, workdir, on_log=on_log)
  if result.get('preempted'):
    return result
  task = spec.task
  test_split = datasets.split_name(spec.data, 'test')
  if test_split:
    result.update(evaluate_best(spec, workdir, test_split))
    metric = task.best_metric
    print(
      f'test  {metric} {result[f"test/{metric}"]:.4f} with the best checkpoint (step '
      f'{result["best_step"]}, eval {metric} {result[f"best/eval/{metric}"]:.4f}) vs '
      f'{task.baseline_name} {result[f"test/baseline_{metric}"]:.4f}',
      flush=True,
    )
  if jax.process_index() == 0:
    with open(os.path.join(workdir, RESULTS_FILE), 'w') as f:
      json.dump(
        {
          **{
            k: v if isinstance(v, (bool, str)) else float(v) if not isinstance(v, int) else v
            for k, v in result.items()
          },
          'starting_point': identity,  # run_identity.py: what the weights came from
          **({'labels': list(task.spec.labels)} if task.spec.labels else {}),  # class id -> name
        },
        f,
        indent=2,
        sort_keys=True,
      )
  return result


def evaluate_best(spec: train.RunSpec, workdir: str, split: str) -> dict[str, float]:
  """Metrics of the best checkpoint in `workdir` on `split` ('test/...'), its baseline
  ('test/baseline_...'), the checkpoint's step and its eval metrics ('best/eval/...')."""
  task = spec.task
  setup = build.make_setup(spec)
  params, step, best_metrics = checkpointing.restore_best_params(
    workdir, setup.layout.abstract.params
  )
  batches, baseline, context = task.eval_split_data(
    spec, split, *data_shards.data_shard(setup.mesh, spec.rules, jax.process_index())
  )
  state = TrainState(step=jnp.asarray(step, jnp.int32), params=params, opt_state=())
  accum = spec.train.grad_accum_steps
  eval_step = jax.jit(
    step_lib.make_eval_step(setup.model, task, accum if isinstance(accum, int) else 1),
    in_shardings=(
      TrainState(step=setup.replicated, params=setup.layout.shardings.params, opt_state=()),
      setup.batch_sharding,
    ),
    out_shardings=setup.replicated,
  )
  with build.activate(setup.mesh, setup.rules):
    metrics = loop.evaluate(eval_step, state, batches, setup, context)
  return {
    **{f'test/{k.split("/", 1)[1]}': v for k, v in metrics.items()},
    **{f'test/baseline_{k}': v for k, v in baseline.items()},
    **prefixed(best_metrics, 'best'),
    'best_step': int(step),
  }

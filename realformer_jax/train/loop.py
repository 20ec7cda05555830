"""train_and_evaluate: check, build data, compile once, train, evaluate, checkpoint, resume.

Order matters for failing fast: the config is validated and the data is built (tokenizer,
iterators, baseline) before any model is traced, so every user-fixable problem costs seconds.
Metrics are pulled to the host one step late, so the host never waits on the step it has just
dispatched; a state is checked finite before it is ever saved.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections

from realformer_jax import data, diagnostics
from realformer_jax.config import ConfigError
from realformer_jax.params import count_params
from realformer_jax.train import accumulation, build, distributed, metrics as metrics_lib
from realformer_jax.train import partitioning, prefetch, state as state_lib, validation
from realformer_jax.train.checkpointing import Checkpointer
from realformer_jax.train.step import SUM_METRICS


class TrainingError(RuntimeError):
  """Training cannot go on (e.g. a non-finite loss). The message names the step."""


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       on_log: Optional[Callable[[int, int, dict], None]] = None
                       ) -> dict[str, Any]:
  """Trains until train.stop_at_step (or num_train_steps), resuming from the latest checkpoint
  in `workdir`. Returns the final eval metrics, the baseline and the step reached.

  `on_log(step, stop_step, scalars)` is called at every train log line (e.g. for a progress
  line of an experiment that runs many trainings)."""
  model_config = validation.validate_config(config)
  distributed.initialize(config.distributed)
  validation.check_devices(config, jax.device_count(), jax.process_count())
  tokenizer, train_iter, eval_batches, baseline = _build_data(config, model_config)

  writer = metrics_lib.MetricWriter(workdir, enabled=jax.process_index() == 0)
  checkpointer = Checkpointer(workdir, config.train.keep_checkpoints)
  preemption = distributed.PreemptionWatcher()
  batches = None
  try:
    user_config = config
    resolved = accumulation.resolve(config, model_config, log=writer.print)
    config, setup, train_step = resolved.config, resolved.setup, resolved.compiled
    state, rng = _restore_or_init(setup, checkpointer, train_iter, writer)
    eval_step = build.compile_eval_step(setup)
    _write_run_files(user_config, tokenizer, workdir)
    writer.print(f'model: {count_params(setup.layout.abstract.params) / 1e6:.2f}M params, '
                 f'mesh {dict(setup.mesh.shape)}, {jax.process_count()} process(es)')

    stop = _stop_step(config.train)
    step = int(jax.device_get(state.step))
    last_saved = checkpointer.latest_step()
    rng_data = jax.random.key_data(rng)
    log = _TrainLog(writer, config, start_step=step, stop_step=stop, on_log=on_log)
    # Batches go onto the devices ahead of their step; checkpoints save the position after the
    # last batch trained on (prefetch.py).
    batches = prefetch.DevicePrefetcher(train_iter, setup.batch_sharding,
                                        depth=config.train.prefetch_batches)
    if step < stop:
      writer.print(f'training steps {step + 1}-{stop}: the first step is running (logged when '
                   f'done, then every {config.train.log_every_steps})')
    pending = None  # (step, device metrics) of the step dispatched last
    while step < stop:
      state, step_metrics = train_step(state, next(batches), rng)
      step += 1
      if pending is not None:  # the previous step: done by now, so this does not block
        log.record(*pending, last_checkpoint=last_saved)
      pending = (step, step_metrics)
      preempted = preemption.requested(step)
      if step % config.train.checkpoint_every_steps == 0 or step == stop or preempted:
        log.record(*pending, last_checkpoint=last_saved)  # never save a bad state
        pending = None
        checkpointer.save(state, rng_data, batches, step=step)
        last_saved = step
      if preempted:
        writer.print(f'SIGTERM: saved a checkpoint at step {step}; exiting.')
        return {'step': step, 'preempted': True}
      if step % config.train.eval_every_steps == 0 and step != stop:
        _write_eval(writer, step, evaluate(eval_step, state, eval_batches, setup), baseline)
        log.restart_clock(step)  # throughput counts training time only

    final = evaluate(eval_step, state, eval_batches, setup)
    _write_eval(writer, step, final, baseline)
    writer.print(f'final eval MLM accuracy {final["eval/mlm_accuracy"]:.4f} vs most-frequent-'
                 f'token baseline {baseline:.4f} (eval loss {final["eval/loss"]:.4f}, '
                 f'step {step})')
    return {**{k: float(v) for k, v in final.items()}, 'step': step, 'baseline': baseline,
            'preempted': False}
  finally:
    preemption.close()
    checkpointer.wait()
    checkpointer.close()
    writer.close()
    if batches is not None:
      batches.close()
    train_iter.close()  # stops its prefetch thread


def _build_data(config: ml_collections.ConfigDict, model_config):
  """(tokenizer, train iterator, eval batches, most-frequent-token baseline) for this process.

  Runs before anything is compiled, so every DataError surfaces in seconds."""
  tokenizer = data.prepare(config.data)
  if tokenizer.vocab_size > model_config.vocab_size:
    raise ConfigError(f'model.vocab_size={model_config.vocab_size}: smaller than the '
                      f'tokenizer vocabulary {tokenizer.vocab_size} ({tokenizer.source})')
  batch_size = config.train.global_batch_size
  process_index, process_count = jax.process_index(), jax.process_count()
  train_iter = data.make_train_iterator(config.data, batch_size, config.train.seed,
                                        process_index, process_count)
  eval_batches = data.make_eval_iterator(config.data, batch_size, process_index, process_count)
  baseline = data.most_frequent_token_baseline(config.data, batch_size)
  return tokenizer, train_iter, eval_batches, baseline


def _stop_step(train: ml_collections.ConfigDict) -> int:
  if train.stop_at_step == -1:
    return train.num_train_steps
  return min(train.stop_at_step, train.num_train_steps)


def _write_run_files(config: ml_collections.ConfigDict, tokenizer, workdir: str) -> None:
  """config.json (as given: 'auto' stays 'auto') and a copy of the tokenizer's file, so the
  workdir alone is enough to use the model later (train.load_workdir)."""
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2))
    tokenizer.save(workdir)


def _restore_or_init(setup: build.TrainSetup, checkpointer: Checkpointer, train_iter,
                     writer: metrics_lib.MetricWriter):
  """(state, rng) from the latest checkpoint (moving `train_iter` to its position), or new."""
  latest = checkpointer.latest_step()
  if latest is None:
    # Made by a jitted function: a replicated array that spans every process's devices.
    init_rng, rng = jax.jit(lambda seed: tuple(jax.random.split(jax.random.key(seed))),
                            out_shardings=setup.replicated)(setup.config.train.seed)
    state = state_lib.init_state(setup.model, setup.tx, setup.config.data, setup.layout,
                                 init_rng, setup.mesh, setup.rules)
    return state, rng
  abstract_key_data = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=setup.replicated)
  state, key_data = checkpointer.restore(latest, setup.layout.abstract, abstract_key_data,
                                         train_iter)
  writer.print(f'resumed from the checkpoint at step {latest} in {checkpointer.directory}')
  return state, jax.random.wrap_key_data(key_data)


def evaluate(eval_step, state, eval_batches, setup: build.TrainSetup) -> dict[str, float]:
  """MLM loss and accuracy over one pass of the eval batches (sums added on device)."""
  totals = None
  for batch in eval_batches:
    sums = eval_step(state, partitioning.global_batch(batch, setup.batch_sharding))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return metrics_lib.mean_metrics(jax.device_get(totals), 'eval')


def _write_eval(writer: metrics_lib.MetricWriter, step: int, eval_metrics: dict,
                baseline: float) -> None:
  writer.scalars(step, dict(eval_metrics, **{'eval/baseline_mlm_accuracy': baseline}))
  writer.print(f'eval  step {step}: loss {eval_metrics["eval/loss"]:.4f} | MLM accuracy '
               f'{eval_metrics["eval/mlm_accuracy"]:.4f} (baseline {baseline:.4f})')


class _TrainLog:
  """Host side of the train metrics: finiteness check, sums per log interval, output."""

  def __init__(self, writer: metrics_lib.MetricWriter, config: ml_collections.ConfigDict,
               start_step: int, stop_step: int,
               on_log: Optional[Callable[[int, int, dict], None]] = None):
    self._on_log = on_log
    self._writer = writer
    self._every = config.train.log_every_steps
    self._start = start_step
    self._stop = stop_step
    self._sums: Optional[dict] = None
    self._throughput = metrics_lib.Throughput(
        config.train.global_batch_size * config.data.max_len, start_step, stop_step)

  def restart_clock(self, step: int) -> None:
    self._throughput.restart(step)

  def record(self, step: int, device_metrics: dict, last_checkpoint: Optional[int]) -> None:
    values = jax.device_get(device_metrics)
    loss = float(values['mlm_loss_sum']) / max(float(values['mlm_weight']), 1.0)
    if not (math.isfinite(loss) and bool(values['grads_finite'])):
      what = f'non-finite loss {loss}' if not math.isfinite(loss) else 'non-finite gradients'
      kept = f'step {last_checkpoint}' if last_checkpoint is not None else 'none'
      raise TrainingError(f'{what} at step {step}; stopped without saving '
                          f'(last good checkpoint: {kept})')
    self._sums = metrics_lib.add_sums(self._sums, values, SUM_METRICS)
    # Also the run's first step: a big model on a small machine shows its ETA at once.
    if step % self._every and step != self._stop and step != self._start + 1:
      return
    tokens_per_sec, seconds_left = self._throughput.update(step)
    scalars = metrics_lib.mean_metrics(self._sums, 'train')
    scalars.update({'train/learning_rate': float(values['learning_rate']),
                    'train/grad_norm': float(values['grad_norm']),
                    'train/tokens_per_sec': tokens_per_sec})
    if 'layer_grad_norms' in values:
      scalars.update(diagnostics.flatten_metrics(values['layer_grad_norms'], 'train/grad_norm'))
    self._sums = None
    self._writer.scalars(step, scalars)
    if self._on_log is not None:
      self._on_log(step, self._stop, scalars)
    self._writer.print(
        f'step {step:>{len(str(self._stop))}}/{self._stop} | loss {scalars["train/loss"]:.4f} | '
        f'acc {scalars["train/mlm_accuracy"]:.4f} | lr {scalars["train/learning_rate"]:.2e} | '
        f'grad {scalars["train/grad_norm"]:.2f} | {tokens_per_sec:,.0f} tok/s | '
        f'ETA {metrics_lib.format_duration(seconds_left)}')

"""train_and_evaluate: check, build data, compile once, train, evaluate, checkpoint, resume.

One loop for every task (task.py): masked-LM pretraining (realformer_jax/mlm), the fine-tuning
tasks (realformer_jax/finetune), translation (realformer_jax/seq2seq). Order matters for failing
fast: the config is validated, checked against the devices and the workdir, and the data is
built (tokenizer, iterators, baseline) before any model is traced (run_setup.py: what the run
derives from its spec, derived once, which the loop then reads), so every user-fixable problem
costs seconds. Metrics are pulled to the host one
step late, so the host never waits on the step it has just dispatched; a state is checked finite
before it is ever saved. A task with a `best_metric` also keeps the parameters of its best
evaluation (checkpointing.py). The run's processes start here too (`initialize_processes`), and a
preemption (SIGTERM) or Ctrl-C stops it after a saved step (preemption.py). What the run writes
out is here as well: TensorBoard events and console lines (`MetricWriter`, `_TrainLog`), and the
reader of those events (`read_scalars`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import os
import shutil
import struct
import time
from typing import Any, Callable, Mapping, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from realformer_jax import extras
from realformer_jax.analysis import diagnostics
from realformer_jax.config import ConfigError
from realformer_jax.kernels.score_paths import ring_attention
from realformer_jax.model.params import count_params
from realformer_jax.train import (
  build,
  checkpoint_record,
  cpu_notice,
  divergence,
  memory,
  resume_checks,
  run_files,
  run_setup,
  workdir_lock,
)
from realformer_jax.train import config as train_config
from realformer_jax.train.checkpointing import BestCheckpoint, Checkpointer
from realformer_jax.train.config import RunSpec
from realformer_jax.train.errors import DivergenceError, TrainingError
from realformer_jax.train.preemption import PreemptionWatcher
from realformer_jax.train.task import Task, TaskData, prefixed
from realformer_jax.units import format_duration
from realformer_jax.workdir_layout import TENSORBOARD


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  on_log: Optional[Callable[[int, int, dict], None]] = None,
  task: Optional[Task] = None,
) -> dict[str, Any]:
  """Trains `task` (default: masked-LM pretraining, config.default_task) on `config` until
  train.stop_at_step (or num_train_steps), resuming from the latest checkpoint in `workdir`:
  validates the config once (config.py), then `run`."""
  return run(train_config.validate_config(config, task=task), workdir, on_log=on_log)


def compile_train_step(
  config: Union[ml_collections.ConfigDict, RunSpec], task: Optional[Task] = None
) -> jax.stages.Compiled:
  """The compiled train step of a spec, or of a config (validated here for `task`, default the
  default task), on this host's devices, with 'auto' accumulation resolved (build.resolve):
  `compile_train_step(config).memory_analysis()`."""
  spec = (
    config
    if isinstance(config, RunSpec)
    else train_config.validate_config(
      config, task=task, device_count=jax.device_count(), process_count=jax.process_count()
    )
  )
  return build.resolve(spec, memory.memory_budget(spec.train), log=lambda _: None).compiled


def run(
  spec: RunSpec, workdir: str, on_log: Optional[Callable[[int, int, dict], None]] = None
) -> dict[str, Any]:
  """Trains `spec` (written to the workdir as config.json: `spec.to_dict()`). Returns the
  final eval metrics, the baseline (the task's first baseline metric; all of them as
  'baseline/<name>') and the step reached.

  `on_log(step, stop_step, scalars)` is called at every train log line (e.g. for a progress
  line of an experiment that runs many trainings)."""
  initialize_processes(spec.distributed)
  derived = run_setup.derive(spec, workdir)  # checked before the data; derived once
  task_data = spec.task.build_data(spec, *derived.data_shard)
  held = _Held(train_iter=task_data.train_iter)
  # One run per workdir (workdir_lock.py), taken before anything in the workdir is touched.
  held.lock = workdir_lock.acquire_for_run(workdir)
  try:
    committed, latest_record = _open_checkpoints(spec, derived, workdir, task_data, held)
    built = _build_state(spec, derived, workdir, task_data, held, committed, latest_record)
    log = _start_log(built, held.writer, workdir, committed, on_log)
    progress = _train_steps(built, task_data, held, log)
    if progress.preempted:
      return {'step': progress.step, 'preempted': True, 'signal': held.preemption.signal_name}
    return _finish(built, progress, task_data, held, log)
  except DivergenceError as e:
    if e.dead_end is None or held.checkpointer is None:
      raise
    raise held.checkpointer.set_aside_diverged(e) from None
  finally:
    held.close()


# The steps of `run`, in its order.


@dataclasses.dataclass
class _Held:
  """What a run holds open, filled in as it opens them; `close` closes what was opened."""

  train_iter: Any
  lock: Optional[workdir_lock.WorkdirLock] = None
  checkpointer: Optional[Checkpointer] = None
  writer: Optional[MetricWriter] = None
  best: Optional[BestCheckpoint] = None
  preemption: Optional[PreemptionWatcher] = None
  batches: Any = None

  def close(self) -> None:
    # Every step runs even if one fails (the lock must go); the first failure is raised, e.g.
    # the CheckpointError of a last save that failed in the background.
    preemption, checkpointer, best = self.preemption, self.checkpointer, self.best
    writer, batches, lock = self.writer, self.batches, self.lock
    _close_all(
      preemption and preemption.close,
      checkpointer and checkpointer.close,
      best and best.close,
      writer and writer.close,
      batches and batches.close,
      self.train_iter.close,  # stops its prefetch thread
      lock and lock.release,
    )
    if preemption is not None:
      preemption.deliver()  # a SIGTERM or Ctrl-C deferred to save now takes effect


def _open_checkpoints(
  spec: RunSpec, derived: run_setup.Derived, workdir: str, task_data: TaskData, held: _Held
) -> tuple[list[int], Optional[dict]]:
  """The run's checkpoints opened (into `held`: its steps, and its best evaluation's where the
  task keeps one), the workdir checked again now the run holds it, and a resume's newest step
  verified: (the intact steps, the newest one's record or None)."""
  # Every step saved records which model and tokenizer it holds (checkpoint_record.py).
  config_json = derived.config_json
  record = checkpoint_record.make(config_json, task_data.tokenizer)
  checkpointer = held.checkpointer = Checkpointer(
    workdir, spec.train.keep_checkpoints, record=record
  )
  task = spec.task  # a task with a best metric also keeps its best evaluation's parameters
  held.best = (
    BestCheckpoint(workdir, task.best_metric, task.best_mode) if task.best_metric else None
  )
  committed = checkpointer.intact_steps()
  # Refusals again, now the run holds the workdir; the notes once the restore has chosen.
  resume_checks.check_workdir(spec, workdir, committed)
  latest_record = None
  if committed:  # a resume trains on with the ids its steps were trained with
    with contextlib.suppress(ConfigError):  # a damaged record: the restore sets it aside
      latest_record = checkpoint_record.read(
        os.path.join(checkpointer.directory, str(committed[-1]))
      )
    remedy = resume_checks.tokenizer_remedy(config_json['data'], latest_record, committed[-1])
    checkpoint_record.verify(
      workdir, committed[-1], tokenizer=task_data.tokenizer, remedy=remedy, skip_damaged=True
    )
  return committed, latest_record


@dataclasses.dataclass(frozen=True)
class _Built:
  """The compiled run: its spec ('auto' resolved), setup, steps, and the state it starts from."""

  spec: RunSpec
  setup: build.TrainSetup
  train_step: Any
  eval_step: Any
  state: Any
  rng: jax.Array


def _build_state(
  spec: RunSpec,
  derived: run_setup.Derived,
  workdir: str,
  task_data: TaskData,
  held: _Held,
  committed: list[int],
  latest_record: Optional[dict],
) -> _Built:
  """The run's metrics and preemption watcher opened (into `held`), its steps compiled, its
  state restored or made, and the run files written, with a note for everything a resume
  changed."""
  writer = held.writer = MetricWriter(workdir, enabled=jax.process_index() == 0)
  held.preemption = PreemptionWatcher()
  given = spec  # as validated: 'auto' stays 'auto' (config_json)
  too_big_for_cpu = cpu_notice.notice(spec)  # before minutes of compiling, not after
  if too_big_for_cpu:
    writer.print(too_big_for_cpu)
  resolved = build.resolve(spec, derived.budget, log=writer.print, mesh=derived.mesh)
  spec, setup, train_step = resolved.spec, resolved.setup, resolved.compiled
  state, rng = _restore_or_init(setup, held.checkpointer, task_data.train_iter, writer)
  # Against the step actually restored: a damaged newer step was moved aside meanwhile.
  restored = int(jax.device_get(state.step))
  for note in filter(
    None, resume_checks.check_workdir(given, workdir, [restored] if restored else [])
  ):
    writer.print(note)
  eval_step = build.compile_eval_step(setup)
  recorded = (committed[-1], latest_record['config']) if committed and latest_record else None
  for note in run_files.write_run_files(
    derived.config_json, task_data.tokenizer, workdir, recorded
  ):
    writer.print(note)
  writer.print(
    f'model: {count_params(setup.layout.abstract.params) / 1e6:.2f}M params, '
    f'mesh {dict(setup.mesh.shape)}, {jax.process_count()} process(es)'
  )
  if spec.sequence_parallel_size(setup.mesh.size) > 1:
    writer.print(f'ring attention per-block op: {ring_attention.block_op(setup.model_config)}')
  return _Built(spec, setup, train_step, eval_step, state, rng)


def _start_log(
  built: _Built,
  writer: MetricWriter,
  workdir: str,
  committed: list[int],
  on_log: Optional[Callable[[int, int, dict], None]],
) -> _TrainLog:
  """The train metrics' log from the step the state holds, its loss reference's note said."""
  log = _TrainLog(
    writer,
    built.spec,
    start_step=int(jax.device_get(built.state.step)),
    stop_step=built.spec.train.stop_step,
    reference=divergence.LossReference(workdir, resumed=bool(committed)),
    on_log=on_log,
  )
  if log.reference.note:
    writer.print(log.reference.note)
  return log


class _Progress(NamedTuple):
  """Where the steps stopped: the state, its step, the newest step saved, and whether a
  preemption stopped them (after saving that step)."""

  state: Any
  step: int
  last_saved: Optional[int]
  preempted: bool


def _train_steps(built: _Built, task_data: TaskData, held: _Held, log: _TrainLog) -> _Progress:
  """Trains from the state's step to the stop step, saving and evaluating on the way."""
  train, setup, train_step, rng = built.spec.train, built.setup, built.train_step, built.rng
  state, checkpointer, writer, lock = built.state, held.checkpointer, held.writer, held.lock
  preemption = held.preemption
  stop = train.stop_step
  step = int(jax.device_get(state.step))
  last_saved = checkpointer.latest_step()
  rng_data = jax.random.key_data(rng)
  # Batches go onto the devices ahead of their step; checkpoints save the position after the
  # last batch trained on (prefetch.py: a grain iterator, so imported here, where the 'train'
  # extra is needed anyway, not when the package is).
  from realformer_jax.train import prefetch  # pylint: disable=import-outside-toplevel

  batches = held.batches = prefetch.DevicePrefetcher(
    task_data.train_iter, setup.batch_sharding, depth=train.prefetch_batches
  )
  if step < stop:
    writer.print(
      f'training steps {step + 1}-{stop}: the first step is running (logged when '
      f'done, then every {train.log_every_steps})'
    )
  pending = None  # (step, device metrics) of the step dispatched last
  while step < stop:
    state, step_metrics = train_step(state, next(batches), rng)
    step += 1
    if pending is not None:  # the previous step: done by now, so this does not block
      log.record(*pending, last_checkpoint=last_saved)
    pending = (step, step_metrics)
    preempted = preemption.requested(step)
    if step % train.checkpoint_every_steps == 0 or step == stop or preempted:
      log.record(*pending, last_checkpoint=last_saved)  # never save a bad state
      pending = None
      if lock is not None:
        lock.check()  # never write beside a run that took the workdir over
      checkpointer.save(state, rng_data, batches, step=step)
      last_saved = step
    if preempted:
      writer.print(f'{preemption.signal_name}: saved a checkpoint at step {step}; exiting.')
      return _Progress(state, step, last_saved, preempted=True)
    if step % train.eval_every_steps == 0 and step != stop:
      if pending is not None:  # logged before the clock restarts: its time is training time
        log.record(*pending, last_checkpoint=last_saved)
        pending = None
      if lock is not None:
        lock.check()  # an evaluation writes events and may save the best checkpoint
      _evaluate_and_record(built.eval_step, state, task_data, setup, writer, step, held.best)
      log.restart_clock(step)  # throughput counts training time only
  return _Progress(state, step, last_saved, preempted=False)


def _finish(
  built: _Built, progress: _Progress, task_data: TaskData, held: _Held, log: _TrainLog
) -> dict[str, Any]:
  """The final evaluation, judged and summarised: `run`'s result."""
  state, step, last_saved = progress.state, progress.step, progress.last_saved
  baseline = task_data.baseline
  if held.lock is not None:
    held.lock.check()
  final = _evaluate_and_record(
    built.eval_step, state, task_data, built.setup, held.writer, step, held.best
  )
  # The last saved state is judged by no later step: its evaluation goes through the guard.
  divergence.check_final_eval(step, final['eval/loss'], last_saved, log.reference)
  held.writer.print(built.spec.task.summary(final, baseline, step))
  return {
    **{k: float(v) for k, v in final.items()},
    'step': step,
    'baseline': next(iter(baseline.values())),
    **{f'baseline/{k}': float(v) for k, v in baseline.items()},
    'preempted': False,
  }


def _close_all(*closers: Optional[Callable[[], None]]) -> None:
  first_error = None
  for close in closers:
    if close is None:
      continue
    try:
      close()
    except Exception as e:  # pylint: disable=broad-except
      first_error = first_error or e
  if first_error is not None:
    raise first_error


def _restore_or_init(
  setup: build.TrainSetup, checkpointer: Checkpointer, train_iter, writer: MetricWriter
):
  """(state, rng) from the newest checkpoint that restores (moving `train_iter` to its
  position; damaged steps are set aside, checkpointing.py), or new."""
  abstract_key_data = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=setup.replicated)
  restored = checkpointer.restore_latest(setup.layout.abstract, abstract_key_data, train_iter)
  if restored is None:
    # Made by a jitted function: a replicated array that spans every process's devices.
    init_rng, rng = jax.jit(
      lambda seed: tuple(jax.random.split(jax.random.key(seed))), out_shardings=setup.replicated
    )(setup.spec.train.seed)
    state = setup.init_state(init_rng)
    # AdamW's moments start at zero whatever the parameters: only the parameters change.
    return state.replace(params=setup.task.initial_params(state.params, setup)), rng
  step, state, key_data = restored
  writer.print(f'resumed from the checkpoint at step {step} in {checkpointer.directory}')
  return state, jax.random.wrap_key_data(key_data)


def evaluate(
  eval_step, state, eval_batches, setup: build.TrainSetup, eval_context: Any = None
) -> dict[str, float]:
  """The task's eval metrics ('eval/...') over one pass of the eval batches: sums added on
  the device, per-row outputs (if the task has any) concatenated on the host, scored with
  `eval_context` (TaskData.eval_context: what the task's metrics need from its data)."""
  totals, outputs = None, []
  for batch in eval_batches:
    sums, rows = eval_step(state, build.global_batch(batch, setup.batch_sharding))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    if rows:
      outputs.append(jax.device_get(rows))
  concatenated = {
    name: np.concatenate([rows[name] for rows in outputs])
    for name in (outputs[0] if outputs else {})
  }
  return prefixed(
    setup.task.eval_metrics(jax.device_get(totals), concatenated, eval_context), 'eval'
  )


def _evaluate_and_record(
  eval_step,
  state,
  task_data: TaskData,
  setup: build.TrainSetup,
  writer: MetricWriter,
  step: int,
  best: Optional[BestCheckpoint],
) -> dict[str, float]:
  """Evaluates, writes scalars and a console line, and offers the state to `best`."""
  baseline = task_data.baseline
  eval_metrics = evaluate(eval_step, state, task_data.eval_batches, setup, task_data.eval_context)
  writer.scalars(
    step, dict(eval_metrics, **{f'eval/baseline_{name}': value for name, value in baseline.items()})
  )
  unprefixed = {name.split('/', 1)[1]: value for name, value in eval_metrics.items()}
  writer.print(
    f'eval  step {step}: loss {eval_metrics["eval/loss"]:.4f} | '
    f'{setup.task.eval_log_fields(unprefixed, baseline)}'
  )
  if best is not None:
    best.offer(step, state, eval_metrics)
  return eval_metrics


# Metrics out: TensorBoard event files (tensorboardX's record format, no TensorFlow), console
# lines, and a reader for the event files (`read_scalars`) that needs neither TensorFlow nor
# tensorboard. Only process 0 writes; other processes get a writer that does nothing. Events are
# written and flushed in the calling thread, in the order logged, so a write error (a full disk)
# is a one-line TrainingError naming the directory. tensorboardX's SummaryWriter hands events to
# a background thread through a 10-event queue instead: when that thread dies on a write error,
# the call that finds the queue full blocks forever (seen on a full 1 MiB tmpfs).


class _TrainLog:
  """Host side of the train metrics: finiteness check, sums per log interval, output."""

  def __init__(
    self,
    writer: MetricWriter,
    spec: RunSpec,
    start_step: int,
    stop_step: int,
    reference: divergence.LossReference,
    on_log: Optional[Callable[[int, int, dict], None]] = None,
  ):
    self._on_log = on_log
    self.reference = reference
    self._task = spec.task
    self._writer = writer
    self._every = spec.train.log_every_steps
    self._start = start_step
    self._stop = stop_step
    self._sums: Optional[dict] = None
    self._throughput = Throughput(spec.task.tokens_per_step(spec), start_step, stop_step)

  def restart_clock(self, step: int) -> None:
    self._throughput.restart(step)

  def record(self, step: int, device_metrics: dict, last_checkpoint: Optional[int]) -> None:
    values = jax.device_get(device_metrics)
    task = self._task
    loss = float(values[task.loss_sum]) / max(float(values[task.weight]), 1.0)
    # Before any save: also a finite explosion, whose state must not become a resume point.
    divergence.check_finite(step, loss, values, last_checkpoint, self.reference)
    self._sums = add_sums(self._sums, values, task.sum_metrics)
    # Also the run's first step: a big model on a small machine shows its ETA at once.
    if step % self._every and step != self._stop and step != self._start + 1:
      return
    # The run's first step is slower than the rest (first execution, allocations, the input
    # pipeline filling): its time is said as such, and throughput and ETA come from the steps
    # after it (the clock restarts at every log point).
    first = step == self._start + 1 and step != self._stop
    first_seconds = self._throughput.elapsed() if first else 0.0
    tokens_per_sec, seconds_left = self._throughput.update(step)
    train_metrics = task.train_metrics(self._sums)
    scalars = prefixed(train_metrics, 'train')
    scalars.update(
      {
        'train/learning_rate': float(values['learning_rate']),
        'train/grad_norm': float(values['grad_norm']),
      }
    )
    if not first:
      scalars['train/tokens_per_sec'] = tokens_per_sec
    if 'layer_grad_norms' in values:
      scalars.update(diagnostics.flatten_metrics(values['layer_grad_norms'], 'train/grad_norm'))
    self._sums = None
    self._writer.scalars(step, scalars)
    if self._on_log is not None:
      self._on_log(step, self._stop, scalars)
    fields = task.log_fields(train_metrics)
    speed = (
      f'first step {format_duration(first_seconds)} (warm-up: ETA from the steps after it)'
      if first
      else f'{tokens_per_sec:,.0f} tok/s | ETA {format_duration(seconds_left)}'
    )
    self._writer.print(
      f'step {step:>{len(str(self._stop))}}/{self._stop} | loss {scalars["train/loss"]:.4f} | '
      f'{fields + " | " if fields else ""}lr {scalars["train/learning_rate"]:.2e} | '
      f'grad {scalars["train/grad_norm"]:.2f} | {speed}'
    )


# tensorboardX's package __init__ imports its SummaryWriter, which imports torch where torch is
# installed (the `torch` extra), only to accept torch tensors: ~5 s of CPU at the start of every
# training run (measured), for a writer this module does not use. Whichever of these is used
# first imports the package, so each hides torch.
_NO_TORCH = ('torch',)
event_file_writer = extras.lazy('tensorboardX.event_file_writer', _NO_TORCH)
event_pb2 = extras.lazy('tensorboardX.proto.event_pb2', _NO_TORCH)
summary_pb2 = extras.lazy('tensorboardX.proto.summary_pb2', _NO_TORCH)


class MetricWriter:
  """Scalars to `<workdir>/tensorboard` and a console line; silent unless `enabled`."""

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._directory = os.path.join(workdir, TENSORBOARD)
    self._events = None
    if enabled:
      # One file per run (the pid keeps two runs started in the same second apart).
      self._events = self._guarded(lambda: _events_writer(self._directory))

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    if self._events is None:
      return
    summary = summary_pb2.Summary(
      value=[
        summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
        for tag, value in values.items()
      ]
    )
    event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
    self._guarded(lambda: (self._events.write_event(event), self._events.flush()))

  def print(self, line: str) -> None:
    if self.enabled:
      print(line, flush=True)

  def close(self) -> None:
    if self._events is not None:
      events, self._events = self._events, None
      try:
        events.close()
      except OSError:
        pass  # what was flushed is on disk; a full disk was reported by the write that failed

  def _guarded(self, write):
    try:
      return write()
    except OSError as e:
      free = shutil.disk_usage(self._directory).free if os.path.isdir(self._directory) else 0
      raise TrainingError(
        f'writing TensorBoard events to {self._directory} failed: '
        f'{e.strerror or e} ({free:,} bytes free); fix that and rerun '
        '(training resumes from its last checkpoint)'
      ) from None


def _events_writer(directory: str) -> event_file_writer.EventsWriter:
  os.makedirs(directory, exist_ok=True)
  return event_file_writer.EventsWriter(
    os.path.join(directory, 'events'), filename_suffix=f'.{os.getpid()}'
  )


class Throughput:
  """Tokens per second and time left, measured between log points."""

  def __init__(self, tokens_per_step: int, start_step: int, stop_step: int):
    self.tokens_per_step = tokens_per_step
    self.stop_step = stop_step
    self.restart(start_step)

  def restart(self, step: int) -> None:
    self._step, self._time = step, time.perf_counter()

  def elapsed(self) -> float:
    """Seconds since the clock last (re)started."""
    return time.perf_counter() - self._time

  def update(self, step: int) -> tuple[float, float]:
    """(tokens/s, seconds left) since the previous call."""
    now = time.perf_counter()
    seconds_per_step = (now - self._time) / max(step - self._step, 1)
    self._step, self._time = step, now
    return self.tokens_per_step / seconds_per_step, seconds_per_step * (self.stop_step - step)


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} from every event file under `logdir`, in write order.

  Parses the TFRecord framing (length, crc, payload, crc) and the Event protos directly.
  """
  scalars: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)
  paths = sorted(glob.glob(os.path.join(logdir, '**', '*tfevents*'), recursive=True))
  for path in paths:
    for record in _records(path):
      event = event_pb2.Event.FromString(record)
      for value in event.summary.value:
        if value.HasField('simple_value'):
          scalars[value.tag].append((event.step, value.simple_value))
  return dict(scalars)


def _records(path: str):
  with open(path, 'rb') as f:
    while header := f.read(12):
      (length,) = struct.unpack('<Q', header[:8])
      payload = f.read(length)
      f.read(4)  # payload crc
      if len(payload) < length:  # truncated tail of a file still being written
        return
      yield payload


def add_sums(total: Optional[dict], new: Mapping[str, float], keys) -> dict:
  total = dict(total or {k: 0.0 for k in keys})
  for k in keys:
    total[k] += float(new[k])
  return total


# Processes: multi-process start-up (the preemption notice: preemption.py).


def initialize_processes(dist: ml_collections.ConfigDict) -> None:
  """jax.distributed.initialize from the config (or the cluster environment); a no-op for one
  process. Must run before anything touches a device."""
  if jax.distributed.is_initialized():
    return
  if dist.auto_detect:
    jax.distributed.initialize()
  elif dist.num_processes > 1:
    jax.distributed.initialize(
      coordinator_address=dist.coordinator_address,
      num_processes=dist.num_processes,
      process_id=dist.process_id,
    )

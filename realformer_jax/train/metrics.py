"""Metrics out: TensorBoard event files (tensorboardX's record format, no TensorFlow), console
lines, and a reader for the event files (`read_scalars`) that needs neither TensorFlow nor
tensorboard.

Only process 0 writes; other processes get a writer that does nothing. Events are written and
flushed in the calling thread, in the order logged, so a write error (a full disk) is a
one-line TrainingError naming the directory. tensorboardX's SummaryWriter hands events to a
background thread through a 10-event queue instead: when that thread dies on a write error, the
call that finds the queue full blocks forever (seen on a full 1 MiB tmpfs).
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
import struct
import time
from typing import Mapping, Optional

from realformer_jax import extras, workdir_layout
from realformer_jax.train.errors import TrainingError

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
    self._directory = os.path.join(workdir, workdir_layout.TENSORBOARD)
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

  def update(self, step: int) -> tuple[float, float]:
    """(tokens/s, seconds left) since the previous call."""
    now = time.perf_counter()
    seconds_per_step = (now - self._time) / max(step - self._step, 1)
    self._step, self._time = step, now
    return self.tokens_per_step / seconds_per_step, seconds_per_step * (self.stop_step - step)


def format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f'{hours}h{rest // 60:02d}m' if hours else f'{rest // 60}m{rest % 60:02d}s'


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

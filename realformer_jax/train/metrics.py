"""Metrics out: TensorBoard event files (tensorboardX, no TensorFlow), console lines, and a
reader for the event files (`read_scalars`) that needs neither TensorFlow nor tensorboard.

Only process 0 writes; other processes get a writer that does nothing.
"""

from __future__ import annotations

import collections
import glob
import os
import struct
import time
from typing import Mapping, Optional

from tensorboardX import SummaryWriter
from tensorboardX.proto import event_pb2


class MetricWriter:
  """Scalars to `<workdir>/tensorboard` and a console line; silent unless `enabled`."""

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._writer = SummaryWriter(os.path.join(workdir, 'tensorboard')) if enabled else None

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    if self._writer is None:
      return
    for tag, value in values.items():
      self._writer.add_scalar(tag, float(value), step)
    self._writer.flush()

  def print(self, line: str) -> None:
    if self.enabled:
      print(line, flush=True)

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()


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

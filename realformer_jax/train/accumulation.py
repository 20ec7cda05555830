"""`train.grad_accum_steps='auto'`: the fewest microbatches whose compiled step fits the device.

The global batch is the recipe (the paper's 512 sequences); how many microbatches it is split
into is an implementation detail that changes only float summation order. 'auto' compiles the
train step for candidate accumulation counts A (each dividing the per-device batch) and reads
XLA's buffer assignment (`compiled.memory_analysis()`):

    need(A) = arguments + outputs - aliased (the donated state) + temporaries

and keeps the smallest A with need(A) <= budget, where the budget is
`train.device_memory_bytes` (or the device's own limit from `memory_stats()`, or the host's
available memory divided among its CPU devices; or, compiling for an accelerator this host does
not have, the target's memory: realformer_jax/aot) times `train.memory_fraction`. A candidate
that XLA:TPU refuses to compile because it exceeds the HBM counts as not fitting. If even one
sequence per device does not fit, each layer is rematerialised (`remat_policy='full'`) and the
search repeats; if that does not fit either, a one-line ConfigError names the bytes needed and
available, before any parameter is allocated.

need(A) falls as A grows (smaller microbatches), so the search probes: A = 1; the largest A (one
sequence per device); then the A an affine fit of need against microbatch size predicts, and its
neighbours until the boundary is found. Every probe is a real compilation, and the chosen step is
returned compiled, so training reuses it. This module is the only place 'auto' is resolved: the
step builders (build.py, step.py) take a concrete count.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Optional, Sequence, Union

import jax
import ml_collections

from realformer_jax.config import ConfigError
from realformer_jax.train import build
from realformer_jax.train.config import AUTO, RunSpec, validate_config
from realformer_jax.train.task import Task
from realformer_jax.units import GiB


@dataclasses.dataclass(frozen=True)
class Resolved:
  spec: RunSpec  # with an int grad_accum_steps (and maybe remat_policy 'full')
  setup: build.TrainSetup
  compiled: jax.stages.Compiled  # the train step at that accumulation
  need_bytes: Optional[int] = None  # memory the chosen step needs ('auto' only)
  budget_bytes: Optional[int] = None


def step_memory_bytes(compiled: jax.stages.Compiled) -> int:
  """Device bytes a compiled step needs: live arguments and outputs (donated state counted
  once) plus XLA's temporaries."""
  m = compiled.memory_analysis()
  return (
    m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  )


_UNITS = {'': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}


def out_of_memory_bytes(error: Exception) -> Optional[int]:
  """The bytes a compilation that ran out of device memory says it needed, or None if `error`
  is something else. XLA:TPU does not compile a program larger than the HBM ('RESOURCE_EXHAUSTED:
  ... required for HLO temporaries (21.36G) exceeds available HBM (15.75G)'); the GPU and CPU
  compilers return a program whose memory_analysis() says so."""
  message = str(error)
  if 'RESOURCE_EXHAUSTED' not in message:
    return None
  match = re.search(r'\((\d+(?:\.\d+)?)([KMGT]?)i?B?\)', message)
  return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


def _host_available_bytes() -> int:
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


def memory_budget(train) -> tuple[int, str]:
  """(bytes one device may use, where that figure came from), for this host's devices."""
  if train.device_memory_bytes > 0:
    capacity, source = int(train.device_memory_bytes), 'train.device_memory_bytes'
  else:
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if stats.get('bytes_limit'):
      capacity, source = int(stats['bytes_limit']), f'{device.platform} memory_stats'
    else:  # CPU: the devices share the host's memory
      capacity = _host_available_bytes() // jax.local_device_count()
      source = f'available host memory / {jax.local_device_count()} device(s)'
  return int(capacity * train.memory_fraction), (
    f'{source}: {capacity / GiB:.2f} GiB x memory_fraction {train.memory_fraction}'
  )


def _per_device_batch(spec: RunSpec, devices: Optional[Sequence[Any]]) -> int:
  device_count = jax.device_count() if devices is None else len(devices)
  return spec.train.global_batch_size // spec.data_parallel_size(device_count)


def _with(spec: RunSpec, accum: int, remat_policy: str) -> RunSpec:
  return spec.replace(
    train=spec.train.replace(grad_accum_steps=accum),
    model=spec.model.replace(remat_policy=remat_policy),
  )


def compile_train_step(
  config: Union[ml_collections.ConfigDict, RunSpec], task: Optional[Task] = None
) -> jax.stages.Compiled:
  """The compiled train step of a spec, or of a config (validated here for `task`, default the
  default task), on this host's devices, with 'auto' accumulation resolved:
  `compile_train_step(config).memory_analysis()`."""
  spec = (
    config
    if isinstance(config, RunSpec)
    else validate_config(
      config, task=task, device_count=jax.device_count(), process_count=jax.process_count()
    )
  )
  return resolve(spec, log=lambda _: None).compiled


def resolve(
  spec: RunSpec,
  log: Callable[[str], None] = print,
  devices: Optional[Sequence[Any]] = None,
  budget: Optional[tuple[int, str]] = None,
) -> Resolved:
  """The spec with a concrete accumulation, its setup and its compiled train step.

  `devices` (default: all) are those the step is compiled for; `budget` is (bytes per device,
  description), default `memory_budget(spec.train)` of this host's devices. Both are for
  compiling for devices this host does not have (an accelerator topology)."""
  budget, source = budget or memory_budget(spec.train)
  if spec.train.grad_accum_steps != AUTO:
    setup = build.make_setup(spec, devices, budget)
    return Resolved(spec, setup, build.compile_train_step(setup))

  per_device = _per_device_batch(spec, devices)
  # Accumulation counts that split every device's rows evenly, ascending.
  candidates = [a for a in range(1, per_device + 1) if per_device % a == 0]
  policies = [spec.model.remat_policy] + (['full'] if spec.model.remat_policy != 'full' else [])
  for policy in policies:
    probes: dict[int, tuple[build.TrainSetup, jax.stages.Compiled, int]] = {}

    def need(accum: int, policy=policy, probes=probes) -> int:
      if accum not in probes:
        setup = build.make_setup(_with(spec, accum, policy), devices, budget)
        try:
          compiled = build.compile_train_step(setup)
          probes[accum] = (setup, compiled, step_memory_bytes(compiled))
        except jax.errors.JaxRuntimeError as e:  # XLA:TPU refuses a program that cannot fit
          required = out_of_memory_bytes(e)
          if required is None:
            raise
          # Never chosen, whatever the budget says: the device cannot hold it.
          probes[accum] = (setup, None, max(required, budget + 1))
      return probes[accum][2]

    chosen = _smallest_fitting(candidates, need, budget, per_device)
    if chosen is None:
      smallest = need(candidates[-1])
      if policy != policies[-1]:
        log(
          f"grad_accum_steps='auto': one sequence per device needs {smallest / GiB:.2f} GiB "
          f"> {budget / GiB:.2f} GiB with remat_policy='{policy}'; trying 'full'"
        )
        continue
      raise ConfigError(
        f"train.grad_accum_steps='auto': even one sequence per device does not fit: the step "
        f"needs {smallest:,} bytes ({smallest / GiB:.2f} GiB, remat_policy='{policy}'), the "
        f'device has {budget:,} ({source}); use more devices, FSDP (mesh.shape=(1,-1,1)), a '
        f'shorter data.max_len or a smaller model'
      )
    setup, compiled, chosen_need = probes[chosen]
    log(
      f"grad_accum_steps='auto': {chosen} microbatch(es) of {per_device // chosen} "
      f"sequence(s) per device, remat_policy='{policy}': the step needs "
      f'{chosen_need / GiB:.2f} GiB of {budget / GiB:.2f} GiB ({source}); '
      f'{len(probes)} compilation(s) probed'
    )
    return Resolved(setup.spec, setup, compiled, need_bytes=chosen_need, budget_bytes=budget)
  raise AssertionError('unreachable: the last policy either fits or raises')


def _smallest_fitting(
  candidates: list[int], need: Callable[[int], int], budget: int, per_device: int
) -> Optional[int]:
  """The smallest candidate A with need(A) <= budget (need falls as A grows), or None."""
  if need(candidates[0]) <= budget:
    return candidates[0]
  if need(candidates[-1]) > budget:
    return None
  # Affine in the microbatch size m = per_device / A: need = base + slope * m.
  m_low, m_high = per_device // candidates[-1], per_device // candidates[0]
  slope = (need(candidates[0]) - need(candidates[-1])) / max(m_high - m_low, 1)
  base = need(candidates[-1]) - slope * m_low
  predicted = [a for a in candidates if base + slope * (per_device // a) <= budget]
  index = candidates.index(predicted[0]) if predicted else len(candidates) - 1
  # Walk to the boundary: candidates[index] fits and candidates[index - 1] does not.
  while need(candidates[index]) > budget:
    index += 1
  while index > 0 and need(candidates[index - 1]) <= budget:
    index -= 1
  return candidates[index]

"""Does the training loop keep the device busy? Loop tokens/s against the bare train step's.

  python -m benchmarks.loop                                   # configs/tiny.py, 3 rounds
  python -m benchmarks.loop --config=configs/bert.py:size=small,ln=realformer --steps=30

The bare step is the loop's own compiled step (same config, same state layout) called back to
back on one batch already on the device: no data pipeline, no host transfers, no metric pulls,
no checkpoints; its tokens/s is the ceiling. The loop is `train.train_and_evaluate` as
`experiments.train` runs it (real data, device prefetch, metrics pulled one step late, a
checkpoint at the end), its tokens/s read from its own log (TensorBoard `train/tokens_per_sec`,
measured between log points, so compilation and evaluation are excluded). Rounds alternate
bare and loop, so slow phases of a shared machine hit both; the ratio is per round, median
reported. Target: loop >= 0.95 x bare.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import jax

from realformer_jax import data, train
from realformer_jax.commands import cli
from realformer_jax.train import build, memory

TARGET = 0.95


def load_config(spec: str):
  """'configs/bert.py:size=small' -> that file's get_config(arg), as --config=... does (a
  shipped config by its docs' path or its name: commands/cli.py)."""
  path, _, arg = cli.shipped_path(spec).partition(':')
  module_spec = importlib.util.spec_from_file_location('benchmark_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _apply(config, overrides: list[str]):
  for item in overrides:
    key, _, value = item.partition('=')
    section, field = key.split('.')
    current = config[section][field]
    config[section][field] = type(current)(value) if current is not None else value
  return config


def bare_tokens_per_sec(config, steps: int) -> float:
  """The compiled train step alone, `steps` times on one device-resident batch."""
  spec = train.validate_config(config)
  resolved = build.resolve(spec, memory.memory_budget(spec.train), log=lambda _: None)
  spec, setup, step_fn = resolved.spec, resolved.setup, resolved.compiled
  key = jax.random.key(spec.train.seed)
  state = setup.init_state(key)
  host_batch = next(
    data.make_train_iterator(spec.data, spec.train.global_batch_size, spec.train.seed)
  )
  batch = build.global_batch(host_batch, setup.batch_sharding)
  rng = jax.device_put(key, setup.replicated)
  state, metrics = step_fn(state, batch, rng)  # warm-up
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = step_fn(state, batch, rng)
  jax.block_until_ready((state, metrics))
  seconds = time.perf_counter() - start
  return steps * spec.train.global_batch_size * spec.data.max_len / seconds


def loop_tokens_per_sec(config, steps: int, log_every: int) -> float:
  """train_and_evaluate's own throughput over `steps` steps after a warm-up interval."""
  with tempfile.TemporaryDirectory() as workdir:
    run_config = config.copy_and_resolve_references()
    run_config.train.num_train_steps = steps + log_every
    run_config.train.warmup_steps = min(run_config.train.warmup_steps, steps)
    run_config.train.log_every_steps = log_every
    run_config.train.eval_every_steps = steps + log_every  # only the final evaluation
    run_config.train.checkpoint_every_steps = steps + log_every
    run_config.data.eval_batches = 1
    train.train_and_evaluate(run_config, workdir)
    logged = train.read_scalars(workdir)['train/tokens_per_sec']
  # Drop the first-step line and the first interval (it includes the first step's dispatch).
  intervals = [value for step, value in logged if step > log_every]
  return statistics.median(intervals)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='configs/tiny.py')
  parser.add_argument('--steps', type=int, default=60, help='timed steps per measurement')
  parser.add_argument('--log_every', type=int, default=10, help='loop log interval')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('overrides', nargs='*', help="config overrides 'section.field=value'")
  args = parser.parse_args(argv)
  config = _apply(load_config(args.config), args.overrides)
  print(
    f'device: {jax.devices()[0].device_kind} x {jax.device_count()} | config {args.config} '
    f'{" ".join(args.overrides)} | batch {config.train.global_batch_size} x '
    f'{config.data.max_len} | {args.steps} steps per measurement, {args.rounds} rounds',
    flush=True,
  )
  ratios, bare, loop = [], [], []
  for round_index in range(args.rounds):
    bare.append(bare_tokens_per_sec(config, args.steps))
    loop.append(loop_tokens_per_sec(config, args.steps, args.log_every))
    ratios.append(loop[-1] / bare[-1])
    print(
      f'round {round_index + 1}: bare step {bare[-1]:,.0f} tok/s | loop {loop[-1]:,.0f} '
      f'tok/s | loop / bare {ratios[-1]:.3f}',
      flush=True,
    )
  ratio = statistics.median(ratios)
  status = 'PASS' if ratio >= TARGET else 'MISS'
  each = ', '.join(f'{r:.3f}' for r in ratios)
  print(
    f'loop / bare step tokens/s: median {ratio:.3f} (rounds {each}), target >= {TARGET}: {status}',
    flush=True,
  )
  return {'bare': bare, 'loop': loop, 'ratios': ratios, 'ratio': ratio, 'status': status}


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  main(sys.argv[1:])

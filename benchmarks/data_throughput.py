"""How fast a file corpus is prepared, and how fast the training loader feeds batches from it.

  python -m benchmarks.data_throughput            # 8 MB and 32 MB corpora (~2 min on 2 cores)
  python -m benchmarks.data_throughput --quick    # 1 MB and 4 MB
  python -m benchmarks.data_throughput --workers=1,2,4   # the larger corpus at more workers

The corpus is the embedded bible_web text (its train chapters) written as `.txt` files,
repeated to the size asked for; the tokenizer is the 8k unigram SentencePiece model trained on
it (`data.vocab_file`, so no training is timed). Figures:

* SentencePiece's raw encode speed on the same documents, one thread and all threads (the
  ceiling of any preparation);
* preparation (experiments.prepare_data's `prepare`: read the files into the document store,
  encode, pack, build the eval sequences) in a fresh process per corpus size: its MB/s of source
  text and its peak RSS, at two sizes (memory must stay flat as the corpus grows), and the
  larger one again at each `--workers` count (`prepare_data --workers`: the files are read by
  that many processes; "read" is that pass alone, up to the document stores and tokenizer);
* the training loader (`make_train_iterator`, masking included, one process, grain's in-process
  reader thread, `worker_count=0`): tokens/s, and how many such workers would feed
  1.3 M tokens/s (an 8-GPU host at BERT-Large's ~160 k tokens/s per H100).

Targets are printed as PASS / MISS lines; nothing fails because the machine is slow or busy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks.report import machine_info

TOKENS_PER_SECOND_TO_FEED = 1.3e6  # an 8 x H100 host training BERT-Large
HOST_CORES = 16
PREPARE_TARGET = 0.5  # of SentencePiece's one-thread encode speed, per worker


def write_corpus(directory: str, megabytes: float, texts: list[str]) -> tuple[str, str, int]:
  """train-*.txt files of ~1 MB each, about `megabytes` in all (the texts cycled), and
  eval.txt; returns (train glob, eval file, train bytes)."""
  os.makedirs(directory, exist_ok=True)
  target, written, index, file_index = megabytes * 1e6, 0, 0, 0
  while written < target:
    parts, size = [], 0
    while size < min(1e6, target - written):
      parts.append(texts[index % len(texts)])
      size += len(parts[-1].encode()) + 2
      index += 1
    with open(os.path.join(directory, f'train-{file_index:04d}.txt'), 'w') as f:
      f.write('\n\n'.join(parts) + '\n\n')
    written += size
    file_index += 1
  with open(os.path.join(directory, 'eval.txt'), 'w') as f:
    f.write('\n\n'.join(texts[:20]))
  return os.path.join(directory, 'train-*.txt'), os.path.join(directory, 'eval.txt'), written


def data_config(train_files: str, eval_files: str, vocab_file: str, data_dir: str):
  from realformer_jax import data  # pylint: disable=import-outside-toplevel

  config = data.default_data_config()
  config.update(
    train_files=train_files, eval_files=eval_files, vocab_file=vocab_file, data_dir=data_dir
  )
  return config


def child_prepare(args_json: str) -> None:
  """In a fresh process: prepare, print seconds (the reading pass's too) and peak RSS as JSON."""
  from realformer_jax.data import preparation  # pylint: disable=import-outside-toplevel
  from realformer_jax.data.prepare_ahead import prepare_ahead  # pylint: disable=import-outside-toplevel

  args = json.loads(args_json)
  workers = args.pop('workers')
  config = data_config(**args)
  start = time.perf_counter()
  preparation.prepared_data(config, workers)  # reads the files; memoized for prepare()
  read_seconds = time.perf_counter() - start
  summary = prepare_ahead(config, workers)
  seconds = time.perf_counter() - start
  rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(json.dumps(dict(summary, seconds=seconds, read_seconds=read_seconds, max_rss_mb=rss_mb)))


def run_prepare(child_args: dict, num_bytes: int, workers: int) -> dict:
  """Prepares in a fresh process; prints and returns its figures."""
  out = subprocess.run(
    [sys.executable, '-m', 'benchmarks.data_throughput', '--child_prepare',
     json.dumps(dict(child_args, workers=workers))],
    capture_output=True, text=True, check=True,
  ).stdout.strip().splitlines()[-1]  # fmt: skip
  child = json.loads(out)
  mb_s = num_bytes / 1e6 / child['seconds']
  read_mb_s = num_bytes / 1e6 / child['read_seconds']
  print(
    f'prepare {num_bytes / 1e6:6.1f} MB, {workers} worker(s): {child["seconds"]:6.1f} s, '
    f'{mb_s:5.1f} MB/s (read {read_mb_s:5.1f} MB/s), {child["train_sequences"]:,} sequences, '
    f'peak RSS {child["max_rss_mb"]:.0f} MB (main process)'
  )
  return dict(child, mb_s=mb_s, read_mb_s=read_mb_s, source_mb=num_bytes / 1e6, workers=workers)


def raw_encode(tokenizer, texts: list[str], threads: int) -> float:
  """SentencePiece encode MB/s over `texts` with `threads` threads (best of 3)."""
  num_bytes = sum(len(t.encode()) for t in texts)
  best = math.inf
  for _ in range(3):
    start = time.perf_counter()
    tokenizer._sp.encode(texts, out_type=int, num_threads=threads)  # pylint: disable=protected-access
    best = min(best, time.perf_counter() - start)
  return num_bytes / 1e6 / best


def loader_tokens_per_second(config, batches: int, batch_size: int = 32) -> float:
  from realformer_jax import data  # pylint: disable=import-outside-toplevel

  iterator = data.make_train_iterator(config, batch_size, seed=0)
  for _ in range(2):
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    batch = next(iterator)
  seconds = time.perf_counter() - start
  return batches * batch['input_ids'].size / seconds


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--quick', action='store_true', help='1 MB and 4 MB corpora')
  parser.add_argument('--sizes_mb', default='', help='two corpus sizes, e.g. 8,32')
  parser.add_argument('--loader_batches', type=int, default=200)
  parser.add_argument('--workers', default='1,2', help='prepare_data --workers counts, e.g. 1,2')
  parser.add_argument('--child_prepare', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child_prepare:
    child_prepare(args.child_prepare)
    return {}
  sizes = [float(s) for s in (args.sizes_mb or ('1,4' if args.quick else '8,32')).split(',')]
  worker_counts = [int(w) for w in args.workers.split(',') if int(w) > 1]

  from realformer_jax import data  # pylint: disable=import-outside-toplevel
  from realformer_jax.data import preparation  # pylint: disable=import-outside-toplevel

  meta = machine_info()
  print(
    f'data throughput {meta["date"]} on {meta["cpu"]} x{meta["cores"]}, load avg '
    f'{meta["load_avg_start"][0]:.2f} (1 min) at start'
  )
  results: dict = {'machine': meta}
  with tempfile.TemporaryDirectory() as root:
    bible = data.default_data_config()
    bible.data_dir = os.path.join(root, 'tfds')
    prepared = preparation.prepared_data(bible)
    tokenizer = prepared.tokenizer
    texts = [
      preparation.sources.text_of(prepared.train_records[i], 'text')
      for i in range(len(prepared.train_records))
    ]
    for threads in (1, os.cpu_count()):
      mb_s = raw_encode(tokenizer, texts, threads)
      results[f'raw_encode_mb_s_{threads}_threads'] = mb_s
      print(f'SentencePiece encode, {threads} thread(s): {mb_s:6.1f} MB/s')

    config = None
    for size in sizes:
      directory = os.path.join(root, f'corpus-{size:g}mb')
      train_glob, eval_file, num_bytes = write_corpus(directory, size, texts)
      child_args = dict(
        train_files=train_glob,
        eval_files=eval_file,
        vocab_file=tokenizer.source,
        data_dir=os.path.join(root, f'cache-{size:g}mb'),
      )
      results[f'prepare_{size:g}mb'] = run_prepare(child_args, num_bytes, workers=1)
      config = data_config(**child_args)
    for workers in worker_counts:  # the larger corpus again, read by more processes
      child_args['data_dir'] = os.path.join(root, f'cache-{sizes[-1]:g}mb-{workers}workers')
      one, more = results[f'prepare_{sizes[-1]:g}mb'], run_prepare(child_args, num_bytes, workers)
      results[f'prepare_{sizes[-1]:g}mb_{workers}_workers'] = more
      print(
        f'  {workers} workers vs 1: reading {more["read_mb_s"] / one["read_mb_s"]:.2f}x, '
        f'whole preparation {more["mb_s"] / one["mb_s"]:.2f}x'
      )

    rate = loader_tokens_per_second(config, args.loader_batches)
    workers = math.ceil(TOKENS_PER_SECOND_TO_FEED / rate)
    results['loader_tokens_per_s'] = rate
    results['loader_workers_for_1.3M'] = workers
    print(
      f'loader (masking included, one process, batch 32 x 128): {rate:,.0f} tokens/s; '
      f'{workers} such workers feed {TOKENS_PER_SECOND_TO_FEED / 1e6:.1f} M tokens/s'
    )

  one_thread = results['raw_encode_mb_s_1_threads']
  largest = results[f'prepare_{sizes[-1]:g}mb']
  cores = os.cpu_count()
  per_core = largest['mb_s'] / cores
  rss = [results[f'prepare_{s:g}mb']['max_rss_mb'] for s in sizes]
  targets = [
    (
      largest['mb_s'] >= PREPARE_TARGET * one_thread,
      f'preparation {largest["mb_s"]:.1f} MB/s in one worker process (its encode may use '
      f'{cores} threads; {per_core:.1f} MB/s per core) >= {PREPARE_TARGET:.0%} of one-thread '
      f'encode ({one_thread:.1f} MB/s)',
    ),
    (
      rss[-1] <= 1.25 * rss[0],
      f'peak RSS flat in corpus size: {rss[0]:.0f} MB at {sizes[0]:g} MB, {rss[-1]:.0f} MB at '
      f'{sizes[-1]:g} MB (<= 1.25x)',
    ),
    (
      workers <= HOST_CORES,
      f'{workers} loader workers feed 1.3 M tokens/s (<= {HOST_CORES} cores of a host)',
    ),
  ]
  for ok, line in targets:
    print(f'{"PASS" if ok else "MISS"}  {line}')
  results['targets'] = [{'ok': ok, 'line': line} for ok, line in targets]
  results['load_avg_end'] = os.getloadavg()
  print(f'load avg {results["load_avg_end"][0]:.2f} (1 min) at the end')
  return results


if __name__ == '__main__':
  main()
  sys.exit(0)

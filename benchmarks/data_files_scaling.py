"""How preparation scales with the number of files: the same text as 8 to 100,000 files.

  python -m benchmarks.data_files_scaling                          # ~30 MB as 8 ... 100,000 files
  python -m benchmarks.data_files_scaling --files=8,1000,10000     # without the 100,000 row
  python -m benchmarks.data_files_scaling --mb=0.3 --files=4,40    # CI smoke (the test)
  python -m benchmarks.data_files_scaling --files=100000 --reading_only  # the estimate alone

One generated text (words drawn from the embedded corpus's frequencies, as in
benchmarks/data_throughput.py; documents of 1-4 sentences, ~250 bytes, so even 100,000 files
hold whole documents) is cut at document boundaries into N `.txt` files of about equal size,
1,000 to a folder, plus one held-out file: every N gives the same documents in the same order.
Each N is prepared end to end (tokenizer training included) with 2 workers in a fresh process
on a fresh data_dir (benchmarks.data_throughput.run_prepare); the largest N is also read with
the tokenizer given by 1 and 2 workers, timing the reading phase (start-up of the workers
included: they encode after it).
Then the reading phase alone (file_corpus.open_corpus) of the largest N, 1 and 2 workers, splits
the preparing process's CPU seconds into its serial part and its part beside the workers, and
ESTIMATES the 2-worker speed-up on 2 idle cores from them (Amdahl; `reading_estimate`): on a
loaded machine wall-clock ratios measure the load. `--reading_only` runs just that.
Printed: MB/s, the per-file overhead against the 8-file run, peak RSS (the preparing process
plus its largest worker), the time ratio of the largest N to 1,000 files, and PASS / MISS
against issue 70's targets (2 cores, 2 workers): the largest N within 1.3x of 1,000 files'
time; >= 8 MB/s end to end at 10,000 files; reading with 2 workers >= 1.6x one; peak RSS
<= 1.5 GB at every N. The corpora are built under --root (default: the system's temporary
directory), never in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import data_throughput

TARGET_RATIO_TO_1000 = 1.3
TARGET_MB_S_10000 = 8.0
TARGET_READING_SPEEDUP = 1.6
TARGET_RSS_MB = 1536
_FILES_PER_FOLDER = 1000
_SEED = 0


def write_documents(megabytes: float, words, probabilities) -> list[str]:
  """Documents of 1-4 sentences of 6-30 words, about `megabytes` in all."""
  rng = np.random.default_rng(_SEED)
  vocabulary = np.array(words, dtype=object)
  cumulative = np.cumsum(probabilities)
  mean_word_bytes = float(np.dot(probabilities, [len(w.encode()) + 1 for w in words]))
  num_words = int(megabytes * 1e6 / mean_word_bytes) + 1
  picks = vocabulary[np.searchsorted(cumulative, rng.random(num_words) * cumulative[-1])]
  ends = np.cumsum(rng.integers(6, 31, num_words // 6 + 1))
  sentences = [' '.join(s) + '.' for s in np.split(picks, ends[ends < num_words])]
  bounds = np.cumsum(rng.integers(1, 5, len(sentences)))
  bounds = [0, *bounds[bounds < len(sentences)], len(sentences)]
  return ['\n'.join(sentences[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def write_files(directory: str, documents: list[str], num_files: int) -> tuple[str, int]:
  """The documents cut into `num_files` files of about equal bytes (or documents), in order,
  1,000 to a folder; returns (their glob, their bytes)."""
  if len(documents) < num_files:
    raise SystemExit(f'{len(documents):,} documents cannot make {num_files:,} files')
  # By bytes where every file gets a document, else the same count of documents each.
  sizes = np.cumsum([len(d.encode()) + 2 for d in documents])
  cuts = np.searchsorted(sizes, np.linspace(0, sizes[-1], num_files + 1)[1:-1]) + 1
  if len(set(cuts.tolist())) < num_files - 1 or cuts.max(initial=0) >= len(documents):
    cuts = np.linspace(0, len(documents), num_files + 1).astype(int)[1:-1]
  bounds = [0, *cuts.tolist(), len(documents)]
  written = 0
  for index, (a, b) in enumerate(zip(bounds, bounds[1:])):
    folder = os.path.join(directory, f'part-{index // _FILES_PER_FOLDER:03d}')
    os.makedirs(folder, exist_ok=True)
    body = ('\n\n'.join(documents[a:b]) + '\n').encode()
    with open(os.path.join(folder, f'doc-{index:06d}.txt'), 'wb') as f:
      f.write(body)
    written += len(body)
  return os.path.join(directory, 'part-*', '*.txt'), written


def child_reading(args_json: str) -> None:
  """In a fresh process: the reading phase alone (file_corpus.open_corpus: the listing, the
  checks, the chunks read, the manifest), then its figures as JSON: wall seconds; this
  process's CPU seconds beside the workers (while jobs it gave them, the files' checks or the
  chunks' reading, are in flight: from the first job asked for to the last result) and
  outside those windows (serial: the workers wait for it); the workers' CPU seconds, less
  their start-up, measured first on a pool of the same size that runs empty jobs."""
  from realformer_jax.data import config as config_lib  # pylint: disable=import-outside-toplevel
  from realformer_jax.data import file_corpus, workers  # pylint: disable=import-outside-toplevel

  args = json.loads(args_json)
  num_workers = args.pop('workers')
  config = config_lib.data_config(data_throughput.data_config(**args))
  start_up = 0.0
  if num_workers > 1:
    list(workers.ordered_results(file_corpus.held_out_field, [''] * 2 * num_workers, num_workers))
    workers.close_all()
    start_up = _workers_cpu_seconds()
  windows = []  # [CPU seconds at the first job asked for, at the last result] per phase
  ordered_results = workers.ordered_results

  def timed(fn, jobs, count):
    jobs = list(jobs)
    if count <= 1 or len(jobs) <= 1:  # run here: serial
      yield from ordered_results(fn, jobs, count)
      return
    window = [time.process_time()] * 2
    windows.append(window)
    for result in ordered_results(fn, jobs, count):
      window[1] = time.process_time()
      yield result

  workers.ordered_results = timed
  cpu, wall = time.process_time(), time.perf_counter()
  file_corpus.open_corpus(config, args['data_dir'], num_workers)
  cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
  workers.close_all()
  beside = sum(last - first for first, last in windows)
  print(json.dumps({
    'seconds': wall, 'serial_cpu_seconds': cpu - beside, 'beside_workers_cpu_seconds': beside,
    'workers_cpu_seconds': _workers_cpu_seconds() - start_up, 'start_up_cpu_seconds': start_up,
  }))  # fmt: skip


def _workers_cpu_seconds() -> float:
  """The CPU seconds of this process's ended (joined) children."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def reading_estimate(files_glob: str, eval_file: str, root: str) -> dict:
  """The reading phase alone with 1 and 2 workers (`child_reading`), and the speed-up
  ESTIMATED for 2 idle cores from their CPU seconds (Amdahl): 1 worker takes all its CPU
  seconds; 2 workers the serial part, one worker's start-up (both start at once) and half
  of the rest (the workers' and this process's beside them)."""
  runs = {}
  for num_workers in (1, 2):
    child = dict(
      train_files=files_glob, eval_files=eval_file, workers=num_workers,
      data_dir=os.path.join(root, f'cache-reading-{num_workers}'),
    )  # fmt: skip
    out = subprocess.run(
      [sys.executable, '-m', 'benchmarks.data_files_scaling', '--child_reading', json.dumps(child)],
      stdout=subprocess.PIPE, text=True, check=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    runs[num_workers] = json.loads(out)
  one, two = runs[1], runs[2]
  one_s = one['serial_cpu_seconds'] + one['beside_workers_cpu_seconds']
  parallel = two['workers_cpu_seconds'] + two['beside_workers_cpu_seconds']
  two_s = two['serial_cpu_seconds'] + two['start_up_cpu_seconds'] / 2 + parallel / 2
  for n, run in runs.items():
    print(
      f'reading phase alone, {n} worker(s): {run["seconds"]:.2f} s wall; CPU s: preparing '
      f'process serial {run["serial_cpu_seconds"]:.2f}, beside the workers '
      f'{run["beside_workers_cpu_seconds"]:.2f}; workers {run["workers_cpu_seconds"]:.2f} '
      f'(+ start-up {run["start_up_cpu_seconds"]:.2f})',
      flush=True,
    )
  estimate = one_s / two_s
  print(
    f'ESTIMATED for 2 idle cores from CPU seconds (Amdahl; not a measurement): reading with 1 '
    f'worker {one_s:.2f} s, with 2 {two["serial_cpu_seconds"]:.2f} serial + '
    f'{two["start_up_cpu_seconds"] / 2:.2f} start-up + {parallel:.2f} / 2 = {two_s:.2f} s: '
    f'{estimate:.2f}x (measured wall clock: {one["seconds"] / two["seconds"]:.2f}x)',
    flush=True,
  )
  return {'runs': runs, 'estimated_speedup': estimate}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--mb', type=float, default=30, help='text in every corpus (MB)')
  parser.add_argument('--files', default='8,1000,10000,100000', help='file counts')
  parser.add_argument('--root', default='', help='where the corpora go (default: $TMPDIR)')
  parser.add_argument(
    '--reading_only', action='store_true',
    help='only the reading phase of the largest N, 1 and 2 workers, with the ESTIMATED speed-up',
  )  # fmt: skip
  parser.add_argument('--child_reading', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child_reading:
    child_reading(args.child_reading)
    return {}
  counts = sorted({int(n) for n in args.files.split(',')})
  import realformer_jax  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from realformer_jax.studies.machine import machine_info  # pylint: disable=import-outside-toplevel

  meta = machine_info()
  print(
    f'data files scaling {meta["date"]} on {meta["cpu"]} x{meta["cores"]}, load avg '
    f'{meta["load_avg_start"][0]:.2f} (1 min) at start',
    flush=True,
  )
  words, probabilities = data_throughput.word_table()
  documents = write_documents(args.mb, words, probabilities)
  root = tempfile.mkdtemp(prefix='data-files-scaling-', dir=args.root or None)
  results: dict = {'machine': meta, 'runs': {}}
  try:
    eval_file = os.path.join(root, 'eval.txt')
    with open(eval_file, 'w') as f:
      f.write('\n\n'.join(write_documents(0.2, words[::-1], probabilities)[:400]) + '\n')
    if args.reading_only:
      counts = counts[-1:]
    for num_files in counts:
      start = time.perf_counter()
      train, num_bytes = write_files(os.path.join(root, f'files-{num_files}'), documents, num_files)
      print(f'{num_files:,} files: {num_bytes / 1e6:.1f} MB written in '
            f'{time.perf_counter() - start:.0f} s', flush=True)  # fmt: skip
      if args.reading_only:
        results['reading_estimate'] = reading_estimate(train, eval_file, root)
        results['load_avg_end'] = os.getloadavg()
        print(f'load avg {results["load_avg_end"][0]:.2f} (1 min) at the end')
        return results
      child = dict(train_files=train, eval_files=eval_file)
      run = data_throughput.run_prepare(
        f'{num_files:,} files end to end',
        dict(child, data_dir=os.path.join(root, f'cache-{num_files}')),
        num_bytes,
        2,
      )
      run.update(files=num_files, rss_mb=run['max_rss_mb'] + run['max_worker_rss_mb'])
      results['runs'][num_files] = run
    reading_n = counts[-1]  # where reading is most of the work
    vocab_file = results['runs'][reading_n]['tokenizer']
    reading = {}
    for num_workers in (1, 2):
      reading[num_workers] = data_throughput.run_prepare(
        f'{reading_n:,} files, tokenizer given',
        dict(
          train_files=os.path.join(root, f'files-{reading_n}', 'part-*', '*.txt'),
          eval_files=eval_file,
          data_dir=os.path.join(root, f'cache-{reading_n}-given-{num_workers}'),
          vocab_file=vocab_file,
        ),
        results['runs'][reading_n]['source_mb'] * 1e6,
        num_workers,
      )
    files_glob = os.path.join(root, f'files-{reading_n}', 'part-*', '*.txt')
    results['reading_estimate'] = reading_estimate(files_glob, eval_file, root)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  return report(results, counts, reading_n, reading)


def report(results: dict, counts: list, reading_n: int, reading: dict) -> dict:
  """The table, the scaling ratios and the targets' PASS / MISS lines. The tokenizer's
  training time is shown apart (the same ~8 M-character sample at every N since its windows
  go on across files' ends; until 2026-12-07 it shrank as files got small), and CPU seconds
  beside wall time: on a shared machine they are the steadier figure."""
  runs = results['runs']
  base = runs[counts[0]]
  for run in runs.values():
    run['without_tokenizer_s'] = run['seconds'] - (run['tokenizer_seconds'] or 0.0)
  print(
    '| files | MB | end to end s | MB/s | tokenizer training s | the rest s | per-file overhead '
    '(the rest, vs the fewest files) | CPU s | peak RSS |'
  )
  print('|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
  for n in counts:
    run = runs[n]
    rest = run['without_tokenizer_s']
    overhead = (rest - base['without_tokenizer_s']) / (n - counts[0]) * 1e3 if n > counts[0] else 0
    run['per_file_ms'] = overhead
    print(
      f'| {n:,} | {run["source_mb"]:.1f} | {run["seconds"]:.1f} | {run["mb_s"]:.2f} | '
      f'{run["tokenizer_seconds"] or 0:.1f} | {rest:.1f} | {overhead:.3f} ms | '
      f'{run["cpu_seconds"]:.1f} | {run["rss_mb"]:.0f} MB |'
    )
  largest = counts[-1]
  nan = float('nan')
  ratio = runs[largest]['seconds'] / runs[1000]['seconds'] if 1000 in runs else nan
  rest_ratio = (
    runs[largest]['without_tokenizer_s'] / runs[1000]['without_tokenizer_s']
    if 1000 in runs
    else nan
  )
  speedup = reading[1]['documents_seconds'] / reading[2]['documents_seconds']
  results.update(
    ratio_to_1000=ratio, rest_ratio_to_1000=rest_ratio, reading_speedup=speedup,
    reading_files=reading_n,
  )  # fmt: skip
  print(
    f'scaling: {largest:,} files took {ratio:.2f}x the time of 1,000 end to end, '
    f'{rest_ratio:.2f}x without tokenizer training; reading {reading_n:,} files (tokenizer '
    f'given): 1 worker {reading[1]["documents_seconds"]:.1f} s, 2 workers '
    f'{reading[2]["documents_seconds"]:.1f} s = {speedup:.2f}x'
  )
  mb_s_10000 = runs[10_000]['mb_s'] if 10_000 in runs else nan
  peak = max(r['rss_mb'] for r in runs.values())
  targets = [
    (
      ratio <= TARGET_RATIO_TO_1000,
      f'{largest:,} files {ratio:.2f}x the time of 1,000 end to end (<= '
      f'{TARGET_RATIO_TO_1000:g}x; {rest_ratio:.2f}x without tokenizer training)',
    ),
    (
      mb_s_10000 >= TARGET_MB_S_10000,
      f'end to end at 10,000 files {mb_s_10000:.2f} MB/s (>= {TARGET_MB_S_10000:g})',
    ),
    (
      speedup >= TARGET_READING_SPEEDUP,
      f'reading {reading_n:,} files with 2 workers {speedup:.2f}x one '
      f'(>= {TARGET_READING_SPEEDUP:g}x)',
    ),
    (peak <= TARGET_RSS_MB, f'peak RSS {peak:.0f} MB at most (<= {TARGET_RSS_MB} MB at every N)'),
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

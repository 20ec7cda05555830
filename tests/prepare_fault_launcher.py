"""`python tests/prepare_fault_launcher.py ARGS` runs `python -m experiments.prepare_data ARGS`
with faults injected, for tests/experiments/test_prepare_data_command.py. The faults are named by
the environment variable REALFORMER_PREPARE_FAULTS, a comma-separated list of:

  append_after_hash:TEXT  the first file hashed gets TEXT appended right after its hash is
                          taken, before it is read (a log or crawl still being written); run
                          with --workers=1, so the reading happens in this process
  blocking_trainer        the tokenizer's trainer first spends ~60 s in one C call that holds no
                          GIL and checks no signal (as SentencePiece's does); it prints
                          'FAULT: trainer blocked' on stderr when it starts

Each fault is a monkeypatch at the place a real one would strike; nothing here is reachable
from the package itself.
"""

import hashlib
import os
import runpy
import signal
import sys
import time

import repo_paths

_REPO = repo_paths.REPO


def _marker(line: str) -> None:
  print(f'FAULT: {line}', file=sys.stderr, flush=True)


def _append_after_hash(text: str) -> None:
  from realformer_jax.data import file_corpus, text_files  # pylint: disable=g-import-not-at-top

  # A small file is read once and hashed from the same bytes (nothing to race): every file
  # takes the large files' path here, hashed, then read to its hashed end.
  file_corpus.SMALL_FILE_BYTES = 0
  real_hash = text_files.sha256_of_range
  appended = []

  def sha256_of_range(path, start, end):
    digest = real_hash(path, start, end)
    if not appended:
      appended.append(path)
      with open(path, 'a') as f:
        f.write(text)
      _marker(f'appended to {path}')
    return digest

  text_files.sha256_of_range = sha256_of_range


def _blocking_call(seconds: float) -> None:
  """One call into C (OpenSSL's PBKDF2, the GIL released) that lasts ~`seconds` and returns to
  Python only at its end, calibrated here."""
  start = time.perf_counter()
  hashlib.pbkdf2_hmac('sha256', b'x', b'salt', 20_000)
  per_iteration = (time.perf_counter() - start) / 20_000
  hashlib.pbkdf2_hmac('sha256', b'x', b'salt', int(seconds / max(per_iteration, 1e-9)))


def _blocking_trainer() -> None:
  from realformer_jax.data.tokenizers import sentencepiece_model  # pylint: disable=g-import-not-at-top

  trainer = sentencepiece_model.spm.SentencePieceTrainer
  real_train = trainer.train

  def train(*args, **kwargs):
    _marker('trainer blocked')
    _blocking_call(60.0)
    return real_train(*args, **kwargs)

  trainer.train = train


_FAULTS = {'append_after_hash': _append_after_hash, 'blocking_trainer': _blocking_trainer}


def main() -> None:
  # A process started in the background by a non-interactive shell inherits SIGINT ignored:
  # put Python's own handler back, as a terminal's Ctrl-C finds it.
  signal.signal(signal.SIGINT, signal.default_int_handler)
  sys.path.insert(0, _REPO)
  for fault in filter(None, os.environ.get('REALFORMER_PREPARE_FAULTS', '').split(',')):
    name, *args = fault.split(':', 1)
    _FAULTS[name](*args)
  sys.argv[0] = os.path.join(_REPO, 'experiments', 'prepare_data.py')
  runpy.run_module('experiments.prepare_data', run_name='__main__', alter_sys=True)


if __name__ == '__main__':
  main()

r"""Prepare a masked-LM corpus once, ahead of training: documents, tokenizer, packed store.

    python -m experiments.prepare_data --config=configs/tiny.py \
        --config.data.train_files='corpus/train-*.txt' --config.data.eval_files=corpus/eval.txt

Does what `experiments.train` does on first use (data/preparation.py): reads the files (or
the TFDS dataset), trains or loads the tokenizer, packs the train split into its store and
checks the eval split, under the cache locks, so a cluster job's processes find everything
ready on the shared data_dir; a corpus that training would refuse (fewer sequences than one
global batch of the config) is refused here too. `--workers=N` reads, tokenizes and packs with
N processes (default 0: every core, one process for a small corpus); the stores are the same
for every N. `--rehash` hashes every file again: otherwise a file whose path, size and
modification time are those remembered is taken as unchanged. A killed or interrupted run,
started again, reads only the file chunks it had not finished. Every phase prints a plain
progress line every few seconds and a summary; the last line says where each piece is cached
and how long each phase took (tokenizer training on its own). Quiet otherwise: TFDS's and
absl's notes show with --verbosity=0 or higher. Bad input (or a full or read-only disk) exits
with status 1 and one line `error: <message>`; Ctrl-C with status 130 and SIGTERM with 143, each
with one line, after stopping the worker processes and removing what was half-written; 0 only
when the corpus is prepared.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from realformer_jax import data
from realformer_jax.commands.cli import fail, loaded, parse_flags, start
from realformer_jax.data.prepare_ahead import prepare_ahead
from realformer_jax.train import preemption

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
flags.mark_flags_as_required(['config'])
_WORKERS = flags.DEFINE_integer(
  'workers',
  0,
  'Processes reading, tokenizing and packing at once (0: every core, one for a small corpus); '
  'the result is the same for every count.',
)
_REHASH = flags.DEFINE_bool(
  'rehash',
  False,
  "Hash every file again instead of trusting the digests remembered under each file's path, "
  'size and modification time (an edit that kept the size and restored the time is otherwise '
  'not seen).',
)


def main(argv):
  start(argv)
  if _WORKERS.value < 0:
    fail(f'--workers={_WORKERS.value}: must be at least 0 (0: every core).')
  config = loaded(_CONFIG.value)
  # What training would refuse is refused here: a corpus smaller than one global batch.
  global_batch_size = config.train.global_batch_size if 'train' in config else None
  try:
    with preemption.sigterm_unwinds():  # SIGTERM cleans up as Ctrl-C does
      summary = prepare_ahead(config.data, _WORKERS.value or None, global_batch_size, _REHASH.value)
  except data.DataError as e:
    fail(str(e))
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (preemption.Terminated)
    sigterm = isinstance(e, preemption.Terminated)
    print(
      f'interrupted ({"SIGTERM" if sigterm else "Ctrl-C"}): what was finished is kept (document '
      'shards, a trained tokenizer, a packed store); a rerun goes on from there.',
      file=sys.stderr,
    )
    sys.exit(preemption.exit_status('SIGTERM' if sigterm else 'SIGINT'))
  trained = summary['tokenizer_seconds']
  print(
    f'prepared {summary["corpus"]} in {summary["seconds"]:.1f} s '
    f'(documents and tokenizer {summary["documents_seconds"]:.1f} s, of which tokenizer '
    f'training {"%.1f s" % trained if trained is not None else "none: found or given"}; '
    f'encoding and packing {summary["packing_seconds"]:.1f} s): '
    f'{summary["train_sequences"]:,} train and {summary["eval_sequences"]:,} eval sequences of '
    f'{config.data.max_len} tokens; tokenizer {summary["tokenizer"]} '
    f'({summary["vocab_size"]} pieces); train store {summary["train_store"]}; corpus digest '
    f'{summary["corpus_digest"]}'
  )


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

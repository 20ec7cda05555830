"""The deviceless compile's ESTIMATE for one device_check timing row (run by
realformer_jax/commands/device_check.py in a subprocess: compiling for a target needs
JAX_PLATFORMS=cpu, which a process that measures on its GPU / TPU cannot set). Prints one JSON line:
{'step_s': ESTIMATED seconds, 'memory_bytes': bytes per device from the compile, ...} or {'error':
...}.

    python -m experiments.device_estimate --target=h100:1 --which=post --batch=32 \
        --seq_len=512 --dtype=bfloat16
"""

import json
import os

os.environ['JAX_PLATFORMS'] = 'cpu'  # before JAX starts: compile for the target, open nothing

from absl import app, flags  # pylint: disable=wrong-import-position

from realformer_jax.aot import fit_report, targets, train_step  # pylint: disable=wrong-import-position
from realformer_jax.bench import steps  # pylint: disable=wrong-import-position
from realformer_jax.commands.cli import parse_flags  # pylint: disable=wrong-import-position

_TARGET = flags.DEFINE_string('target', None, 'Deviceless target, e.g. h100:1.')
_WHICH = flags.DEFINE_enum('which', 'post', ['post', 'pre', 'realformer'], 'Layer-norm placement.')
_BATCH = flags.DEFINE_integer('batch', 32, 'Sequences per step.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 512, 'Sequence length.')
_DTYPE = flags.DEFINE_string('dtype', 'bfloat16', 'Compute dtype.')
flags.mark_flags_as_required(['target'])

BERT_BASE = dict(hidden=768, layers=12, heads=12, vocab=30522)


def estimate(target_spec: str, which: str, batch: int, seq_len: int, dtype: str) -> dict:
  shape = steps.Shape(
    'base', **BERT_BASE, seq_len=seq_len, batch=batch, predictions=max(1, seq_len * 15 // 100)
  )
  config = steps.train_config(shape, ln_placement=which, dtype=dtype)
  step = train_step.compile_for_target(config, targets.parse(target_spec), log=lambda _: None)
  figures = fit_report.FitReport.of(step, auto=False).figures()
  return {
    'target': target_spec,
    'step_s': figures['estimate']['seconds'],
    'memory_bytes': figures['memory']['needed'],
    'mfu': figures['estimate']['mfu'],
  }


def main(argv):
  del argv
  try:
    result = estimate(_TARGET.value, _WHICH.value, _BATCH.value, _SEQ_LEN.value, _DTYPE.value)
  except Exception as e:  # pylint: disable=broad-except
    result = {'error': f'{type(e).__name__}: {(str(e).strip().splitlines() or [""])[0][:300]}'}
  print(json.dumps(result))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

r"""A pretraining workdir as a Hugging Face directory (transformers, PyTorch, Flax).

    python -m experiments.export_hf --workdir=/tmp/realformer_tiny --out=/tmp/realformer_tiny_hf
    python -m experiments.export_hf --workdir=DIR --out=OUT --step=600

Post-LN runs become a standard BertForMaskedLM; Pre-LN, RealFormer and rotary runs ship a small
PyTorch module (load with trust_remote_code=True). What cannot be exported exactly is refused
in one line `error: ...` before anything is written (docs/interop.md). This file is
intentionally kept short: the logic lives in realformer_jax/interop/hf_export.py.
"""

from absl import app, flags, logging

from experiments.cli import fail, parse_flags
from realformer_jax import train
from realformer_jax.config import ConfigError
from realformer_jax.data import DataError
from realformer_jax.interop import hf_export
from realformer_jax.train import library_noise, pretrained, pretraining

_WORKDIR = flags.DEFINE_string('workdir', None, 'A workdir of experiments.train.')
_OUT = flags.DEFINE_string('out', None, 'Directory to write (created; files replaced).')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest intact one).')
flags.mark_flags_as_required(['workdir', 'out'])


def main(argv):
  if len(argv) > 1:
    fail(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  library_noise.quiet()
  try:
    # The architecture first: a refusal costs no checkpoint restore.
    hf_export.check_exportable(
      pretraining.validate_config(pretrained.read_config(_WORKDIR.value)).model
    )
    run = train.load_workdir(_WORKDIR.value, step=_STEP.value)
    architecture = hf_export.export(run.model_config, run.params, run.tokenizer, _OUT.value)
  except (ConfigError, DataError, train.TrainingError) as e:
    fail(str(e))
  print(f'wrote {_OUT.value}: {architecture} from {run.workdir} at step {run.step}')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

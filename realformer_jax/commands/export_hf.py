r"""A pretraining or fine-tuning workdir as a Hugging Face directory (transformers, PyTorch, Flax).

    python -m experiments.export_hf --workdir=/tmp/realformer_tiny --out=/tmp/realformer_tiny_hf
    python -m experiments.export_hf --workdir=DIR --out=OUT --step=600

Post-LN runs become a standard BertForMaskedLM; Pre-LN, RealFormer and rotary runs ship a small
PyTorch module (load with trust_remote_code=True). What cannot be exported exactly is refused
in one line `error: ...` before anything is written (docs/interop.md). The step is
exported only if its files pass their checksums; the export records what it came from (step,
checksum verdict, config digest, the corpus as the run's data state names it (the packed store),
tokenizer digest) in realformer_source.json. --out must not be a
run's directory (its config.json would be overwritten).

A fine-tuning workdir (experiments.finetune, finished) exports its best checkpoint with its head:
BertForSequenceClassification (the classes of your own files as id2label) or
BertForQuestionAnswering, or the shipped module's RealFormerFor... classes.
"""

# The logic lives in realformer_jax/interop/hf_export.py (fine-tuned runs: finetune/export.py).
from absl import app, flags

from realformer_jax import train
from realformer_jax.commands.cli import fail, parse_flags, start
from realformer_jax.config import ConfigError
from realformer_jax.data import DataError
from realformer_jax.finetune import export as finetune_export
from realformer_jax.interop import hf_export
from realformer_jax.train import pretrained, pretraining

_WORKDIR = flags.DEFINE_string('workdir', None, 'A workdir of experiments.train.')
_OUT = flags.DEFINE_string('out', None, 'Directory to write (created; files replaced).')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest intact one).')
flags.mark_flags_as_required(['workdir', 'out'])


def main(argv):
  start(argv, quiet_libraries=True)
  if finetune_export.is_finetuning_run(_WORKDIR.value):
    export_finetuned()
    return
  try:
    hf_export.check_out_dir(_OUT.value, _WORKDIR.value)
    # The architecture first: a refusal costs no checkpoint restore.
    hf_export.check_exportable(
      pretraining.validate_config(pretrained.read_config(_WORKDIR.value)).model
    )
    run = train.load_workdir(_WORKDIR.value, step=_STEP.value)  # checksums verified
    previous = hf_export.read_source(_OUT.value)
    architecture = hf_export.export(
      run.model_config, run.params, run.tokenizer, _OUT.value, source=run.identity.to_dict()
    )
  except (ConfigError, DataError, train.TrainingError, hf_export.ExportError) as e:
    fail(str(e))
  if previous.get('source') and previous['source'] != run.identity.to_dict():
    changed = '; '.join(run.identity.differences(previous['source']))
    print(f'note: replaced the export of another checkpoint in {_OUT.value} ({changed})')
  identity = run.identity
  print(
    f'wrote {_OUT.value}: {architecture} from {run.workdir} at step {run.step} (checksums '
    f'{identity.checksums.split(":")[0]}, config {identity.config_digest}, corpus '
    f'{identity.corpus}; {hf_export.SOURCE_FILE})'
  )


def export_finetuned():
  """A fine-tuning run's best checkpoint (realformer_jax/finetune/export.py)."""
  if _STEP.value is not None:
    fail(f'--step={_STEP.value}: a fine-tuning run exports its best checkpoint (leave --step out)')
  try:
    hf_export.check_out_dir(_OUT.value, _WORKDIR.value)
    run = finetune_export.load_best(_WORKDIR.value)
    architecture = hf_export.export(
      run.model_config, run.params, run.tokenizer, _OUT.value, run.source, run.labels
    )
  except (ConfigError, DataError, hf_export.ExportError) as e:
    fail(str(e))
  classes = f'; classes {", ".join(run.labels)}' if run.labels else ''
  print(
    f'wrote {_OUT.value}: {architecture} from the best checkpoint of {run.workdir} (step '
    f'{run.step}{classes}; {hf_export.SOURCE_FILE})'
  )


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

"""The commands (train, finetune, prepare_data, export_hf, translate, compile, device_check, study;
cli: what they share; scripts: the installed console scripts), run as `python -m experiments.<name>`
in a clone or `realformer-<name>` installed. The top of the house: nothing else in realformer_jax
imports them. The platform choice on a machine with accelerator plugins but no accelerator happens
when they import realformer_jax (realformer_jax/platform_choice.py), so a command's own
JAX_PLATFORMS setting, made before that import, still applies."""

import sys


def _missing_extra_in_one_line(exc_type, exc, tb, previous=sys.excepthook):
  """A missing optional dependency (realformer_jax/extras.py) ends a command with one `error:`
  line naming the extra to install, not a traceback; anything else is reported as before."""
  extras = sys.modules.get('realformer_jax.extras')  # not loaded: the error cannot be one
  if extras is not None and isinstance(exc, extras.MissingExtra):
    print(f'error: {exc}', file=sys.stderr)
  else:
    previous(exc_type, exc, tb)


sys.excepthook = _missing_extra_in_one_line

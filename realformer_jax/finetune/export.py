"""A finished fine-tuning run's best checkpoint, for experiments.export_hf: the encoder with its
head (a classifier: BertForSequenceClassification; a span extractor: BertForQuestionAnswering;
RealFormer / Pre-LN / rotary models: the shipped PyTorch module's classes), the run's tokenizer
and, for your own files, the class names as id2label.

    if is_finetuning_run(workdir):
      run = load_best(workdir)   # model config, params, tokenizer, labels, source record

The head is read from the checkpoint itself (its parameter groups), not from the task's data,
so a run exports after its labelled files have moved.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from realformer_jax import workdir_layout
from realformer_jax.config import ConfigError, ModelConfig, from_section
from realformer_jax.data import tokenizers
from realformer_jax.finetune.run import RESULTS_FILE
from realformer_jax.train import checkpointing, run_identity


@dataclasses.dataclass(frozen=True)
class Finetuned:
  workdir: str
  model_config: ModelConfig
  params: Any  # the best checkpoint's, as saved (encoder, pooler + classifier, or span)
  tokenizer: tokenizers.Tokenizer
  labels: tuple[str, ...]  # a classifier's class names in id order (your own files), else ()
  step: int  # the best checkpoint's step
  source: dict  # what the export came from (realformer_source.json)


def is_finetuning_run(workdir: str) -> bool:
  """`workdir` holds a run of experiments.finetune (its config.json has a finetune section)."""
  try:
    with open(os.path.join(workdir, workdir_layout.CONFIG_FILE)) as f:
      return 'finetune' in json.load(f)
  except (OSError, ValueError, TypeError):
    return False


def load_best(workdir: str) -> Finetuned:
  """The best checkpoint of a finished fine-tuning run (ConfigError, one line, otherwise)."""
  workdir = os.path.abspath(os.path.expanduser(workdir))
  with open(os.path.join(workdir, workdir_layout.CONFIG_FILE)) as f:
    saved = json.load(f)
  results_path = os.path.join(workdir, RESULTS_FILE)
  try:
    with open(results_path) as f:
      results = json.load(f)
  except (OSError, ValueError):
    raise ConfigError(
      f'{results_path}: missing or unreadable: the fine-tuning run has not finished (a rerun '
      'of its command resumes it); its best checkpoint is exported once it has'
    ) from None
  model_config = from_section(ModelConfig, 'model', saved['model'])
  try:
    # As saved (no target tree): the head, and a classifier's width, are the checkpoint's.
    params, step, metrics = checkpointing.restore_best_params(workdir, None)
  except FileNotFoundError as e:
    raise ConfigError(f'{e}: nothing to export') from None
  tokenizer = _tokenizer(workdir, saved['data'].get('lower_case', True))
  source = {
    'workdir': workdir,
    'step': int(step),
    'checkpoint': 'best',
    'best_eval': {k: float(v) for k, v in metrics.items()},
    'config_digest': run_identity.config_digest(saved),
    'tokenizer_digest': run_identity.tokenizer_digest(workdir),
    'starting_point': results.get('starting_point'),  # what fine-tuning started from
  }
  return Finetuned(
    workdir, model_config, params, tokenizer, tuple(results.get('labels', ())), int(step), source
  )


def _tokenizer(workdir: str, lower_case: bool) -> tokenizers.Tokenizer:
  for name in tokenizers.FILE_NAMES:
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      return tokenizers.load(path, lower_case=lower_case)
  raise ConfigError(
    f'{workdir}: no tokenizer file ({", ".join(tokenizers.FILE_NAMES)}) to export beside the model'
  )

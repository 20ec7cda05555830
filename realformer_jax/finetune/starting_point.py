"""Where fine-tuning starts: random init, a pretraining workdir, or Hugging Face BERT weights.

    source = StartingPoint.from_config(finetune) # the finetune section; reads only configs
    source.model_config(config.model)            # the checkpoint's architecture + fine-tuning
                                                 # fields; one-line ConfigError on a mismatch
    source.tokenizer(spec.data)                  # the vocabulary the checkpoint was trained with
    source.load_encoder(model_config)            # {'encoder': ..., ['pooler': ...]} weights

`finetune.init` picks the source: '' = random; a directory = a workdir of experiments.train
(its config.json says the LN placement, residual attention and sizes; its latest orbax
checkpoint, or `finetune.init_step`, holds the weights, restorable onto any mesh); a file
ending in .safetensors or .bin = Hugging Face BERT weights (`hf_convert`), with the
transformers `config.json` beside it (or `finetune.hf_config`) and, unless `data.vocab_file`
says otherwise, its `vocab.txt`. A .bin state dict needs torch (not a dependency of this
project); .safetensors needs only the `safetensors` package.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from typing import Any, Mapping, Optional

import numpy as np

from realformer_jax import data as data_lib
from realformer_jax import workdir_layout
from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.data.errors import DataError
from realformer_jax.finetune.config import FINETUNE_MODEL_FIELDS
from realformer_jax.interop import hf_convert
from realformer_jax.model import params as params_lib

RANDOM, WORKDIR, HUGGING_FACE = 'random', 'workdir', 'hugging_face'
HF_WEIGHT_SUFFIXES = ('.safetensors', '.bin')
# transformers' BertConfig defaults, for config.json files that leave a field out: BERT-Base,
# which ModelConfig's defaults are too, so they are ModelConfig's in BertConfig's names.
_HF_BERT_DEFAULTS = hf_convert.config_to_hf(ModelConfig())
# Hugging Face weights initialise RealFormer too (the paper reuses BERT's parameters).
_HF_LN_PLACEMENTS = ('post', 'realformer')


@dataclasses.dataclass(frozen=True)
class StartingPoint:
  kind: str  # RANDOM | WORKDIR | HUGGING_FACE
  path: str = ''
  step: Optional[int] = None  # workdir: the checkpoint's step (None: latest)
  hf_config_path: str = ''
  pretrain_data: Any = None  # workdir: its data section (data.DataConfig)
  checkpoint_model: Optional[ModelConfig] = None  # the architecture the weights have
  # workdir, once pinned: (SHA-256, where recorded) of the tokenizer the step was trained with
  recorded_tokenizer: Optional[tuple] = None

  @classmethod
  def from_config(cls, finetune: Any) -> 'StartingPoint':
    """From the `finetune` section (finetune.config.FinetuneConfig)."""
    init = os.path.expanduser(finetune.init)
    if not init:
      return cls(RANDOM)
    if os.path.isdir(init):
      from realformer_jax.mlm import MaskedLMTask  # pylint: disable=import-outside-toplevel
      from realformer_jax.train import config as train_config  # pylint: disable=import-outside-toplevel
      from realformer_jax.train import pretrained  # pylint: disable=import-outside-toplevel

      # A workdir to start from is a masked-LM pretraining run's.
      pretrain = train_config.validate_config(pretrained.read_config(init), task=MaskedLMTask())
      step = None if finetune.init_step == -1 else int(finetune.init_step)
      return cls(
        WORKDIR,
        os.path.abspath(init),
        step,
        pretrain_data=pretrain.data,
        checkpoint_model=pretrain.model,
      )
    if init.endswith(HF_WEIGHT_SUFFIXES):
      if not os.path.isfile(init):
        raise ConfigError(f'finetune.init={init}: no such file')
      hf_config = os.path.expanduser(finetune.hf_config) or os.path.join(
        os.path.dirname(init), 'config.json'
      )
      return cls(
        HUGGING_FACE,
        os.path.abspath(init),
        hf_config_path=hf_config,
        checkpoint_model=_read_hf_config(hf_config),
      )
    raise ConfigError(
      f'finetune.init={init}: neither a workdir of experiments.train (a '
      f'directory) nor a Hugging Face weights file ({", ".join(HF_WEIGHT_SUFFIXES)})'
    )

  def pinned(self) -> tuple['StartingPoint', Optional[dict]]:
    """This starting point with its checkpoint step fixed, and its identity (what a run
    records of where it started: run_identity.py), None for random init. A workdir's step is
    checked against its checksums (`finetune.init_step`) or is its newest intact one, so a
    fine-tuning run never starts from damaged weights, and records which step it used even when
    the pretraining run has saved newer ones since."""
    if self.kind == WORKDIR:
      from realformer_jax.train import checkpoint_record, pretrained, run_identity  # pylint: disable=import-outside-toplevel
      from realformer_jax.train.checkpointing import Checkpointer  # pylint: disable=import-outside-toplevel

      checkpointer = Checkpointer(self.path, keep=1, writer=False)
      try:
        if not checkpointer.all_steps():
          raise ConfigError(f'finetune.init={self.path}: no checkpoint to start from')
        if self.step is None:
          step = checkpointer.newest_intact_step()
        else:
          if self.step not in checkpointer.all_steps():
            raise ConfigError(
              f'finetune.init_step={self.step}: no checkpoint at that step in '
              f'{checkpointer.directory} (have {sorted(checkpointer.all_steps())})'
            )
          checkpointer.check_step(self.step)
          step = self.step
      finally:
        checkpointer.close()
      saved = pretrained.read_config_json(self.path)
      # The step says which model and tokenizer it holds: config.json must agree with it.
      recorded = checkpoint_record.verify(
        self.path, step, config_json=saved, data_dir=self.pretrain_data.data_dir
      )
      identity = run_identity.of_checkpoint(self.path, step, saved).to_dict()
      return dataclasses.replace(self, step=step, recorded_tokenizer=recorded), identity
    if self.kind == HUGGING_FACE:
      return self, {
        'weights': self.path,
        'weights_sha256': _sha256(self.path),
        'config': self.hf_config_path,
        'config_sha256': _sha256(self.hf_config_path),
      }
    return self, None

  def describe(self) -> str:
    return 'random init' if self.kind == RANDOM else self.path

  def model_config(self, model: Mapping[str, Any]) -> ModelConfig:
    """The fine-tuned model's config: the checkpoint's architecture, the fine-tuning fields
    (FINETUNE_MODEL_FIELDS) from `model` where set. A set field that differs from the
    checkpoint raises ConfigError naming both values."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    for key in model.keys():
      if key not in known:
        raise ConfigError(f'model.{key}: unknown config field')
    values = {k: v for k, v in model.items() if v is not None}
    if self.checkpoint_model is None:
      return ModelConfig(**values)
    merged = dataclasses.asdict(self.checkpoint_model)
    for name, value in values.items():
      allowed = name in FINETUNE_MODEL_FIELDS or (
        self.kind == HUGGING_FACE and name == 'ln_placement' and value in _HF_LN_PLACEMENTS
      )
      if value != merged[name] and not allowed:
        raise ConfigError(
          f'model.{name}={value!r}: the starting checkpoint {self.path} has '
          f'model.{name}={merged[name]!r} (leave model.{name} unset to take '
          f"the checkpoint's)"
        )
      merged[name] = value
    return ModelConfig(**merged)

  def tokenizer(self, data: Any) -> data_lib.Tokenizer:
    """The tokenizer of this starting point for the fine-tuning data section `data`: a
    workdir's is checked against the one its step records (pinned); `data.vocab_file` is used
    as given (run.py records it and says when it is not the checkpoint's)."""
    if data.vocab_file:
      return data_lib.tokenizers.load(data.vocab_file, lower_case=data.lower_case)
    if self.kind == WORKDIR:
      from realformer_jax.train import checkpoint_record, pretrained  # pylint: disable=import-outside-toplevel

      tokenizer = pretrained.workdir_tokenizer(self.path, self.pretrain_data)
      checkpoint_record.check_tokenizer(tokenizer, self.recorded_tokenizer, self.path)
      return tokenizer
    if self.kind == HUGGING_FACE:
      vocab = os.path.join(os.path.dirname(self.path), 'vocab.txt')
      if not os.path.isfile(vocab):
        raise DataError(
          f'{vocab}: no vocab.txt beside the Hugging Face weights; set '
          "data.vocab_file to the checkpoint's WordPiece vocabulary"
        )
      return data_lib.tokenizers.load(vocab, lower_case=data.lower_case)
    # Random init: the tokenizer pretraining on the embedded corpus would train.
    return data_lib.prepare(data_lib.DataConfig(data_dir=data.data_dir, vocab_size=data.vocab_size))

  def load_encoder(self, model_config: ModelConfig) -> dict:
    """The checkpoint's 'encoder' (and 'pooler', if it has one) in `model_config`'s layer
    layout (scan or loop); jax.Arrays (workdir) or numpy arrays (Hugging Face)."""
    if self.kind == WORKDIR:
      from realformer_jax.mlm import MaskedLMTask  # pylint: disable=import-outside-toplevel
      from realformer_jax.train import pretrained  # pylint: disable=import-outside-toplevel

      params = pretrained.load_workdir(self.path, step=self.step, task=MaskedLMTask()).params
    elif self.kind == HUGGING_FACE:
      weights = _read_hf_weights(self.path)
      # hf_convert fills the layout it is given; the weights are the same for realformer.
      try:
        params = hf_convert.from_hf_bert(weights, model_config)
      except KeyError as e:
        raise ConfigError(f'finetune.init={self.path}: not a BERT checkpoint ({e})') from None
    else:
      raise ValueError('random init has no weights to load')
    params = {k: v for k, v in params.items() if k in ('encoder', 'pooler')}
    if model_config.scan_layers:
      return params_lib.stack_layers(params)
    return params_lib.unstack_layers(params)


RECORD_FILE = 'starting_point.json'


def tokenizer_used(source: StartingPoint, data: Any) -> dict:
  """What a run's starting_point.json records of the tokenizer it fine-tunes with (the file
  and its SHA-256), warning when `data.vocab_file` is not the one the checkpoint was trained
  with (its ids then mean other pieces than in pretraining)."""
  tokenizer = source.tokenizer(data)
  recorded = source.recorded_tokenizer
  if data.vocab_file and recorded is not None and recorded[0] != tokenizer.sha256:
    from realformer_jax.train.checkpointing import warn  # pylint: disable=import-outside-toplevel

    warn(
      f'data.vocab_file={data.vocab_file} is not the tokenizer {source.path} was trained with '
      f'(SHA-256 {tokenizer.sha256[:16]}; {recorded[1]} records {recorded[0][:16]}): its ids '
      'mean other pieces than in pretraining'
    )
  return {'tokenizer_file': str(tokenizer.source), 'tokenizer_sha256': tokenizer.sha256[:16]}


def describe_start(source: StartingPoint, identity: Optional[dict]) -> str:
  """The line a fine-tuning run prints of where it starts (identity: record_or_check's)."""
  if source.kind == RANDOM or not identity:
    return 'fine-tuning from random init'
  tokenizer = f'tokenizer {identity.get("tokenizer_sha256")} ({identity.get("tokenizer_file")})'
  if source.kind == HUGGING_FACE:
    return (
      f'fine-tuning from Hugging Face weights {identity["weights"]} (SHA-256 '
      f'{identity["weights_sha256"]}, config {identity["config"]}); {tokenizer}'
    )
  return (
    f'fine-tuning from {identity["workdir"]} at step {identity["step"]} (checksums '
    f'{identity["checksums"].split(":")[0]}, config {identity["config_digest"]}, corpus '
    f'{identity["corpus"]}); {tokenizer}'
  )


def record_or_check(workdir: str, identity: Optional[dict], init_step: int) -> Optional[dict]:
  """The identity of where the fine-tuning run in `workdir` started. A new run records
  `identity` (RECORD_FILE); a resumed one (it has checkpoints) returns the recorded one, which
  its checkpoints descend from, and refuses in one ConfigError line a starting point that is
  another source (another workdir or weights file, another pretraining config or corpus, or
  another explicit finetune.init_step). With init_step -1 ('its latest') a pretraining run
  that has saved newer steps since is the same source: the resumed run keeps its own."""
  path = os.path.join(workdir, RECORD_FILE)
  has_checkpoints = any(
    name.isdigit() for name in _listdir(workdir_layout.checkpoints_dir(workdir))
  )
  recorded = None
  if os.path.exists(path):
    try:
      with open(path) as f:
        recorded = json.load(f)
    except (OSError, ValueError) as e:
      raise ConfigError(f'{path}: unreadable ({type(e).__name__}); put back a copy') from None
  if has_checkpoints and recorded is not None:
    ignore = {'step', 'checksums'} if init_step == -1 else {'checksums'}
    changed = [
      f'{k} {recorded.get(k)!r} -> {v!r}'
      for k, v in (identity or {}).items()
      # a field a record of an older version lacks (the tokenizer used) is not compared
      if k not in ignore and k in recorded and recorded.get(k) != v
    ] + (['random init -> a checkpoint'] if recorded == {} and identity else [])
    if changed or (identity is None and recorded):
      raise ConfigError(
        f'{workdir} fine-tunes from another starting point than finetune.init now names '
        f'({"; ".join(changed) or "a checkpoint -> random init"}; recorded in {path}): use a '
        'new --workdir, or the starting point it was started from'
      )
    return recorded or None
  from realformer_jax import atomic_files  # pylint: disable=import-outside-toplevel

  os.makedirs(workdir, exist_ok=True)
  atomic_files.write_json(path, identity or {})
  return identity


def _listdir(directory: str) -> list[str]:
  try:
    return os.listdir(directory)
  except OSError:
    return []


def _sha256(path: str) -> str:
  import hashlib  # pylint: disable=import-outside-toplevel

  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    while chunk := f.read(8 << 20):
      digest.update(chunk)
  return digest.hexdigest()[:16]


def _read_hf_config(path: str) -> ModelConfig:
  if not os.path.isfile(path):
    raise ConfigError(
      f'{path}: no Hugging Face config.json beside the weights; set finetune.hf_config'
    )
  try:
    with open(path) as f:
      values = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f'{path}: unreadable ({type(e).__name__}: truncated or damaged)') from None
  if values.get('model_type', 'bert') != 'bert':
    raise ConfigError(f'{path}: model_type={values["model_type"]!r}, not a BERT checkpoint')
  hf_config = types.SimpleNamespace(**dict(_HF_BERT_DEFAULTS, **values))
  try:
    return hf_convert.config_from_hf(hf_config)
  except KeyError as e:
    raise ConfigError(f'{path}: hidden_act {e} has no counterpart here') from None


def _read_hf_weights(path: str) -> dict[str, np.ndarray]:
  if path.endswith('.safetensors'):
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

    return load_file(path)
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ConfigError(
      f'finetune.init={path}: a PyTorch .bin state dict needs torch, which is '
      'not installed (or convert it to .safetensors)'
    ) from None
  state = torch.load(path, map_location='cpu', weights_only=True)
  return {
    name: tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
    for name, tensor in state.items()
  }


def place_like(loaded: Any, target: Any, path: str = 'params') -> Any:
  """`loaded` arrays as `target`'s leaves are (shape, dtype, sharding); ConfigError naming the
  first parameter whose shape differs."""
  import jax  # pylint: disable=import-outside-toplevel

  if isinstance(target, dict):
    if not isinstance(loaded, dict) or set(loaded) != set(target):
      have = sorted(loaded) if isinstance(loaded, dict) else type(loaded).__name__
      raise ConfigError(f'{path}: the checkpoint has {have}, the model needs {sorted(target)}')
    return {k: place_like(loaded[k], target[k], f'{path}/{k}') for k in target}
  if tuple(np.shape(loaded)) != tuple(target.shape):
    raise ConfigError(
      f'{path}: the checkpoint has shape {tuple(np.shape(loaded))}, the model '
      f'needs {tuple(target.shape)}'
    )
  if isinstance(loaded, jax.Array):
    return jax.jit(lambda x: x.astype(target.dtype), out_shardings=target.sharding)(loaded)
  host = np.asarray(loaded).astype(target.dtype)
  return jax.make_array_from_callback(host.shape, target.sharding, lambda index: host[index])

"""A trained masked LM as a directory that transformers loads (experiments.export_hf).

    export(model_config, params, tokenizer, out_dir)

writes
    config.json                 transformers' config
    model.safetensors           PyTorch names and layout (hf_convert.to_hf_bert)
    flax_model.msgpack          the same weights as FlaxBertForMaskedLM's tree (BERT only)
    realformer_source.json      what was exported: the run, step, checksum verdict, config and
                                corpus digests (run_identity.py), and the files written
    tokenizer.json, tokenizer_config.json, special_tokens_map.json (+ vocab.txt for WordPiece)
    configuration_realformer.py, modeling_realformer.py   (the PyTorch module, custom only)

A Post-LN encoder with a learned position table becomes a standard `BertForMaskedLM`. Pre-LN,
RealFormer (residual attention, running mean), rotary positions and t5 scaling have no
transformers class: the export ships the small PyTorch module of interop/torch_module with an
`auto_map`, loaded with `trust_remote_code=True`. Anything else is refused (`check_exportable`)
before a file is written: the allow-list below is what that module computes exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
import socket
from typing import Any, Optional

import numpy as np

from realformer_jax.config import ConfigError, ModelConfig, fields_of
from realformer_jax.data import tokenizers as tokenizer_lib
from realformer_jax.interop import hf_convert
from realformer_jax.workdir_layout import (
  CHECKPOINTS,
  CONFIG_FILE,
  LOCK_FILE,
  MANAGED_DIRS,
  RUN_MARKERS,
  STEP_RECORD,
)

TORCH_MODULE_DIR = os.path.join(os.path.dirname(__file__), 'torch_module')
TORCH_MODULE_FILES = ('configuration_realformer.py', 'modeling_realformer.py')
CUSTOM_MODEL_TYPE = 'realformer_jax'

# Model fields and the values an export reproduces exactly. Fields absent here do not change
# what the trained model computes at inference (sizes are written to config.json; dtypes,
# scan / remat / kernels, init, dropout rates are training-time choices).
EXPORTABLE = {
  'ln_placement': ('post', 'pre', 'realformer'),
  'attention_scale': ('standard', 't5'),
  'position_embedding': ('learned', 'rope', 'none'),
  'norm': ('layernorm',),
  'use_bias': (True,),
  'activation': ('gelu', 'gelu_tanh', 'relu', 'selu', 'normalized_sigmoid'),
  'residual_branch': ('plain',),
  'parameterization': ('standard',),
}
# Architecture fields the export handles itself (checked by check_exportable and
# is_standard_bert, or written to config.json), beside every field that does not change the
# function at inference (config.FIELD_CONCERNS).
_EXPORT_HANDLED = (
  'gate_schedule_steps',  # residual_branch='plain' only
  'entropy_base_len',  # attention_scale='entropy_invariant' only, which is refused
  'rope_base',  # written to config.json
  'residual_attention',  # both values are exported
  'running_mean',
)
INFERENCE_IRRELEVANT = (
  fields_of('regularisation', 'initialisation', 'execution', 'storage') + _EXPORT_HANDLED
)
_SIZES = tuple(hf_convert.HF_CONFIG_FIELDS)


def check_exportable(config: ModelConfig) -> None:
  """ConfigError (one line, naming the field) for a variant the export cannot reproduce."""
  for name, allowed in EXPORTABLE.items():
    value = getattr(config, name)
    if value not in allowed:
      raise ConfigError(
        f'model.{name}={value!r}: experiments.export_hf cannot export it exactly '
        f'(exported: {", ".join(map(repr, allowed))}; docs/interop.md)'
      )
  covered = set(EXPORTABLE) | set(INFERENCE_IRRELEVANT) | set(_SIZES)
  for field in dataclasses.fields(ModelConfig):
    if field.name not in covered:  # a field added since: refuse rather than guess
      raise ConfigError(f'model.{field.name}: experiments.export_hf does not know this field')


def is_standard_bert(config: ModelConfig) -> bool:
  """transformers' own BertForMaskedLM computes exactly this model."""
  return (
    config.ln_placement == 'post'
    and not config.use_residual_attention
    and config.position_embedding == 'learned'
    and config.attention_scale == 'standard'
    and config.activation in hf_convert.HF_ACTIVATIONS.values()
  )


def hf_config(config: ModelConfig, tokenizer: tokenizer_lib.Tokenizer) -> dict[str, Any]:
  values = hf_convert.config_to_hf(config)
  values.update(pad_token_id=tokenizer.pad_id, torch_dtype='float32')
  if is_standard_bert(config):
    return dict(values, model_type='bert', architectures=['BertForMaskedLM'])
  return dict(
    values,
    model_type=CUSTOM_MODEL_TYPE,
    architectures=['RealFormerForMaskedLM'],
    hidden_act=config.activation,  # the module's own names
    ln_placement=config.ln_placement,
    residual_attention=config.use_residual_attention,
    running_mean=config.running_mean and config.use_residual_attention,
    attention_scale=config.attention_scale,
    position_embedding=config.position_embedding,
    rope_base=config.rope_base,
    auto_map={
      'AutoConfig': 'configuration_realformer.RealFormerConfig',
      'AutoModelForMaskedLM': 'modeling_realformer.RealFormerForMaskedLM',
    },
  )


def flax_tree(torch_named: dict[str, np.ndarray]) -> dict:
  """PyTorch BertForMaskedLM names -> FlaxBertForMaskedLM's params tree (kernels [in, out],
  LayerNorm 'scale', embeddings 'embedding')."""
  tree: dict = {}
  for name, value in torch_named.items():
    *path, leaf = name.split('.')
    if leaf == 'weight':
      if 'LayerNorm' in path[-1]:
        leaf = 'scale'
      elif path[-1].endswith('_embeddings'):
        leaf = 'embedding'
      else:
        leaf, value = 'kernel', value.T
    node = tree
    for key in path:
      node = node.setdefault(key, {})
    node[leaf] = np.ascontiguousarray(value)
  return tree


def write_tokenizer(tokenizer: tokenizer_lib.Tokenizer, out_dir: str) -> None:
  """tokenizer.json (+ configs) that AutoTokenizer reads, with our ids for every piece and for
  the five special tokens; encodes '[CLS] text [SEP]' ('[CLS] a [SEP] b [SEP]' for pairs)."""
  # transformers (a dependency) and its converters: imported only when exporting.
  from tokenizers import AddedToken, decoders, pre_tokenizers, processors  # pylint: disable=import-outside-toplevel
  from transformers import BertTokenizerFast, PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

  specials = dict(
    pad_token=tokenizer_lib.PAD,
    unk_token=tokenizer_lib.UNK,
    cls_token=tokenizer_lib.CLS,
    sep_token=tokenizer_lib.SEP,
    mask_token=tokenizer_lib.MASK,
  )
  if isinstance(tokenizer, tokenizer_lib.SentencePieceTokenizer):
    # '[MASK]' takes the space before it: in training a masked word's id replaces the piece
    # that carried its space ('▁word'), so 'free [MASK]; you' is '▁free', '[MASK]', ';', ...
    mask = AddedToken(tokenizer_lib.MASK, lstrip=True, normalized=False, special=True)
    fast = PreTrainedTokenizerFast(
      tokenizer_object=_spm_tokenizer(tokenizer, processors, pre_tokenizers, decoders),
      **dict(specials, mask_token=mask),
    )
  else:  # WordPiece: BERT's own tokenizer reads the vocab.txt
    path = os.path.join(out_dir, 'vocab.txt')
    with open(path, 'wb') as f:
      f.write(tokenizer.file_bytes())
    fast = BertTokenizerFast(path, do_lower_case=tokenizer.lower_case, **specials)
  fast.model_max_length = int(1e30)
  fast.save_pretrained(out_dir)
  for name, token_id in (
    ('pad_token', tokenizer.pad_id),
    ('unk_token', tokenizer.unk_id),
    ('cls_token', tokenizer.cls_id),
    ('sep_token', tokenizer.sep_id),
    ('mask_token', tokenizer.mask_id),
  ):
    if fast.convert_tokens_to_ids(specials[name]) != token_id:  # a bug here, not user input
      raise AssertionError(
        f'exported {name} has id {fast.convert_tokens_to_ids(specials[name])}, not {token_id}'
      )


def _spm_tokenizer(tokenizer, processors, pre_tokenizers, decoders):
  """The SentencePiece model as a `tokenizers.Tokenizer` (transformers' own converter: same
  normalisation, pieces and scores) with BERT's [CLS] / [SEP] template. SentencePiece adds its
  '▁' word boundary once, before the text; the converter's Metaspace would add one after every
  special token too ('[MASK]; you' -> '[MASK]', '▁', ';'), a piece training never saw there:
  only the text's first section gets it ('first')."""
  import tempfile  # pylint: disable=import-outside-toplevel
  import types  # pylint: disable=import-outside-toplevel

  from transformers.convert_slow_tokenizer import SpmConverter  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'tokenizer.model')
    with open(path, 'wb') as f:
      f.write(tokenizer.file_bytes())
    converted = SpmConverter(
      types.SimpleNamespace(vocab_file=path, legacy=True, add_prefix_space=True)
    ).converted()
  converted.pre_tokenizer = pre_tokenizers.Metaspace(replacement='▁', prepend_scheme='first')
  converted.decoder = decoders.Metaspace(replacement='▁', prepend_scheme='first')
  cls, sep = tokenizer_lib.CLS, tokenizer_lib.SEP
  converted.post_processor = processors.TemplateProcessing(
    single=f'{cls} $A {sep}',
    pair=f'{cls} $A {sep} $B:1 {sep}:1',
    special_tokens=[(cls, tokenizer.cls_id), (sep, tokenizer.sep_id)],
  )
  return converted


class ExportError(RuntimeError):
  """The export directory cannot be written (one line naming it and why)."""


def check_out_dir(out_dir: str, workdir: str) -> None:
  """Before anything is restored or written: ExportError in one line for an --out that is no
  place for an export. The run's own files are never overwritten (an export's config.json
  would replace the run's, and the run could neither resume nor be exported again)."""
  out = os.path.realpath(os.path.expanduser(out_dir))
  run_dir = os.path.realpath(os.path.expanduser(workdir))
  if out == run_dir:
    raise ExportError(f'--out {out_dir}: that is the workdir; name a directory of its own')
  for name in MANAGED_DIRS:
    managed = os.path.join(run_dir, name)
    if out == managed or out.startswith(managed + os.sep):
      raise ExportError(
        f"--out {out_dir}: inside the run's {name}/, whose contents the run manages "
        '(old checkpoint steps are rotated away, damaged ones renamed, event files appended): '
        'the export could be deleted with them; name a directory outside it'
      )
  managing = _managing_run(out)
  if managing is not None:
    run, name = managing
    raise ExportError(
      f'--out {out_dir}: inside {name}/ of the run in {run}, whose contents that run manages '
      '(old checkpoint steps are rotated away, damaged ones renamed): the export could be '
      'deleted with them; name a directory outside it'
    )
  existing = out
  while not os.path.exists(existing):  # the nearest ancestor that exists gets the new dirs
    existing = os.path.dirname(existing)
  if existing == out and not os.path.isdir(out):
    raise ExportError(f'--out {out_dir}: a file, not a directory')
  if not os.path.isdir(existing):
    raise ExportError(f'--out {out_dir}: {existing} is a file, not a directory')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ExportError(f'--out {out_dir}: {existing} is not writable (read-only or permissions)')
  if existing == out:
    run_files = [name for name in RUN_MARKERS if _is_run_file(os.path.join(out, name))]
    if run_files:
      raise ExportError(
        f'--out {out_dir}: it holds the files of a training run ({", ".join(run_files)}), '
        'which an export would overwrite; name a directory of its own'
      )


def _managing_run(out: str) -> Optional[tuple[str, str]]:
  """(run directory, managed folder) when `out` (absolute) lies in any training run's managed
  folder: a folder of that name whose parent holds a run's lock or config.json, or a
  checkpoints/ whose steps record a run."""
  path = out
  while os.path.dirname(path) != path:
    parent, name = os.path.split(path)
    if name in MANAGED_DIRS and os.path.isdir(path):
      if any(_is_run_file(os.path.join(parent, marker)) for marker in (LOCK_FILE, CONFIG_FILE)):
        return parent, name
      if name == CHECKPOINTS and glob.glob(os.path.join(glob.escape(path), '*', STEP_RECORD)):
        return parent, name
    path = parent
  return None


def _is_run_file(path: str) -> bool:
  if os.path.basename(path) != CONFIG_FILE:
    return os.path.exists(path)
  try:  # a run's config.json has these sections; an export's (transformers') has none
    with open(path) as f:
      values = json.load(f)
    return isinstance(values, dict) and {'model', 'train'} <= set(values)
  except (OSError, ValueError):
    return False  # not a run's, and replaced by this export


SOURCE_FILE = 'realformer_source.json'


def export(
  config: ModelConfig,
  params: Any,
  tokenizer: tokenizer_lib.Tokenizer,
  out_dir: str,
  source: Optional[dict] = None,
) -> str:
  """Writes the directory; returns 'BertForMaskedLM' or 'RealFormerForMaskedLM'.

  `source`: the identity of what is exported (run_identity.Identity.to_dict()), written to
  SOURCE_FILE and into model.safetensors' metadata. The files are written to a staging
  directory inside `out_dir` and then renamed into place, so a failure (a full disk) leaves the
  previous export whole; the files of a previous export that this one does not write (e.g. a
  BERT export's flax_model.msgpack under a RealFormer one) are removed, so the directory never
  mixes two exports. A failed write is one ExportError."""
  check_exportable(config)
  if tokenizer.vocab_size != config.vocab_size:
    raise ConfigError(
      f'model.vocab_size={config.vocab_size}: the tokenizer {tokenizer.source} has '
      f'{tokenizer.vocab_size} pieces'
    )
  weights = hf_convert.to_hf_bert(
    {k: v for k, v in params.items() if k in ('encoder', 'mlm_head')}, config
  )
  values = hf_config(config, tokenizer)
  staging = os.path.join(out_dir, f'{_STAGING_PREFIX}{socket.gethostname()}-{os.getpid()}')
  try:
    os.makedirs(out_dir, exist_ok=True)
    remove_stale_staging(out_dir)
    os.makedirs(staging, exist_ok=True)
    _write_files(weights, values, tokenizer, staging, source)
    written = sorted(os.listdir(staging))
    previous = read_source(out_dir)
    for name in written:
      os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    for name in set(previous.get('files', ())) - set(written):
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(out_dir, os.path.basename(name)))
  except OSError as e:
    free = shutil.disk_usage(out_dir).free if os.path.isdir(out_dir) else 0
    raise ExportError(
      f'--out {out_dir}: cannot write the export: {e.strerror or e} ({free / 2**20:.1f} MiB '
      'free); nothing of it was put in place (a previous export there is whole)'
    ) from None
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return values['architectures'][0]


# `<out>/.export-<host>-<pid>`: the files of an export being written, renamed into place when
# whole. An export killed (kill -9) before it removes its own leaves it behind; the next export
# on the same host removes those whose process is gone (an old `.export-<pid>` counts as ours).
_STAGING_PREFIX = '.export-'


def remove_stale_staging(out_dir: str) -> list[str]:
  """Removes the staging directories in `out_dir` of dead exports on this host; returns their
  names. Another host's (a shared filesystem) are left alone: its processes cannot be seen."""
  removed = []
  host = socket.gethostname()
  for name in sorted(os.listdir(out_dir)):
    if not name.startswith(_STAGING_PREFIX):
      continue
    owner, _, pid = name[len(_STAGING_PREFIX) :].rpartition('-')
    if not pid.isdigit() or owner not in ('', host) or _alive(int(pid)):
      continue
    shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)
    removed.append(name)
  return removed


def _alive(pid: int) -> bool:
  if pid == os.getpid():
    return True
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


def _deterministic_safetensors(blob: bytes) -> bytes:
  """`blob` with its header's metadata in sorted key order: safetensors writes the metadata
  from a hash map, so two exports of one step would otherwise differ in bytes. The header is
  re-padded with spaces to 8 bytes, as safetensors pads it."""
  length = int.from_bytes(blob[:8], 'little')
  header = json.loads(blob[8 : 8 + length])
  if '__metadata__' in header:
    header['__metadata__'] = dict(sorted(header['__metadata__'].items()))
  text = json.dumps(header, separators=(',', ':'), ensure_ascii=False).encode()
  text += b' ' * (-len(text) % 8)
  return len(text).to_bytes(8, 'little') + text + blob[8 + length :]


def _write_files(weights, values, tokenizer, directory: str, source: Optional[dict]) -> None:
  from safetensors.numpy import save  # pylint: disable=import-outside-toplevel

  def write(name: str, data: bytes) -> None:  # open(): the user's umask, like every file here
    with open(os.path.join(directory, name), 'wb') as f:
      f.write(data)

  write('config.json', json.dumps(values, indent=2, sort_keys=True).encode())
  metadata = {'format': 'pt'}
  if source is not None:  # the weights file alone still says where it came from
    metadata.update({f'realformer_{k}': str(v) for k, v in source.items()})
  write('model.safetensors', _deterministic_safetensors(save(weights, metadata=metadata)))
  if values['model_type'] == 'bert':
    from flax import serialization  # pylint: disable=import-outside-toplevel

    write('flax_model.msgpack', serialization.msgpack_serialize(flax_tree(weights)))
  else:
    for name in TORCH_MODULE_FILES:
      shutil.copyfile(os.path.join(TORCH_MODULE_DIR, name), os.path.join(directory, name))
  write_tokenizer(tokenizer, directory)
  files = sorted(os.listdir(directory)) + [SOURCE_FILE]
  write(SOURCE_FILE, json.dumps({'source': source, 'files': files}, indent=2).encode() + b'\n')


def read_source(out_dir: str) -> dict:
  """The record of the export already in `out_dir`, or {}."""
  try:
    with open(os.path.join(out_dir, SOURCE_FILE)) as f:
      record = json.load(f)
    return record if isinstance(record, dict) else {}
  except (OSError, ValueError):
    return {}

"""A resume checked against the steps it resumes, before anything is built or compiled.

A workdir that holds checkpoints resumes only the model they were trained with
(`check_resumable`: a one-line ConfigError otherwise); a changed schedule or batch contents is
allowed but said in a note (`check_schedule`, `check_step_contents`); `check_workdir` runs the
three against the newest committed step. train/run_setup.py runs them before the data is built
(a refused resume costs no data preparation), with `check_corpus` (a file corpus changed since
the newest step: below), train/loop.py again once the run holds the workdir, and for their notes
once the restore has chosen its step. `tokenizer_remedy` is what a resume whose tokenizer
differs from its steps' is told to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Optional

from realformer_jax.config import ConfigError, ModelConfig
from realformer_jax.data import corpus_changes
from realformer_jax.train import build, checkpoint_record
from realformer_jax.train.checkpointing import committed_steps
from realformer_jax.train.config import RunSpec, TrainConfig
from realformer_jax.workdir_layout import CONFIG_FILE, checkpoints_dir


def check_workdir(spec: RunSpec, workdir: str, committed: list[int]) -> tuple:
  """Before anything is built or compiled: the checks of a resume against the newest
  committed step of `committed` (the model, the schedule); their notes (or None each)."""
  latest = committed[-1] if committed else None
  return (
    check_resumable(spec.model, workdir, latest),
    check_schedule(spec.train, workdir, latest),
    check_step_contents(spec, workdir, latest),
  )


# What one step trains on, besides the schedule: sequences per step and masked slots each.
_STEP_CONTENT_FIELDS = (('train', 'global_batch_size'), ('data', 'max_predictions'))


def check_step_contents(spec: RunSpec, workdir: str, latest_step: Optional[int]) -> Optional[str]:
  """A resumed run may change how many sequences a step takes or how many tokens each masks,
  but not silently: a one-line note of what changed against the newest step's record, or
  None (also for a step saved before records: config.json is rewritten by every start)."""
  if latest_step is None:
    return None
  try:
    record = checkpoint_record.read(os.path.join(checkpoints_dir(workdir), str(latest_step)))
  except ConfigError:
    return None  # damaged: the restore sets it aside
  if record is None:
    return None
  current = spec.to_dict()
  changed = [
    f'{section}.{name} {record["config"][section][name]} -> {current[section][name]}'
    for section, name in _STEP_CONTENT_FIELDS
    if name in record['config'].get(section, {})
    and record['config'][section][name] != current[section][name]
  ]
  if not changed:
    return None
  return (
    f'note: the resumed steps train on other batches ({", ".join(changed)}) than checkpoint '
    f'step {latest_step} was trained with: from step {latest_step} on, each step sees that many '
    'sequences and masked tokens; the loss curve may step there'
  )


def check_resumable(model: ModelConfig, workdir: str, latest_step: Optional[int]) -> Optional[str]:
  """Before anything is compiled: a workdir that holds checkpoints resumes only the model it
  was trained with. A changed `model` field would fail deep inside orbax (or, for a changed
  LN placement or dropout, silently resume a different experiment), so it is a one-line
  ConfigError instead; the checkpoints are left untouched. The model compared with is the one
  the newest step records (checkpoint_record.py), else (a step saved before records) the
  one config.json says. How the model is computed may change (dtype, remat, residual carry,
  attention kernels: checkpoint_record.MAY_DIFFER): a one-line note says what did, and is
  returned (None when nothing did). Fields that are 'auto' on either side are not compared."""
  if latest_step is None:
    return None
  current = json.loads(json.dumps(dataclasses.asdict(model)))
  try:
    record = checkpoint_record.read(os.path.join(checkpoints_dir(workdir), str(latest_step)))
  except ConfigError:
    record = None  # damaged: the restore sets the step aside; config.json says the model
  if record is not None:
    saved, holder = record['config']['model'], f'checkpoint step {latest_step} has'
  else:
    saved, holder = _saved_model(workdir, latest_step), 'the checkpoint has'
  saved = checkpoint_record.with_added_fields(saved)
  changed, computed = checkpoint_record.model_differences(saved, current)
  if changed:
    listed = ', '.join(f'model.{k}={current.get(k)!r} ({holder} {saved.get(k)!r})' for k in changed)
    raise ConfigError(
      f'{workdir} holds checkpoints (latest step {latest_step}) of another '
      f'model: {listed}; use a new --workdir, or the old config, to resume it'
    )
  if not computed:
    return None
  how = ', '.join(f'model.{k} {saved.get(k)!r} -> {current.get(k)!r}' for k in computed)
  return f'note: the resumed model is computed differently ({how}); the model is the same'


def _saved_model(workdir: str, latest_step: int) -> dict:
  """The model section of config.json, for checkpoints saved before steps recorded their own:
  they cannot say the model's dtype, dropout, LN placement or residual attention (no parameter
  shape shows them), so without a readable config.json a resume is a one-line ConfigError."""
  path = os.path.join(workdir, CONFIG_FILE)
  # Only the run's own config.json: a copy of a sibling run's would resume another model, and
  # steps saved before records cannot tell the two apart.
  remedy = (
    "put back the run's own config.json, or use a new --workdir; the checkpoints are untouched"
  )
  if not os.path.exists(path):
    raise ConfigError(
      f'{workdir} holds checkpoints (latest step {latest_step}, saved before steps recorded '
      'their model) but no config.json, so the model they were trained with cannot be compared '
      f'with this config: {remedy}'
    )
  try:
    with open(path) as f:
      saved = json.load(f)['model']
    if not isinstance(saved, dict):
      raise TypeError('model is not a section')
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(
      f'{path} is unreadable ({type(e).__name__}: truncated or damaged), so the model the '
      f'checkpoints in {workdir} (latest step {latest_step}) were trained with cannot be '
      f'compared with this config: {remedy}'
    ) from None
  return saved


# What the learning rate at a step depends on (state.learning_rate_schedule).
_SCHEDULE_FIELDS = ('num_train_steps', 'warmup_steps', 'learning_rate')


def check_schedule(train: TrainConfig, workdir: str, latest_step: Optional[int]) -> Optional[str]:
  """Before anything is compiled: a resumed run may change its schedule (train a run further),
  but not silently. Returns a one-line note of what changed (the end step, the learning rate
  at the restored step), or None. An end step below the checkpoints' step would only evaluate
  them and exit: a one-line ConfigError instead, the checkpoints untouched."""
  if latest_step is None:
    return None
  for name in ('num_train_steps', 'stop_at_step'):
    value = getattr(train, name)
    if value != -1 and value < latest_step:
      raise ConfigError(
        f'train.{name}={value}: below step {latest_step}, where the checkpoints in {workdir} '
        f'end; set it to {latest_step} or more to resume them, or use a new --workdir'
      )
  try:  # the schedule the newest step was saved with, else config.json's
    record = checkpoint_record.read(os.path.join(checkpoints_dir(workdir), str(latest_step)))
    if record is not None:
      saved = record['config']['train']
    else:
      with open(os.path.join(workdir, CONFIG_FILE)) as f:
        saved = json.load(f)['train']
    before = train.replace(**{name: saved[name] for name in _SCHEDULE_FIELDS})
  except (OSError, ValueError, KeyError, TypeError, ConfigError):
    return None  # unreadable: check_resumable has said so; nothing to compare
  changed = [
    f'train.{name} {getattr(before, name)} -> {getattr(train, name)}'
    for name in _SCHEDULE_FIELDS
    if getattr(before, name) != getattr(train, name)
  ]
  if not changed:
    return None
  lr_before, lr_after = (
    float(build.learning_rate_schedule(t)(latest_step)) for t in (before, train)
  )
  return (
    f'note: the resumed schedule changed ({", ".join(changed)}): it now ends at step '
    f'{train.num_train_steps} (was {before.num_train_steps}); learning rate at the restored '
    f'step {latest_step}: {lr_before:.2e} -> {lr_after:.2e}'
  )


def tokenizer_remedy(data: dict, record: Optional[dict], step: int) -> str:
  """What a resume whose data config (`data`: its config.json section) gives another tokenizer
  than its steps' should do. Where the data config is the one step `step` records, the corpus
  itself changed since (a file added, removed or edited trains another tokenizer): the remedy
  says so, not 'resume with the data config it was trained with', which the user already did."""
  as_saved = lambda section: json.loads(json.dumps(section))  # tuples become lists, as saved
  recorded = ((record or {}).get('config') or {}).get('data')
  if recorded is None or recorded != as_saved(data):
    return 'resume with the data config it was trained with, or use a new --workdir'
  return (
    f'the data config is the one step {step} records, so the corpus changed since (a file '
    'added, removed or edited trains another tokenizer) and the run would train on the '
    f'changed corpus with ids that mean other pieces: {corpus_changes.REMEDY}'
  )


# A resume whose file corpus changed since its newest step is refused before any preparation.
#
# The steps of a run record the packed store their data position reads (its data state's
# 'store'); that store's corpus directory records the files it was read from
# (data/corpus_changes.py). A file added to, removed from or resized in the corpus makes another
# corpus digest, so preparing it would train another tokenizer and pack another store, minutes to
# hours of work whose end is a refusal anyway (the tokenizer check or the data position's). Here
# the listing of the files alone (a stat each) says so first, in one line naming the files.

# The data fields that name the corpus's files: where the resume changed them, the user chose
# other files, and the remedy is the config the run was trained with.
_FILE_FIELDS = ('train_files', 'eval_files')


def check_corpus(spec: RunSpec, workdir: str) -> None:
  """ConfigError where the file corpus of `spec` certainly differs from the one the newest
  committed step of `workdir` was trained on (corpus_changes.since_prepared); None otherwise,
  also for a fresh run, a TFDS corpus, or a step whose store's corpus is not found under
  data.data_dir."""
  committed = committed_steps(checkpoints_dir(workdir))
  if not committed:
    return
  step = committed[-1]
  step_dir = os.path.join(checkpoints_dir(workdir), str(step))
  changes = corpus_changes.since_prepared(spec.data, checkpoint_record.recorded_store(step_dir))
  if changes is None:
    return
  record = None
  with contextlib.suppress(ConfigError):  # a damaged record: no recorded config to compare
    record = checkpoint_record.read(step_dir)
  recorded = ((record or {}).get('config') or {}).get('data') or {}
  current = spec.to_dict()['data']
  moved = [f for f in _FILE_FIELDS if f in recorded and recorded[f] != current[f]]
  remedy = corpus_changes.REMEDY
  if moved:
    given = ', '.join(f'data.{f}={recorded[f]!r}' for f in moved)
    remedy = f'resume with the files it was trained with ({given}), or use a new --workdir'
  raise ConfigError(
    f'the corpus of the run in {workdir} {changes.describe(since=f"checkpoint step {step}")}; '
    'resuming would prepare another corpus (its own tokenizer and packed store) and train on '
    f'text the checkpoints were not trained on: {remedy}'
  )

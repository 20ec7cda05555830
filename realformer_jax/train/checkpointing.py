"""orbax checkpoints of (train state, dropout key, data iterator position), last K kept.

Layout of `<workdir>/checkpoints/<step>/`:
    state/  TrainState (params, optimizer state, step), written shard by shard
    rng/    the run's base PRNG key data (dropout keys are fold_in(rng, step))
    data/   the data iterator position, one JSON file per process (grain's orbax handler);
            the same on every process, so a restore may use another process count
    run_record.json the run's config and tokenizer SHA-256: which model the step holds
            (checkpoint_record.py)
    checksums.json  size and CRC-32 of every file, recorded before the step is committed
            (checkpoint_integrity.py)

Restoring takes an abstract target whose leaves carry shardings, so a checkpoint restores
onto any mesh and process count, and optax's state types survive.

Faults (README "Reliability"):
- Restoring falls back: a step that fails its checksums, or fails to restore while an older
  one restores, is renamed aside to `<step>.damaged` (never deleted; orbax ignores the name)
  with one warning line, and the next older step is tried. If none restores, one
  CheckpointError says what each step's problem was.
- A failed save (a full disk, a permission denied, in the blocking part or in the background
  writes) waits for the writes still in flight, removes its own uncommitted directory, and
  raises one CheckpointError naming the step, the directory, the free bytes, the intact steps
  and what to do. Committed steps are never touched: orbax deletes old steps (rotation,
  `keep`) only after a newer step has been committed, so a failed save deletes nothing.
- A step from which every resume would diverge again (divergence.py) is renamed aside to
  `<step>.diverged` by the run that finds it, so a rerun resumes from the step before.
- An interrupted save (kill -9) leaves only `<step>.orbax-checkpoint-tmp`, which the next run
  removes before it saves (the workdir lock, workdir_lock.py, makes that safe).
- A restored state holding NaN or inf (damage no checksum caught: a step saved before
  checksums existed) is set aside like a damaged step: no saved state has any.
- A save first makes and removes a probe directory, so a `checkpoints/` where no step directory
  can be made (read-only, no free inodes) fails at once, not after orbax's 300 s barrier.
- A reader asked for one step (`check_step`) refuses it if its files fail their checksums,
  naming the file and the newest intact step.
- A reader (`reading`: an export, a study's scoring, a fine-tuning start) holds a shared flock
  on the step's directory while it reads; rotation deletes only the steps on which it gets an
  exclusive one (`_SparingReaders`), so a step being read outlives it (deleted at a later save)
  and a reader never opens a step being deleted: it takes the next newer one, waiting for it to
  commit. A step directory without its commit marker while the run holds its workdir is being
  written: readers skip it (or, asked for that step, wait for it), rather than calling it
  damaged. Locks are per host: a multi-process run rotates as orbax does.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import logging
import os
import shutil
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from realformer_jax import data, extras, workdir_layout
from realformer_jax.config import ConfigError
from realformer_jax.train import checkpoint_integrity, checkpoint_record, workdir_lock
from realformer_jax.train.errors import CheckpointError, DivergenceError
from realformer_jax.train.step import TrainState

grain = extras.lazy('grain')

DAMAGED_SUFFIX = '.damaged'
DIVERGED_SUFFIX = '.diverged'
_TMP_SUFFIX = '.orbax-checkpoint-tmp'
_PROBE_PREFIX = '.probe-'  # a directory made and removed before each save; orbax ignores it
# How long a failed save waits for its other writes to end before removing its directory.
_IN_FLIGHT_WAIT_S = 60.0
# How long a reader waits for a step being written to commit (a save's background writes).
READ_WAIT_S = 300.0
_READ_POLL_S = 0.5


def warn(message: str) -> None:
  """A one-line warning on stderr (process 0 only)."""
  if jax.process_index() == 0:
    print(f'warning: {message}', file=sys.stderr, flush=True)


class Checkpointer:
  """Saves and restores one run's checkpoints under `<workdir>/checkpoints`.

  `writer=False` opens them for reading only (train.load_workdir): nothing is created, cleaned
  up, renamed or rotated, so it is safe beside a live run. `record`: what every step saved
  records of the run (checkpoint_record.make).
  """

  def __init__(self, workdir: str, keep: int, writer: bool = True, record: Optional[dict] = None):
    self.directory = workdir_layout.checkpoints_dir(workdir)
    self._record = record
    self._saving_step: Optional[int] = None
    self._failed: Optional[CheckpointError] = None
    self._rotation = _SparingReaders(self.directory, keep) if writer else None
    self._warned: set[str] = set()
    options = ocp.CheckpointManagerOptions(
      # A reader saves and rotates nothing (orbax warns when read_only meets either); a writer
      # keeps the newest `keep` steps and any step a reader holds.
      preservation_policy=self._rotation,
      save_interval_steps=1 if writer else 0,
      create=writer,
      read_only=not writer,
      # Uncommitted steps of a killed or failed run: ours to remove (we hold the workdir).
      cleanup_tmp_directories=writer,
      # The step's directories are made in the blocking part of the save: made in orbax's
      # background thread, a directory that cannot be made (a read-only checkpoints/ after the
      # probe below) left the save waiting 300 s at orbax's barrier, naming no cause.
      async_options=ocp.AsyncOptions(
        post_finalization_callback=self._record_checksums, create_directories_asynchronously=False
      )
      if writer
      else None,
    )
    with _without_read_only_warning():
      self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=('state', 'rng', 'data')
      )
    if writer and jax.process_index() == 0:  # a probe left by a run killed mid-save (ours)
      for probe in glob.glob(os.path.join(self.directory, f'{_PROBE_PREFIX}*')):
        shutil.rmtree(probe, ignore_errors=True)

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def latest_committed_step(self) -> Optional[int]:
    """The newest step with its commit marker: what a restart can resume from. orbax also
    lists a step directory without one (e.g. an empty `checkpoints/100`), which restoring sets
    aside; a check against the resume step (resume_checks.check_schedule) must not take it for
    one."""
    committed = self.intact_steps()
    return committed[-1] if committed else None

  def save(self, state: TrainState, rng_data: jax.Array, data_iterator: Any, step: int) -> None:
    """Saves `state` (whose step is `step`: passed in, so saving does not wait for the step
    to finish before orbax starts). Arrays are copied off the devices before this returns (the
    state may be donated right after); files are written in the background. A failure of this
    save or of the previous one's background writes raises CheckpointError."""
    if self._failed is not None:
      raise self._failed
    self.wait()  # the previous save is committed (or its failure raised) before step changes
    self._saving_step = step
    self._check_step_directory_can_be_made(step)
    try:
      self._manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          rng=ocp.args.StandardSave({'key_data': rng_data}),
          data=grain.checkpoint.CheckpointSave(data_iterator),
        ),
        force=True,
      )
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(step, e) from None

  def _check_step_directory_can_be_made(self, step: int) -> None:
    """orbax makes the step's directory in a background thread, and the save waits for it at
    a barrier: a directory that cannot be made (a read-only `checkpoints/`, no free inodes)
    hangs there for orbax's 300 s timeout, then names neither cause. So process 0 makes and
    removes a probe directory first (two system calls a save), and a failure is the one
    CheckpointError of a failed save at once, on every process."""
    error = None
    if jax.process_index() == 0:
      probe = os.path.join(self.directory, f'{_PROBE_PREFIX}{step}-{os.getpid()}')
      try:
        os.makedirs(self.directory, exist_ok=True)
        os.mkdir(probe)
        os.rmdir(probe)
      except OSError as e:
        error = e
    if not _all_processes_ok(error is None):
      raise self._save_failed(
        step, error or OSError(errno.EIO, 'process 0 cannot make the step directory')
      )

  def _record_checksums(self) -> None:
    """orbax's post-finalization hook (primary host, background thread): every process has
    written the step, which is not yet committed; its files are in the temporary directory."""
    step = self._saving_step
    candidates = sorted(
      glob.glob(os.path.join(self.directory, f'{step}{_TMP_SUFFIX}*')), key=os.path.getmtime
    )
    step_dir = candidates[-1] if candidates else os.path.join(self.directory, str(step))
    if self._record is not None:  # before the inventory, which then lists it
      checkpoint_record.write(step_dir, self._record)
    checkpoint_integrity.record(step_dir)

  def restore(
    self, step: int, abstract_state: TrainState, abstract_rng_data: Any, data_iterator: Any
  ) -> tuple[TrainState, jax.Array]:
    """(state, rng key data) at `step`; `data_iterator` is moved to the saved position."""
    restored = self._manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        rng=ocp.args.StandardRestore({'key_data': abstract_rng_data}),
      ),
    )
    # Read directly rather than through grain's handler, whose file name holds the process
    # count: the pipeline's position is the same on every process, so this also restores a
    # checkpoint saved with a different number of processes.
    data_iterator.set_state(data.saved_train_state(os.path.join(self.directory, str(step), 'data')))
    return restored.state, restored.rng['key_data']

  def restore_latest(
    self,
    abstract_state: TrainState,
    abstract_rng_data: Any,
    data_iterator: Any,
    warn_fn: Callable[[str], None] = warn,
  ) -> Optional[tuple[int, TrainState, jax.Array]]:
    """(step, state, rng key data) of the newest step that restores, or None if there is no
    checkpoint. Steps that fail are set aside as described in the module docstring, with one
    warning each; if none restores, CheckpointError (which then says it all: no warnings). A
    ConfigError or DataError (another config or dataset: every step would fail alike)
    propagates unchanged."""
    failed = []  # (step, reason) of steps that failed to restore, not yet set aside
    set_aside = []  # (step, reason, new name, warning)
    for step in sorted(self.all_steps(), reverse=True):
      reason = self._agreed_problem(step)
      if reason is not None:
        set_aside.append(self._set_aside(step, reason, then='trying the next older step'))
        continue
      try:
        state, key_data = self.restore(step, abstract_state, abstract_rng_data, data_iterator)
        error = None
      except (ConfigError, data.DataError):
        raise
      except Exception as e:  # pylint: disable=broad-except
        error = e
      if error is None and not _all_finite(state):
        # Never saved so (the loop checks every state before saving it): damaged bytes that
        # no checksum caught (a step saved before checksums existed). Every process computed
        # the same global flag, so all set it aside together.
        reason = 'its train state holds NaN or inf values, which no saved state has'
        set_aside.append(self._set_aside(step, reason, then='trying the next older step'))
        continue
      if _all_processes_ok(error is None):
        for failed_step, failed_reason in failed:
          set_aside.append(
            self._set_aside(failed_step, failed_reason, then=f'resuming from step {step}')
          )
        if set_aside:
          self._manager.reload()
        for *_, warning in sorted(set_aside):
          warn_fn(warning)
        return step, state, key_data
      failed.append(
        (
          step,
          _first_line(error) if error is not None else 'it failed to restore on another process',
        )
      )
    if set_aside:
      self._manager.reload()
    if not failed and not set_aside:
      return None
    problems = '; '.join(
      f'step {s}: {r}' for s, r in sorted([(s, r) for s, r, *_ in set_aside] + failed, reverse=True)
    )
    if failed:
      outcome = (
        'the steps that failed to restore are left in place (damaged files, or a '
        'config that differs from the one they were saved with)'
      )
      remedy = 'fix the config, or move those step directories aside to start from step 0'
      if set_aside:
        outcome = (
          'the damaged ones were moved aside ('
          + ', '.join(name for _, _, name, _ in set_aside)
          + '), '
          + outcome
        )
    else:
      outcome = 'they were moved aside (' + ', '.join(name for _, _, name, _ in set_aside) + ')'
      remedy = 'rerun to start from step 0, or put back a good copy of a step'
    raise CheckpointError(
      f'no checkpoint in {self.directory} can be restored: {problems}; {outcome}; {remedy}'
    )

  def _agreed_problem(self, step: int) -> Optional[str]:
    """checkpoint_integrity.problem of `step`, computed on process 0 (it reads every file)
    and agreed by all processes."""
    reason = None
    if jax.process_index() == 0:
      reason = checkpoint_integrity.problem(os.path.join(self.directory, str(step)))
    if jax.process_count() > 1:
      damaged = multihost_utils.broadcast_one_to_all(np.int32(reason is not None))
      if int(damaged) and reason is None:
        reason = 'damaged (process 0 found the problem)'
    return reason

  def _set_aside(self, step: int, reason: str, then: str) -> tuple[int, str, str, str]:
    """Renames step `step` to `<step>.damaged[-n]` (process 0; all wait). Returns (step,
    reason, new name, the warning line)."""
    name = self._rename_aside(step, DAMAGED_SUFFIX)
    return (
      step,
      reason,
      name,
      (
        f'checkpoint step {step} in {self.directory} is damaged '
        f'({reason}): moved aside to {name}; {then}'
      ),
    )

  def _rename_aside(self, step: int, suffix: str) -> str:
    """Renames step `step` to `<step><suffix>[-n]`, a name orbax ignores (process 0; all
    wait); returns the new name."""
    source = os.path.join(self.directory, str(step))
    target = source + suffix
    n = 1
    while os.path.exists(target):
      n += 1
      target = f'{source}{suffix}-{n}'
    if jax.process_index() == 0:
      os.rename(source, target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f'checkpoint set aside {step}')
    return os.path.basename(target)

  def set_aside_diverged(self, error: DivergenceError) -> DivergenceError:
    """`error` names a dead end (divergence.py): a committed step from which every resume
    diverges again. It is renamed to `<step>.diverged` (never deleted), so that a rerun resumes
    from the step before it, or from step 0; returns `error` saying which."""
    try:
      self.wait()  # the dead end may be the save still committing in the background
    except CheckpointError:
      return error  # it never committed: nothing to set aside
    if error.dead_end not in self.all_steps():
      return error
    name = self._rename_aside(error.dead_end, DIVERGED_SUFFIX)
    self._manager.reload()
    earlier = self.latest_step()
    then = (
      f'a rerun resumes from step {earlier}'
      if earlier is not None
      else 'no earlier one is kept, so a rerun starts from step 0'
    )
    return DivergenceError(
      f'{error}; moved that checkpoint aside to {name}: {then}', error.step, error.dead_end
    )

  def newest_intact_step(self) -> int:
    """The newest step whose files pass their checksums, for readers (which never set steps
    aside; one warning per damaged step, one note per step being written); CheckpointError if
    none does."""
    problems = []
    for step in sorted(self.all_steps(), reverse=True):
      if self._being_written(step):
        self._say_once(
          f'note: checkpoint step {step} in {self.directory} is being written by the live '
          'run (no commit marker yet): skipped'
        )
        continue
      reason = checkpoint_integrity.problem(os.path.join(self.directory, str(step)))
      if reason is None:
        return step
      self._say_once(
        f'warning: checkpoint step {step} in {self.directory} is damaged ({reason}): skipped'
      )
      problems.append(f'step {step}: {reason}')
    raise CheckpointError(f'no intact checkpoint in {self.directory}: {"; ".join(problems)}')

  def _say_once(self, line: str) -> None:
    if line not in self._warned and jax.process_index() == 0:
      self._warned.add(line)
      print(line, file=sys.stderr, flush=True)

  def _being_written(self, step: int) -> bool:
    """A step directory without its commit marker while a live run holds the workdir: a save
    in progress (a committed layout that writes in place), not a damaged step."""
    step_dir = os.path.join(self.directory, str(step))
    return not os.path.exists(
      os.path.join(step_dir, checkpoint_integrity.COMMIT_MARKER)
    ) and workdir_lock.held(os.path.dirname(self.directory))

  @contextlib.contextmanager
  def reading(self, step: Optional[int] = None, wait_s: float = READ_WAIT_S) -> Iterator[int]:
    """Holds a read lock on `step` (default: the newest intact step) while the block reads it;
    yields the step. Rotation leaves a locked step alone. A step being rotated away (its
    deletion decided by the run's latest save) is not opened: the newest intact step is looked
    up again until the next one commits; `step` itself is then CheckpointError. A `step` being
    written is waited for. Either wait ends after `wait_s` with CheckpointError."""
    deadline = time.monotonic() + wait_s
    while True:
      chosen = step
      if step is None:
        chosen = self.newest_intact_step()
      elif self._being_written(step) and time.monotonic() < deadline:
        self._say_once(f'note: waiting for checkpoint step {step} in {self.directory} to commit')
        time.sleep(_READ_POLL_S)
        continue
      fd = _lock_directory(os.path.join(self.directory, str(chosen)), fcntl.LOCK_SH)
      if fd is not None and fd >= 0:
        try:
          yield chosen
          return
        finally:
          os.close(fd)
      if step is not None:
        raise CheckpointError(
          f'checkpoint step {step} in {self.directory} is being deleted by the live run '
          '(rotation: keep_checkpoints): not loaded; name a newer step, or none for the newest'
        )
      if time.monotonic() >= deadline:
        raise CheckpointError(
          f'checkpoint step {chosen} in {self.directory} is being deleted by the live run and '
          f'no newer step committed within {wait_s:.0f} s: not loaded'
        )
      self._say_once(
        f'note: checkpoint step {chosen} in {self.directory} is being rotated away by the live '
        'run: waiting for the step it is saving'
      )
      time.sleep(_READ_POLL_S)
      self._manager.reload()

  def check_step(self, step: int) -> None:
    """For a reader asked for one `step`: CheckpointError (naming the step, the damaged file
    and the newest step that passes its checksums) unless its files pass them."""
    reason = checkpoint_integrity.problem(os.path.join(self.directory, str(step)))
    if reason is None:
      return
    good = next(
      (
        s
        for s in sorted(self.all_steps(), reverse=True)
        if s != step and checkpoint_integrity.problem(os.path.join(self.directory, str(s))) is None
      ),
      None,
    )
    last_good = f'the last good step is {good}' if good is not None else 'no other step is intact'
    raise CheckpointError(
      f'checkpoint step {step} in {self.directory} is damaged ({reason}): not loaded; {last_good}'
    )

  def restore_state(self, step: int, abstract_state: TrainState) -> TrainState:
    """Only the train state at `step` (no data iterator or PRNG key): for loading weights."""
    restored = self._manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
    )
    return restored.state

  def intact_steps(self) -> list[int]:
    """Committed steps on disk (newest last): what a restart can resume from."""
    return committed_steps(self.directory)

  def wait(self) -> None:
    """Blocks until the background save is committed; CheckpointError if it failed (once:
    after a failure this returns, the error having been raised already)."""
    if self._failed is not None:
      return
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(self._saving_step, e) from None

  def close(self) -> None:
    self.wait()
    if self._failed is None:
      self._manager.close()
    if self._rotation is not None:
      self._rotation.release()

  def _drain(self) -> None:
    """Waits for what a failed save left in flight: orbax raises the first failure and stops
    waiting, while its other writes go on, among them the step's metadata file, written by a
    metadata store that its checkpointer only waits for once the failure has been raised (so
    the second wait below)."""
    checkpointer = getattr(self._manager, '_checkpointer', None)  # orbax 0.12's AsyncCheckpointer
    for _ in range(2):
      try:
        if checkpointer is not None:
          checkpointer.wait_until_finished()
        break
      except Exception:  # pylint: disable=broad-except
        continue  # the failure itself, raised once more: the next wait drains the rest
    deadline = time.monotonic() + _IN_FLIGHT_WAIT_S
    for thread in threading.enumerate():  # orbax's writer threads, e.g. TensorStore writes
      if thread is not threading.current_thread() and type(thread).__module__.startswith('orbax.'):
        try:  # orbax's threads raise their own failure from join (a full disk: ENOSPC)
          thread.join(max(0.0, deadline - time.monotonic()))
        except Exception:  # pylint: disable=broad-except
          pass  # the failure this save reports in its one line

  def _save_failed(self, step: Optional[int], error: BaseException) -> CheckpointError:
    """The one-line error for a failed save of `step`, after its other writes have ended and
    its uncommitted directory is gone."""
    self._drain()
    if jax.process_index() == 0:
      for path in glob.glob(os.path.join(self.directory, f'{step}{_TMP_SUFFIX}*')):
        shutil.rmtree(path, ignore_errors=True)
    free = shutil.disk_usage(self.directory).free if os.path.isdir(self.directory) else 0
    intact = self.intact_steps()
    kept = (
      f'intact checkpoints: step{"s" if len(intact) > 1 else ""} '
      f'{", ".join(map(str, intact))} (untouched)'
      if intact
      else 'no checkpoint was committed before'
    )
    resume = f'resume from step {intact[-1]}' if intact else 'start from step 0'
    cause = _cause(error)
    if cause == 'disk_full' and _no_free_inodes(self.directory):
      what = f'no free inodes left on the device of {self.directory} ({_format_bytes(free)} free)'
      remedy = f'delete files there and rerun to {resume}'
    elif cause == 'disk_full':
      what = f'no space left on the device of {self.directory} ({_format_bytes(free)} free)'
      remedy = f'free space and rerun to {resume}'
    elif cause == 'permission':
      what = f'permission denied writing to {self.directory}'
      remedy = f'make it writable and rerun to {resume}'
    else:
      what = f'{_first_line(error)} (in {self.directory}, {_format_bytes(free)} free)'
      remedy = f'rerun to {resume}'
    self._failed = CheckpointError(
      f'saving the checkpoint at step {step} failed: {what}; {kept}; {remedy}'
    )
    return self._failed


class _SparingReaders:
  """orbax's rotation (a preservation policy): the newest `keep` steps, and any step a reader
  holds (`Checkpointer.reading`). A step it lets orbax delete is locked exclusively from the
  decision (a save's blocking part) until the next decision or close, after orbax deleted it in
  the save's background finalisation: a reader arriving meanwhile sees it is going."""

  def __init__(self, directory: str, keep: int):
    self._directory = directory
    self._latest = ocp.checkpoint_managers.LatestN(n=keep)
    self._doomed: list[int] = []  # file descriptors holding the exclusive locks

  def should_preserve(self, checkpoints, *, context) -> list[bool]:
    self.release()  # the previous decision's deletions are done (a save waits for the last)
    keep = list(self._latest.should_preserve(checkpoints, context=context))
    if jax.process_count() > 1:  # flocks are per host: the processes must agree
      return keep
    for i, info in enumerate(checkpoints):
      if not keep[i]:
        fd = _lock_directory(os.path.join(self._directory, str(info.step)), fcntl.LOCK_EX)
        if fd is None:
          keep[i] = True  # a reader holds it: a later save deletes it
        elif fd >= 0:
          self._doomed.append(fd)
    return keep

  def release(self) -> None:
    while self._doomed:
      os.close(self._doomed.pop())


def _lock_directory(path: str, mode: int) -> Optional[int]:
  """A file descriptor of directory `path` holding flock `mode` (not waiting); None if another
  process holds a conflicting lock, -1 if there is no such directory (any more)."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
  except (FileNotFoundError, NotADirectoryError):
    return -1
  try:
    fcntl.flock(fd, mode | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    return None
  try:  # not renamed or deleted between the open and the lock
    same = os.path.samestat(os.fstat(fd), os.stat(path))
  except OSError:
    same = False
  if same:
    return fd
  os.close(fd)
  return -1


def _cause(error: BaseException) -> str:
  """'disk_full', 'permission' or 'other', from the error and the errors it chains."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = str(error)
    code = getattr(error, 'errno', None)
    if code in (errno.ENOSPC, errno.EDQUOT) or any(
      s in text
      for s in (
        'No space left on device',
        'Disk quota exceeded',
        f"os_error_code='{errno.ENOSPC}'",
        'RESOURCE_EXHAUSTED',
      )
    ):
      return 'disk_full'
    if code in (errno.EACCES, errno.EPERM, errno.EROFS) or any(
      s in text for s in ('Permission denied', 'PERMISSION_DENIED', 'Read-only file system')
    ):
      return 'permission'
    error = error.__cause__ or error.__context__
  return 'other'


def _no_free_inodes(directory: str) -> bool:
  try:
    stats = os.statvfs(directory)
  except OSError:
    return False
  return stats.f_files > 0 and stats.f_favail == 0


def _all_finite(state: TrainState) -> bool:
  """Whether every floating-point value of `state` is finite (one reduction on the devices)."""
  leaves = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not leaves:
    return True
  return bool(jax.jit(lambda xs: jnp.all(jnp.stack([jnp.isfinite(x).all() for x in xs])))(leaves))


@contextlib.contextmanager
def _without_read_only_warning():
  """orbax warns 'Given directory is read only' for every reader (read_only=True is our choice,
  not a fact about the directory): dropped unless the absl log shows INFO (--verbosity)."""
  logger = logging.getLogger('absl')
  drop = lambda record: not record.getMessage().startswith('Given directory is read only')
  quiet = logger.getEffectiveLevel() > logging.INFO
  if quiet:
    logger.addFilter(drop)
  try:
    yield
  finally:
    if quiet:
      logger.removeFilter(drop)


def _first_line(error: BaseException, limit: int = 300) -> str:
  line = (str(error).strip().splitlines() or [''])[0].strip() or type(error).__name__
  return line if len(line) <= limit else line[:limit] + '...'


def _format_bytes(n: int) -> str:
  for unit in ('bytes', 'KiB', 'MiB', 'GiB'):
    if n < 1024 or unit == 'GiB':
      return f'{n:.0f} {unit}' if unit == 'bytes' else f'{n:.1f} {unit}'
    n /= 1024
  return f'{n} bytes'


def _all_processes_ok(ok: bool) -> bool:
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


class BestCheckpoint:
  """The parameters of the best evaluation so far, by one eval metric, under `<workdir>/best`.

  Next to the latest checkpoints (which resume a run) a fine-tuning run keeps the parameters
  that scored best on its eval split: orbax keeps one checkpoint, chosen by `best_fn` over the
  metrics saved with each, and reads those metrics back from disk, so the choice survives a
  resume. The saved metrics are the eval metrics ('eval/<name>'), stored beside the params.
  """

  def __init__(self, workdir: str, metric: str, mode: str = 'max'):
    if mode not in ('max', 'min'):
      raise ValueError(f'best checkpoint mode {mode!r}: must be max or min')
    self.directory = workdir_layout.best_dir(workdir)
    self.metric = f'eval/{metric}'
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=1, create=True, best_fn=lambda metrics: metrics[self.metric], best_mode=mode
      ),
      item_names=('params',),
    )

  def offer(self, step: int, state: TrainState, eval_metrics: dict) -> None:
    """Saves `state.params` if its `eval_metrics` beat the best so far (orbax decides and
    deletes the loser)."""
    if step in self._manager.all_steps():  # a resumed run re-evaluates a saved step
      return
    self._manager.save(
      step,
      args=ocp.args.Composite(params=ocp.args.StandardSave(state.params)),
      metrics={k: float(v) for k, v in eval_metrics.items()},
      force=True,
    )

  def best_step(self) -> Optional[int]:
    return self._manager.best_step()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def committed_steps(directory: str) -> list[int]:
  """The steps under a checkpoint `directory` whose save was committed (newest last)."""
  if not os.path.isdir(directory):
    return []
  return sorted(
    int(name)
    for name in os.listdir(directory)
    if name.isdigit()
    and os.path.isfile(os.path.join(directory, name, checkpoint_integrity.COMMIT_MARKER))
  )


def restore_best_params(workdir: str, abstract_params: Any) -> tuple[Any, int, dict]:
  """(params, step, eval metrics) of the best checkpoint in `workdir` (BestCheckpoint), onto
  the shardings `abstract_params` carries (None: as saved, e.g. for an export)."""
  directory = workdir_layout.best_dir(workdir)
  manager = ocp.CheckpointManager(directory, item_names=('params',))
  try:
    steps = manager.all_steps()
    if not steps:
      raise FileNotFoundError(f'{directory}: no best checkpoint (has the run evaluated yet?)')
    step = max(steps)  # only the best is kept
    restored = manager.restore(
      step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params))
    )
    metrics = manager.metrics(step)
  finally:
    manager.close()
  return restored.params, step, metrics or {}

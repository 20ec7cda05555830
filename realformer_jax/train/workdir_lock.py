"""One training run per workdir: `<workdir>/run.lock`.

Two runs writing one workdir would interleave their checkpoints, and each one's rotation
(`keep_checkpoints`) would delete the other's: the second run is refused, in one line, before it
builds data or compiles anything.

The lock file holds its owner (host, pid, start time) and a heartbeat that a daemon thread
refreshes every `heartbeat_s` seconds, and the owner holds an exclusive `flock` on it:

- On one host the kernel releases the flock when the owner dies, kill -9 included, so the
  lock a killed run leaves behind never blocks the restart.
- Runs on different hosts share the workdir through a network filesystem, where flock may not
  reach the other host (NFS without lockd, some FUSE mounts). There the heartbeat is a lease:
  a lock whose owner is another host and whose heartbeat is within `lease_s` of this host's
  clock is held; any other is watched for two heartbeat intervals (`_is_live`): stale (the
  run died with its host) if it does not change, so a clock skew between the hosts neither
  keeps a dead lock for the skew nor lets a live one be taken over.

The file is rewritten in place and never deleted or renamed: a process that opened it just
before it was replaced would lock an orphaned inode and believe it owned the workdir. Releasing
empties it. The owner also re-reads it at every checkpoint (`check`): if another run took the
lock over (a heartbeat starved for a whole lease), the owner stops instead of writing beside it.

A user may still delete or replace the file (the usual reaction to a lock that looks stale). So
the owner also flocks the workdir directory itself, which no `rm` of a file releases: on one
host a newcomer is refused even then. The owner compares the path's inode with its own at every
heartbeat and checkpoint; if the file is gone or replaced and no live run holds the one now on
the path, it writes its record there again (one warning line) and goes on. Where a directory
cannot be flocked (NFS flocks only files opened for writing) a newcomer on a deleted lock flocks
a new file and starts; the owner then finds a live run on the path and stops before its next
save instead of writing beside it.

In a multi-process run only process 0 takes the lock (it speaks for the whole run); every
process learns the outcome (`acquire_for_run`), so all of them stop with the same error.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from realformer_jax.train.errors import TrainingError
from realformer_jax.workdir_layout import LOCK_FILE

HEARTBEAT_S = 30.0
# Several missed heartbeats, and more than any clock skew between hosts we expect.
LEASE_S = 300.0
_RECORD_BYTES = 512  # the lock record, padded: host names are at most 255 bytes


class WorkdirInUseError(TrainingError):
  """Another live run holds the workdir."""


class WorkdirError(TrainingError):
  """The workdir cannot hold a run: empty, a file, or not writable."""


def check_usable(workdir: Optional[str], flag: str = '--workdir') -> str:
  """The absolute workdir, or WorkdirError before anything is built or created: an empty one
  (which would put run.lock, checkpoints/ and tensorboard/ in the current directory), a path
  through a file, or a directory this process cannot write (read-only mount, permissions).
  `flag`: the option that named it (a study's --out is checked alike)."""
  if not workdir or not workdir.strip():
    raise WorkdirError(f'{flag} is empty: name the directory for the run (it is created)')
  path = os.path.abspath(os.path.expanduser(workdir))
  existing = path
  while not os.path.exists(existing):  # the nearest ancestor that exists gets the new dirs
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise WorkdirError(f'{flag} {path}: {existing} is a file, not a directory')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise WorkdirError(f'{flag} {path}: {existing} is not writable (read-only or permissions)')
  return path


class WorkdirLock:
  """The exclusive claim of one run on a workdir. `acquire` or `WorkdirInUseError`."""

  def __init__(self, workdir: str, heartbeat_s: float = HEARTBEAT_S, lease_s: float = LEASE_S):
    self._given = workdir
    self.workdir = os.path.abspath(os.path.expanduser(workdir))
    self.path = os.path.join(self.workdir, LOCK_FILE)
    self._heartbeat_s = heartbeat_s
    self._lease_s = lease_s
    self._fd: Optional[int] = None
    self._dir_fd: Optional[int] = None  # the workdir directory, flocked (None: no flock there)
    self._inode: Optional[tuple[int, int]] = None  # (st_dev, st_ino) of the file we flocked
    self._owner: Optional[dict] = None
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._write_lock = threading.RLock()

  def acquire(self) -> 'WorkdirLock':
    check_usable(self._given)
    try:
      os.makedirs(self.workdir, exist_ok=True)
      dir_fd = os.open(self.workdir, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
    except OSError as e:
      raise WorkdirError(f'--workdir {self.workdir}: cannot open it: {e.strerror}')
    fd = None
    try:
      dir_flock = _try_flock(dir_fd)
      if dir_flock == 'busy':  # before run.lock is created: a refused run creates nothing
        holder = _read_holder(self.path)
        why = 'holds its lock' + (
          '' if holder else ' (on the workdir itself: deleting run.lock does not release it)'
        )
        raise WorkdirInUseError(self._in_use_message(holder, why))
      try:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      except OSError as e:  # e.g. a mount that turned read-only, or access() that root passes
        raise WorkdirError(f'--workdir {self.workdir}: cannot create {self.path}: {e.strerror}')
      flock = _try_flock(fd)
      holder = _parse(_read_all(fd))
      if flock == 'busy':
        raise WorkdirInUseError(self._in_use_message(holder, why='holds its lock'))
      if holder is not None and self._is_live(holder, flock_works=flock == 'held', fd=fd):
        age = _age(holder)
        why = (
          f'renewed its lease {age:.0f} s ago (a lease lasts {self._lease_s:.0f} s)'
          if 0 <= age < self._lease_s
          else 'renewed its lease while this run watched the lock (its clock is '
          f"{abs(age):.0f} s {'ahead of' if age < 0 else 'behind'} this host's)"
        )
        raise WorkdirInUseError(self._in_use_message(holder, why=why))
    except BaseException:
      for opened in (fd, dir_fd):
        if opened is not None:
          os.close(opened)
      raise
    if dir_flock == 'held':
      self._dir_fd = dir_fd
    else:
      os.close(dir_fd)
    self._fd = fd
    self._inode = _inode(os.fstat(fd))
    now = time.time()
    self._owner = {
      'host': socket.gethostname(),
      'pid': os.getpid(),
      'started': now,
      'heartbeat': now,
      'heartbeat_s': self._heartbeat_s,  # how long a watcher must wait to see a beat
    }
    try:
      self._write(self._owner)
    except OSError as e:  # a full disk: a new lock file has no block for its record
      os.close(fd)
      if self._dir_fd is not None:
        os.close(self._dir_fd)
      self._fd = self._dir_fd = None
      raise WorkdirError(f'--workdir {self.workdir}: cannot write {self.path}: {e.strerror}')
    self._thread = threading.Thread(target=self._beat, name='workdir-lock-heartbeat', daemon=True)
    self._thread.start()
    return self

  def check(self) -> None:
    """Raises WorkdirInUseError if the lock file no longer names this run (taken over)."""
    if self._fd is None:
      return
    if not self._file_is_ours() and not self._reclaim():
      raise WorkdirInUseError(
        f'{self.path} was deleted or replaced while this run held the workdir, so another '
        'run may now hold it; stopped without saving so two runs never write the same '
        'checkpoints (rerun once no other run uses the workdir; the lock is freed when its '
        'run exits, kill -9 included)'
      )
    with self._write_lock:  # never read our own heartbeat half-written
      holder = _parse(_read_all(self._fd))
    if not _same_run(holder, self._owner):
      raise WorkdirInUseError(
        f'{self.workdir}: another run took over the workdir lock ({_describe(holder)}) '
        f'while this one ran (its heartbeat stalled for over {self._lease_s:.0f} s); '
        'stopped without saving so the two runs do not write the same checkpoints'
      )

  def release(self) -> None:
    if self._fd is None:
      return
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    try:
      if _same_run(_parse(_read_all(self._fd)), self._owner):
        with self._write_lock:
          os.ftruncate(self._fd, 0)
    except OSError:
      pass  # e.g. a full disk: the flock goes with the process, the lease expires
    finally:
      os.close(self._fd)  # drops the flock
      self._fd = None
      if self._dir_fd is not None:
        os.close(self._dir_fd)
        self._dir_fd = None

  def _file_is_ours(self) -> bool:
    """Whether the lock's path still names the file this run flocked."""
    try:
      return _inode(os.stat(self.path)) == self._inode
    except FileNotFoundError:
      return False

  def _reclaim(self) -> bool:
    """The lock file was deleted or replaced. While this run holds the directory's flock no
    other run on this host can hold the workdir, so the file now on the path is taken (and
    this run's record written there), unless a live run holds it (another host's: the flock
    does not reach there). Returns whether this run holds the path's file again."""
    if self._dir_fd is None:
      return False
    with self._write_lock:  # the heartbeat thread and the training thread may both get here
      if self._file_is_ours():
        return True
      try:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      except OSError:
        return False
      flock = _try_flock(fd)
      holder = _parse(_read_all(fd))
      if flock == 'busy' or (
        holder is not None
        and not _same_run(holder, self._owner)
        and self._is_live(holder, flock_works=flock == 'held')
      ):
        os.close(fd)
        return False
      previous, self._fd = self._fd, fd
      self._inode = _inode(os.fstat(fd))
      os.close(previous)
      self._write(self._owner)
    print(
      f'warning: {self.path} was deleted or replaced while this run held the workdir; no '
      'other run holds it (this run holds the flock of the workdir itself): written again',
      file=sys.stderr,
      flush=True,
    )
    return True

  def _is_live(self, holder: dict, flock_works: bool, fd: Optional[int] = None) -> bool:
    """Whether `holder`, found in the file although its flock is free, still owns the
    workdir.

    Another host's clock may be off: its heartbeat is trusted as a time only while it lies
    within a lease of this host's clock, either way. Outside that (a clock ahead: a heartbeat
    in the future; a clock behind, or a dead run: one older than a lease) the record is
    watched for two of its heartbeat intervals on this host's monotonic clock (`fd`, the lock
    file): a live owner rewrites it within one, a dead one never does. So a dead lock from a
    host whose clock is ahead costs this wait (60 s by default), not the skew plus a lease,
    and a live owner whose clock is behind is not taken for dead."""
    if holder.get('host') == socket.gethostname():
      # A live owner on this host would hold the flock. Only where the filesystem has no flock
      # does its pid tell (a pid seen after a restart may belong to another process).
      return not flock_works and holder.get('pid') != os.getpid() and _pid_alive(holder.get('pid'))
    if abs(_age(holder)) < self._lease_s:
      return True
    if fd is None:
      return False  # the reclaim path: a lease-old record is stale, as before
    return _beats_while_watched(fd, holder)

  def _in_use_message(self, holder: Optional[dict], why: str) -> str:
    return (
      f'workdir {self.workdir} is in use by another run ({_describe(holder)}), which '
      f'{why}: stop that run or use another --workdir (the lock is {self.path}; a dead '
      f"run's lock on another host expires {self._lease_s:.0f} s after its last heartbeat)"
    )

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_s):
      try:
        if not self._file_is_ours() and not self._reclaim():
          return  # deleted or replaced by a live run: `check` reports it at the next checkpoint
        with self._write_lock:
          holder = _parse(_read_all(self._fd))
        if not _same_run(holder, self._owner):
          return  # taken over: `check` reports it at the next checkpoint
        self._owner['heartbeat'] = time.time()
        self._write(self._owner)
      except OSError:
        pass  # a full or flaky disk: keep trying; the lease is long

  def _write(self, owner: dict) -> None:
    # One fixed-size write, never a truncation first: another host reading the file mid-write
    # sees the old record or the new one, never an empty file.
    data = json.dumps(owner).encode().ljust(_RECORD_BYTES)
    with self._write_lock:
      os.pwrite(self._fd, data, 0)
      os.ftruncate(self._fd, len(data))
      os.fsync(self._fd)


def acquire_for_run(workdir: str, **kwargs: Any) -> Optional[WorkdirLock]:
  """Process 0 takes the workdir's lock for the whole run; in a multi-process run every
  process learns whether it got it and raises the same WorkdirInUseError if not. Returns the
  lock on process 0, None on the others."""
  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock = WorkdirLock(workdir, **kwargs).acquire()
    except (WorkdirInUseError, WorkdirError) as e:
      error = e
  if jax.process_count() > 1:
    refused = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
    if int(refused) and error is None:
      error = WorkdirInUseError(
        f"workdir {os.path.abspath(workdir)} cannot be taken (process 0's error says why)"
      )
  if error is not None:
    raise error
  return lock


def _try_flock(fd: int) -> str:
  """'held' (we now hold the exclusive flock), 'busy' (another open file holds it) or
  'unsupported' (this filesystem has no flock; the pid and the lease still apply)."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return 'held'
  except BlockingIOError:
    return 'busy'
  except OSError as e:
    # EBADF: NFS emulates flock with a write lock, which a directory opened to read cannot take.
    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF):
      return 'unsupported'
    raise


def held(workdir: str, lease_s: float = LEASE_S) -> bool:
  """Whether a live run holds `workdir` now, read without taking any lock (a flock taken even
  briefly to look could refuse a run starting at that moment): the recorded owner's pid is
  alive on this host, or, on another host, its heartbeat is younger than the lease."""
  holder = _read_holder(os.path.join(workdir, LOCK_FILE))
  if holder is None:
    return False
  if holder.get('host') == socket.gethostname():
    return _pid_alive(holder.get('pid'))
  return abs(_age(holder)) < lease_s  # a quick look: a skewed clock is judged by acquire


def _beats_while_watched(fd: int, holder: dict) -> bool:
  """Whether the record in `fd` changes within two of its owner's heartbeat intervals."""
  try:
    interval = float(holder.get('heartbeat_s', HEARTBEAT_S))
  except (TypeError, ValueError):
    interval = HEARTBEAT_S
  deadline = time.monotonic() + 2 * max(interval, 0.0)
  while time.monotonic() < deadline:
    time.sleep(min(1.0, max(interval / 4, 0.01)))
    now = _parse(_read_all(fd))
    if now is None or now.get('heartbeat') != holder.get('heartbeat'):
      return now is not None  # beat again: live; emptied: released
  return False


def _read_holder(path: str) -> Optional[dict]:
  """The owner recorded in the lock file at `path`, read without creating it."""
  try:
    with open(path, 'rb') as f:
      return _parse(f.read(1 << 16))
  except OSError:
    return None


def _inode(st: os.stat_result) -> tuple[int, int]:
  return st.st_dev, st.st_ino


def _read_all(fd: int) -> bytes:
  return os.pread(fd, 1 << 16, 0)


def _parse(data: bytes) -> Optional[dict]:
  """The owner recorded in the file; None if empty (released) or unreadable (a write cut
  short: no live run leaves it so, since each heartbeat rewrites it)."""
  try:
    holder = json.loads(data)
  except ValueError:
    return None
  return holder if isinstance(holder, dict) and 'pid' in holder else None


def _same_run(holder: Optional[dict], owner: Optional[dict]) -> bool:
  return (
    holder is not None
    and owner is not None
    and all(holder.get(k) == owner.get(k) for k in ('host', 'pid', 'started'))
  )


def _age(holder: dict) -> float:
  return time.time() - float(holder.get('heartbeat', 0.0))


def _pid_alive(pid: Any) -> bool:
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # exists, owned by another user
  return True


def _describe(holder: Optional[dict]) -> str:
  if holder is None:
    return 'owner unknown'
  started = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(holder.get('started', 0))))
  return f'pid {holder.get("pid")} on host {holder.get("host")}, started {started}'

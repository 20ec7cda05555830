"""Fault injection, the workdir: a second run on a workdir that a live run holds is refused in
one line and touches nothing; a lock left by a dead run does not block (same host: the flock
died with it; another host: its heartbeat lease expired); a run whose lock was taken over stops
instead of writing beside the new owner. (A restart after kill -9 on the same host is also
part of the kill test in test_faults_checkpoints.py.)"""

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import fault_support as fs
import pytest

from realformer_jax.train import workdir_lock
from realformer_jax.train.workdir_lock import WorkdirInUseError, WorkdirLock


@pytest.mark.slow  # two training CLIs in subprocesses: 41 s CPU measured (2026-11-26)
def test_a_second_run_on_a_held_workdir_is_refused_in_one_line(tmp_path):
  workdir = str(tmp_path / 'w')
  first = fs.start(workdir, faults='slow_eval:3:600')  # holds the workdir, paused at step 3
  try:
    fs.wait_for_line(first.stderr, r'^FAULT: evaluating step 3$', [])
    _wait_for(
      lambda: os.path.isfile(os.path.join(workdir, 'checkpoints', '2', 'commit_success.txt'))
    )
    before = _snapshot(workdir)  # the first run writes nothing more until it is resumed

    returncode, out, err = fs.run(workdir)

    assert returncode == 1, out + err
    started = r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d'
    fs.the_line(
      err,
      rf'error: workdir {re.escape(workdir)} is in use by another run \(pid '
      rf'{first.pid} on host {re.escape(socket.gethostname())}, started '
      rf'{started}\), which holds its lock: stop that run or use another '
      rf'--workdir \(the lock is {re.escape(workdir)}/run\.lock; a dead run\'s '
      r'lock on another host expires 300 s after its last heartbeat\)',
    )
    assert _snapshot(workdir) == before  # the refused run wrote nothing
    assert first.poll() is None  # and the first run goes on

    # Deleting the lock that looks stale changes nothing: the first run also holds the flock of
    # the workdir itself (it writes run.lock again at its next heartbeat, every 30 s).
    os.remove(os.path.join(workdir, 'run.lock'))
    fs.run_saying(
      workdir,
      1,
      rf'error: workdir {re.escape(workdir)} is in use by another run \(owner unknown\), which '
      r'holds its lock \(on the workdir itself: deleting run\.lock does not release it\): .*',
    )
    assert _snapshot(workdir) == before and not os.path.exists(os.path.join(workdir, 'run.lock'))
    assert first.poll() is None
  finally:
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=120)


def _wait_for(condition, timeout_s=120.0):
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, 'timed out'
    time.sleep(0.05)


def _snapshot(workdir):
  """Every file under `workdir` but the lock (whose heartbeat the live run rewrites)."""
  return {
    os.path.join(root, name): os.stat(os.path.join(root, name)).st_mtime_ns
    for root, _, names in os.walk(workdir)
    for name in names
    if name != 'run.lock'
  }


def _write_lock(workdir, **owner):
  os.makedirs(workdir, exist_ok=True)
  now = time.time()
  holder = dict(host=socket.gethostname(), pid=os.getpid(), started=now, heartbeat=now)
  holder.update(owner)
  with open(os.path.join(workdir, workdir_lock.LOCK_FILE), 'w') as f:
    json.dump(holder, f)


def test_a_live_run_on_another_host_holds_the_workdir_until_its_lease_expires(tmp_path):
  _write_lock(tmp_path, host='other-host', pid=4242, heartbeat=time.time() - 20)
  with pytest.raises(
    WorkdirInUseError,
    match=(
      r'^workdir \S+ is in use by another run \(pid 4242 on host other-host, started .+\), '
      r'which renewed its lease 2\d s ago \(a lease lasts 300 s\): stop that run or use '
      r'another --workdir'
    ),
  ):
    WorkdirLock(str(tmp_path)).acquire()

  # That host's run died: its lease expired, and its record does not change while watched
  # (for two of its heartbeat intervals, recorded with it).
  _write_lock(tmp_path, host='other-host', pid=4242, heartbeat=time.time() - 301, heartbeat_s=0.1)
  lock = WorkdirLock(str(tmp_path)).acquire()
  try:
    owner = json.load(open(tmp_path / workdir_lock.LOCK_FILE))
    assert (owner['host'], owner['pid']) == (socket.gethostname(), os.getpid())
  finally:
    lock.release()


def test_a_dead_lock_from_a_host_whose_clock_is_ahead_does_not_wait_for_the_skew(tmp_path):
  # Its last heartbeat lies an hour in this host's future: watched for two of its intervals
  # (0.2 s here, 60 s by default), it never changes, so it is stale now, not in an hour.
  _write_lock(tmp_path, host='other-host', pid=4242, heartbeat=time.time() + 3600, heartbeat_s=0.1)
  start = time.monotonic()
  WorkdirLock(str(tmp_path)).acquire().release()
  assert time.monotonic() - start < 5


def test_a_live_lock_from_a_host_with_a_skewed_clock_is_held(tmp_path):
  # A live owner an hour ahead (or behind) rewrites its record every interval: held.
  path = tmp_path / workdir_lock.LOCK_FILE
  for skew, word in ((3600, 'ahead of'), (-3600, 'behind')):
    _write_lock(
      tmp_path, host='other-host', pid=4242, heartbeat=time.time() + skew, heartbeat_s=0.2
    )
    stop = threading.Event()

    def beat(skew=skew):
      while not stop.wait(0.05):
        holder = json.load(open(path))
        holder['heartbeat'] = time.time() + skew
        data = json.dumps(holder).encode().ljust(512)
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, data, 0)
        os.close(fd)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
      with pytest.raises(
        WorkdirInUseError,
        match=rf'which renewed its lease while this run watched the lock \(its clock is 36\d\d s '
        rf'{word} this host\'s\)',
      ):
        WorkdirLock(str(tmp_path)).acquire()
    finally:
      stop.set()
      thread.join()


def test_a_lock_left_by_a_dead_run_on_this_host_does_not_block(tmp_path):
  # The pid of a process that has exited; the flock died with it (nobody holds it).
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  _write_lock(tmp_path, pid=dead.pid)
  WorkdirLock(str(tmp_path)).acquire().release()


def test_the_lock_is_held_until_released_and_released_empty(tmp_path):
  lock = WorkdirLock(str(tmp_path)).acquire()
  with pytest.raises(WorkdirInUseError, match=r'which holds its lock'):
    WorkdirLock(str(tmp_path)).acquire()  # another open file: the flock refuses it
  lock.release()
  assert os.path.getsize(tmp_path / workdir_lock.LOCK_FILE) == 0  # never deleted: emptied
  WorkdirLock(str(tmp_path)).acquire().release()


def test_the_heartbeat_renews_the_lease(tmp_path):
  lock = WorkdirLock(str(tmp_path), heartbeat_s=0.05).acquire()
  try:
    first = json.load(open(tmp_path / workdir_lock.LOCK_FILE))['heartbeat']
    time.sleep(0.3)
    assert json.load(open(tmp_path / workdir_lock.LOCK_FILE))['heartbeat'] > first
  finally:
    lock.release()


def test_a_run_whose_lock_was_taken_over_stops_before_its_next_save(tmp_path):
  lock = WorkdirLock(str(tmp_path), heartbeat_s=3600).acquire()
  try:
    lock.check()  # still ours
    # What a run on another host writes after our heartbeat stalled for a whole lease.
    with open(tmp_path / workdir_lock.LOCK_FILE, 'r+') as f:
      f.truncate(0)
      json.dump(dict(host='other-host', pid=99, started=1.0, heartbeat=time.time()), f)
    with pytest.raises(
      WorkdirInUseError,
      match=(
        r'^\S+: another run took over the workdir lock \(pid 99 on host other-host, started '
        r'.+\) while this one ran \(its heartbeat stalled for over 300 s\); stopped without '
        r'saving so the two runs do not write the same checkpoints$'
      ),
    ):
      lock.check()
  finally:
    lock.release()
  assert json.load(open(tmp_path / workdir_lock.LOCK_FILE))['pid'] == 99  # not ours to clear


def _remove_or_replace(path, how):
  """What a user does to a lock that looks stale: delete it, or put another file there."""
  if how == 'deleted':
    os.remove(path)
  else:
    path.with_name('other').write_text('')
    os.replace(path.with_name('other'), path)


@pytest.mark.parametrize('how', ['deleted', 'replaced'])
def test_a_deleted_or_replaced_lock_file_refuses_a_newcomer_and_is_written_again(
  tmp_path, capsys, how
):
  """The holder also flocks the workdir directory, which deleting run.lock does not release:
  a newcomer is refused, and the holder writes its record on the path again."""
  lock = WorkdirLock(str(tmp_path), heartbeat_s=0.05).acquire()
  path = tmp_path / workdir_lock.LOCK_FILE
  try:
    _remove_or_replace(path, how)
    with pytest.raises(
      WorkdirInUseError,
      match=r'^workdir \S+ is in use by another run \((owner unknown|pid \d+ .*)\), which holds '
      r'its lock',
    ):
      WorkdirLock(str(tmp_path)).acquire()
    _wait_for(lambda: path.exists() and os.path.getsize(path) > 0)  # the next heartbeat
    assert json.load(open(path))['started'] == lock._owner['started']
    lock.check()  # the holder goes on
    assert capsys.readouterr().err == (
      f'warning: {path} was deleted or replaced while this run held the workdir; no other '
      'run holds it (this run holds the flock of the workdir itself): written again\n'
    )
  finally:
    lock.release()
  WorkdirLock(str(tmp_path)).acquire().release()  # released: the next run starts


def test_a_lock_file_replaced_by_a_live_run_stops_its_holder(tmp_path):
  """Another host's run, which the directory's flock does not reach (a network filesystem),
  found no lock file and wrote its own: the holder stops before its next save."""
  lock = WorkdirLock(str(tmp_path), heartbeat_s=3600).acquire()
  path = tmp_path / workdir_lock.LOCK_FILE
  try:
    os.remove(path)
    _write_lock(tmp_path, host='other-host', pid=99)
    with pytest.raises(
      WorkdirInUseError,
      match=(
        rf'^{re.escape(str(path))} was deleted or replaced while this run held the '
        r'workdir, so another run may now hold it; stopped without saving so two runs '
        r'never write the same checkpoints'
      ),
    ):
      lock.check()
  finally:
    lock.release()
  assert json.load(open(path))['host'] == 'other-host'  # not ours to clear


def test_where_a_directory_cannot_be_flocked_a_deleted_lock_stops_its_holder(tmp_path, monkeypatch):
  """NFS flocks only files opened for writing: a newcomer on a deleted lock flocks a new file
  and starts, and the holder, which compares the path's inode with its own at every heartbeat
  and before each save, stops."""
  real_try_flock = workdir_lock._try_flock
  monkeypatch.setattr(
    workdir_lock,
    '_try_flock',
    lambda fd: 'unsupported' if stat.S_ISDIR(os.fstat(fd).st_mode) else real_try_flock(fd),
  )
  lock = WorkdirLock(str(tmp_path), heartbeat_s=0.05).acquire()
  path = tmp_path / workdir_lock.LOCK_FILE
  try:
    os.remove(path)
    newcomer = WorkdirLock(str(tmp_path)).acquire()
    try:
      time.sleep(0.2)  # heartbeats: the holder writes only into its own orphaned file
      assert json.load(open(path))['started'] == newcomer._owner['started']
      newcomer.check()  # the newcomer owns the workdir
      with pytest.raises(WorkdirInUseError, match=r'was deleted or replaced while this run'):
        lock.check()
    finally:
      newcomer.release()
  finally:
    lock.release()

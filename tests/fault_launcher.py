"""`python tests/fault_launcher.py ARGS` runs `python -m experiments.train ARGS` with faults
injected, for the fault-injection tests (test_faults_*.py). The faults are named by the
environment variable REALFORMER_TEST_FAULTS, a comma-separated list of:

  save_error:STEP:PHASE:ERRNO  the save of checkpoint STEP fails with OSError(ERRNO), in the
                               blocking part of the save (PHASE=blocking: the data iterator's
                               file, written before save() returns) or in its background commit
                               (PHASE=background: the commit marker, written by orbax's thread)
  slow_save:STEP:SECONDS       the background commit of checkpoint STEP prints
                               'FAULT: saving step STEP' on stderr, then sleeps SECONDS
  slow_eval:STEP:SECONDS       the evaluation at STEP prints 'FAULT: evaluating step STEP' on
                               stderr and sleeps SECONDS before it computes anything
  sigint_before_lock           a Ctrl-C (SIGINT) once the data is built, just before the run
                               takes the workdir: before training starts
  mkdir_denied_after_probe:STEP  the save of checkpoint STEP passes its probe, then orbax cannot
                               make the step's directory (PermissionError, as a checkpoints/
                               made read-only between the two)

Each fault is a monkeypatch at the place a real one would strike; nothing here is reachable
from the package itself.
"""

import errno
import os
import runpy
import signal
import sys
import time

import repo_paths

_REPO = repo_paths.REPO


def _marker(line: str) -> None:
  print(f'FAULT: {line}', file=sys.stderr, flush=True)


def _save_error(step: int, phase: str, code: int) -> None:
  error = OSError(code, os.strerror(code))
  tmp_dir = f'{step}.orbax-checkpoint-tmp'
  if phase == 'blocking':
    import grain._src.python.checkpoint.handler as grain_handler  # pylint: disable=g-import-not-at-top

    real_save = grain_handler.CheckpointHandler.save

    def save(self, directory, *args, **kwargs):
      if tmp_dir in str(directory):
        raise OSError(error.errno, error.strerror, str(directory))
      return real_save(self, directory, *args, **kwargs)

    grain_handler.CheckpointHandler.save = save
  elif phase == 'background':
    from orbax.checkpoint._src.path import async_path  # pylint: disable=g-import-not-at-top

    real_write_text = async_path.write_text

    async def write_text(path, text, *args, **kwargs):
      if tmp_dir in str(path) and str(path).endswith('commit_success.txt'):
        raise OSError(error.errno, error.strerror, str(path))
      return await real_write_text(path, text, *args, **kwargs)

    async_path.write_text = write_text
  else:
    raise ValueError(f'save_error phase {phase!r}')


def _slow_save(step: int, seconds: float) -> None:
  from realformer_jax.train import checkpointing  # pylint: disable=g-import-not-at-top

  real_record = checkpointing.Checkpointer._record_checksums  # pylint: disable=protected-access

  def record(self):
    if self._saving_step == step:  # pylint: disable=protected-access
      _marker(f'saving step {step}')
      time.sleep(seconds)
    return real_record(self)

  checkpointing.Checkpointer._record_checksums = record  # pylint: disable=protected-access


def _slow_eval(step: int, seconds: float) -> None:
  from realformer_jax.train import loop  # pylint: disable=g-import-not-at-top

  real_evaluate = loop.evaluate

  def evaluate(eval_step, state, *args):  # the rest as loop.evaluate takes them
    if int(state.step) == step:
      _marker(f'evaluating step {step}')
      time.sleep(seconds)
    return real_evaluate(eval_step, state, *args)

  loop.evaluate = evaluate


def _sigint_before_lock() -> None:
  from realformer_jax.train import loop  # pylint: disable=g-import-not-at-top

  def acquire_for_run(*args, **kwargs):
    del args, kwargs
    _marker('Ctrl-C')
    # A terminal's Ctrl-C raises KeyboardInterrupt; a process started in the background by a
    # non-interactive shell inherits SIGINT ignored, so put Python's own handler back first.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)  # Python raises KeyboardInterrupt here
    raise AssertionError('SIGINT was not delivered')

  loop.workdir_lock.acquire_for_run = acquire_for_run


def _mkdir_denied_after_probe(step: int) -> None:
  from orbax.checkpoint._src.path import atomicity  # pylint: disable=g-import-not-at-top

  real_create = atomicity.AtomicRenameTemporaryPath.create

  async def create(self, *args, **kwargs):
    path = str(self.get())
    if os.path.basename(path).startswith(f'{step}.orbax-checkpoint-tmp'):
      _marker(f'making the directory of step {step} is denied')
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    return await real_create(self, *args, **kwargs)

  atomicity.AtomicRenameTemporaryPath.create = create


_FAULTS = {
  'save_error': lambda step, phase, code: _save_error(int(step), phase, getattr(errno, code)),
  'slow_save': lambda step, seconds: _slow_save(int(step), float(seconds)),
  'slow_eval': lambda step, seconds: _slow_eval(int(step), float(seconds)),
  'sigint_before_lock': _sigint_before_lock,
  'mkdir_denied_after_probe': lambda step: _mkdir_denied_after_probe(int(step)),
}


def main() -> None:
  sys.path.insert(0, _REPO)
  for fault in filter(None, os.environ.get('REALFORMER_TEST_FAULTS', '').split(',')):
    name, *args = fault.split(':')
    _FAULTS[name](*args)
  sys.argv[0] = os.path.join(_REPO, 'experiments', 'train.py')
  runpy.run_module('experiments.train', run_name='__main__', alter_sys=True)


if __name__ == '__main__':
  main()

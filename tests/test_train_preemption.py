"""SIGTERM: the training process saves a checkpoint at the step it reached and exits 0; a
restart resumes from there."""

import re
import signal
import subprocess

from train_fixtures import cli_flags, run_train_cli

# Long enough that only SIGTERM ends it; a log line per step tells us training is under way.
_FOREVER = dict(train__num_train_steps=100_000, train__warmup_steps=10, train__log_every_steps=1,
                train__eval_every_steps=100_000, train__checkpoint_every_steps=100_000)


def test_sigterm_saves_and_exits_cleanly_then_resumes(tmp_path):
  proc = run_train_cli(tmp_path, *cli_flags(**_FOREVER), stderr=subprocess.STDOUT)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if re.match(r'step +3/', line):
      proc.send_signal(signal.SIGTERM)
      break
  rest, _ = proc.communicate(timeout=120)
  output = ''.join(lines) + rest
  assert proc.returncode == 0, output
  saved = re.search(r'SIGTERM: saved a checkpoint at step (\d+); exiting\.', output)
  assert saved, output
  step = int(saved.group(1))
  assert step >= 3
  assert (tmp_path / 'checkpoints' / str(step) / 'state').is_dir()
  assert 'Traceback' not in output

  proc = run_train_cli(tmp_path, *cli_flags(**dict(_FOREVER, train__stop_at_step=step + 2)),
                       stderr=subprocess.STDOUT)
  output, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0, output
  assert f'resumed from the checkpoint at step {step} ' in output
  assert re.search(rf'step +{step + 1}/', output) and re.search(rf'step +{step + 2}/', output)
  assert not re.search(rf'step +{step}/', output)  # nothing before the checkpoint is redone
  assert sorted(int(p.name) for p in (tmp_path / 'checkpoints').iterdir()) == [step, step + 2]

"""Commands the tests run to their end in a subprocess: from the repository root (or `cwd`),
their output captured as text. A script on forced CPU devices reports by printing one line
'RESULTS <json>' (`script_results`)."""

import json
import subprocess
import sys

import compile_settings
import repo_paths


def run(command: list[str], env=None, cwd=repo_paths.REPO, timeout: float = 600):
  """The finished `command` (subprocess.CompletedProcess, stdout and stderr as text)."""
  return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def module(name: str, *args: str, env=None, timeout: float = 600):
  """The finished `python -m name args...`."""
  return run([sys.executable, '-m', name, *args], env=env, timeout=timeout)


def succeeded(done, tail: int = 3000):
  """`done`, which exited 0 (else the test fails with the end of its stderr)."""
  assert done.returncode == 0, done.stderr[-tail:]
  return done


def on_cpu_devices(script: str, devices: int, timeout: float = 600):
  """`python -c script` on `devices` forced CPU devices (compile_settings), exited 0."""
  env = compile_settings.cpu_devices_env(devices)
  return succeeded(run([sys.executable, '-c', script], env=env, timeout=timeout))


def script_results(script: str, devices: int, timeout: float = 600):
  """What a script on forced CPU devices printed after 'RESULTS ', as JSON."""
  done = on_cpu_devices(script, devices, timeout)
  return json.loads(done.stdout.split('RESULTS ', 1)[1])

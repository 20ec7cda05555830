"""A plan is data: importing realformer_jax.studies.plan and loading every plan file (each of
its scales, through the runner as the command does) imports no JAX or Flax, so that
`python -m experiments.study --plan=typo` answers its one line at once (issue 67: it took
seconds while `Scale` lived beside the training code in studies/study.py)."""

import os
import subprocess
import sys

import repo_paths

PLANS = os.path.join(repo_paths.REPO, 'realformer_jax', 'studies', 'plans')

# In a fresh interpreter: this test process has long imported JAX.
_LOAD_EVERY_PLAN = """
import os, sys
import realformer_jax.studies.plan
from realformer_jax.studies import runner
names = sorted(f[:-3] for f in os.listdir(sys.argv[1]) if f.endswith('.py') and f != '__init__.py')
for name in names:
  for scale in runner.load_module(name).PLANS:
    assert runner.load_plan(name, scale).name
print(len(names), sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax')))
"""


def test_loading_every_plan_imports_no_jax():
  out = subprocess.run(
    [sys.executable, '-c', _LOAD_EVERY_PLAN, PLANS],
    cwd=repo_paths.REPO,
    env=dict(os.environ, PYTHONPATH=repo_paths.REPO),
    capture_output=True,
    text=True,
    check=True,
  )
  count, modules = out.stdout.split(' ', 1)
  assert int(count) >= 5 and modules.strip() == '[]', out.stdout

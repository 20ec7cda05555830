"""Only the core dependencies for the model, the kernels, the train step and the device check
(realformer_jax/extras.py): a subprocess where the `train` extra's modules cannot be imported
builds and runs a train step; a command that needs one of them stops with one line naming the
extra; extras.OPTIONAL names the distributions and extras pyproject.toml declares."""

import os
import subprocess
import sys
import textwrap

import pytest
import repo_paths

from realformer_jax import extras

REPO = repo_paths.REPO

# Raises ModuleNotFoundError for the optional modules (and TensorFlow, transformers, torch), as
# in a venv with only `pip install -e .`.
BLOCKER = textwrap.dedent(f"""
  import sys
  BLOCKED = {sorted(set(extras.OPTIONAL) | {'tensorflow', 'transformers', 'torch', 'array_record'})}

  class Blocker:
    def find_spec(self, name, path=None, target=None):
      if name.split('.')[0] in BLOCKED:
        raise ModuleNotFoundError(f'No module named {{name!r}}', name=name)
      return None

  sys.meta_path.insert(0, Blocker())
""")

# What the core install promises to import, none of which loads an optional module.
IMPORTS = textwrap.dedent("""
  import sys
  import realformer_jax.train
  import realformer_jax.kernels
  import realformer_jax.train.pretraining
  import realformer_jax.commands.device_check  # the device check's own imports
  from realformer_jax.bench import steps
  from realformer_jax import extras

  print('loaded:', sorted(m for m in extras.OPTIONAL if m in sys.modules))
  try:
    extras.require('grain')
  except extras.MissingExtra as e:
    print('missing:', e)
""")

# A two-layer RealFormer's train step, built as training builds it, run twice.
TRAIN_STEP = textwrap.dedent("""
  import jax
  jax.config.update('jax_disable_most_optimizations', True)  # as conftest.py: a tiny model
  from realformer_jax.bench import steps

  shape = steps.Shape('tiny', hidden=32, layers=2, heads=2, vocab=64, seq_len=16, batch=2,
                      predictions=4)
  config = steps.train_config(shape, ln_placement='realformer')
  config.train.warmup_steps = 1
  step = steps.make_project_step(config, steps.make_batch(shape))
  state = step.state
  with step.context():
    for _ in range(2):
      state, metrics = step.fn(state, step.batch, step.rng)
  print('loss', float(jax.device_get(metrics['mlm_loss_sum'])), 'step', int(state.step))
""")


@pytest.fixture
def blocked_env(tmp_path):
  (tmp_path / 'sitecustomize.py').write_text(BLOCKER)
  return dict(os.environ, PYTHONPATH=f'{tmp_path}{os.pathsep}{REPO}', JAX_PLATFORMS='cpu')


def _run(code, env):
  result = subprocess.run(
    [sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout.splitlines()


@pytest.mark.slow
def test_the_library_imports_with_only_the_core_dependencies(blocked_env):
  assert _run(IMPORTS, blocked_env) == [
    'loaded: []',
    "missing: grain is not installed: this needs the 'train' extra: pip install -e '.[train]'",
  ]


@pytest.mark.slow
def test_the_train_step_runs_with_only_the_core_dependencies(blocked_env):
  [line] = _run(TRAIN_STEP, blocked_env)
  loss, step = line.split()[1::2]
  assert float(loss) > 0 and step == '2', line


@pytest.mark.slow
def test_a_command_needing_the_extra_says_so_in_one_line(blocked_env, tmp_path):
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.train',
      '--config=configs/tiny.py',
      f'--workdir={tmp_path / "run"}',
    ],
    cwd=REPO,
    env=blocked_env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 1
  assert result.stderr.strip().splitlines() == [
    "error: tensorflow-datasets is not installed: this needs the 'train' extra: "
    "pip install -e '.[train]'"
  ], result.stderr[-3000:]


def test_require_names_the_extra_and_passes_other_errors_through(monkeypatch):
  monkeypatch.setitem(sys.modules, 'sacrebleu', None)  # import of sacrebleu halted
  with pytest.raises(extras.MissingExtra, match=r"sacrebleu is not installed: .*'\.\[train\]'"):
    extras.require('sacrebleu')
  stand_in = extras.lazy('sacrebleu')  # nothing imported until used
  with pytest.raises(extras.MissingExtra):
    stand_in.BLEU  # noqa: B018
  with pytest.raises(ModuleNotFoundError) as raised:  # not an optional one: the plain error
    extras.require('no_such_module_here')
  assert not isinstance(raised.value, extras.MissingExtra)


def test_require_without_hides_a_module_only_while_importing(tmp_path, monkeypatch):
  # How realformer_jax.train.loop keeps tensorboardX from importing torch (~3 s of CPU).
  (tmp_path / 'optional_dep_for_test.py').write_text('')
  (tmp_path / 'user_of_dep_for_test.py').write_text(
    'try:\n  import optional_dep_for_test\n  HAS_DEP = True\n'
    'except ImportError:\n  HAS_DEP = False\n'
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  for name in ('optional_dep_for_test', 'user_of_dep_for_test'):
    monkeypatch.delitem(sys.modules, name, raising=False)
  stand_in = extras.lazy('user_of_dep_for_test', without=('optional_dep_for_test',))
  assert stand_in.HAS_DEP is False
  assert 'optional_dep_for_test' not in sys.modules  # unhidden: importable again afterwards
  import optional_dep_for_test  # noqa: F401  pylint: disable=import-outside-toplevel

  monkeypatch.delitem(sys.modules, 'user_of_dep_for_test')
  assert extras.require('user_of_dep_for_test', without=('optional_dep_for_test',)).HAS_DEP


def test_the_optional_modules_are_in_the_extras_pyproject_declares():
  tomllib = pytest.importorskip('tomllib')  # Python >= 3.11
  with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
    project = tomllib.load(f)['project']
  declared = {
    extra: {r.split('>')[0].split('=')[0].split('<')[0].strip().lower() for r in requirements}
    for extra, requirements in project['optional-dependencies'].items()
  }
  for module, (distribution, extra) in extras.OPTIONAL.items():
    assert distribution.lower() in declared[extra], (module, distribution, extra)
  core = {r.split('>')[0].split('=')[0].strip().lower() for r in project['dependencies']}
  assert 'orbax-checkpoint' in core and not core & {d.lower() for d, _ in extras.OPTIONAL.values()}

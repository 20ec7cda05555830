"""The README's Python examples run as written."""

import ast
import pathlib
import re

import pytest
import repo_paths

README = pathlib.Path(repo_paths.REPO) / 'README.md'


def _python_blocks():
  return re.findall(r'```python\n(.*?)```', README.read_text(), flags=re.S)


@pytest.mark.slow
def test_readme_import_example_runs(capsys):
  blocks = _python_blocks()
  assert blocks, 'README has no python example'
  namespace: dict = {}
  exec(compile(blocks[0], 'README.md', 'exec'), namespace)  # noqa: S102
  assert '(2, 16, 5)' in capsys.readouterr().out


def test_readme_commands_match_ci():
  text = README.read_text()
  ci = (README.parent / '.ci' / 'run').read_text()
  test_command = re.search(r'^python3 -m venv .venv && .*pytest.*$', ci, flags=re.M).group(0)
  assert test_command in text, 'README test command differs from .ci/run'


@pytest.mark.slow
def test_readme_memory_analysis_example_runs(monkeypatch, capsys):
  # The example compiles the paper's Large step; here at the toy width of test_configs.py
  # (same depth, heads, remat, 'auto' accumulation), which is what the example's code path is.
  from toy_flags import TRAIN_TOY_FLAGS  # pylint: disable=import-outside-toplevel

  from realformer_jax.configs import realformer_large  # pylint: disable=import-outside-toplevel

  block = next(b for b in _python_blocks() if 'memory_analysis()' in b)
  paper_config = realformer_large.get_config

  def toy_config():
    config = paper_config()
    for key, value in TRAIN_TOY_FLAGS.items():
      section, field = key.split('.')
      config[section][field] = value
    return config

  monkeypatch.setattr(realformer_large, 'get_config', toy_config)
  exec(compile(block, 'README.md', 'exec'), {})  # noqa: S102
  assert 'temp_size_in_bytes' in capsys.readouterr().out


@pytest.mark.slow
def test_readme_nnx_example_runs(capsys):
  block = next(b for b in _python_blocks() if 'nnx' in b)
  exec(compile(block, 'README.md', 'exec'), {})  # noqa: S102
  losses = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
  assert len(losses) == 3 and losses[-1] < losses[0]

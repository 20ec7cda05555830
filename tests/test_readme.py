"""The README's Python examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / 'README.md'


def _python_blocks():
  return re.findall(r'```python\n(.*?)```', README.read_text(), flags=re.S)


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

"""docs/extending.md stays true: its backend record is the toy backend's, as the tests run it
(tests/kernels/test_kernel_backends.py), its data source is the toy source's, as the tests run it
(tests/data/test_data_sources.py), and every file it names exists."""

import pathlib
import re
import textwrap

import repo_paths

ROOT = pathlib.Path(repo_paths.REPO)
DOC = (ROOT / 'docs' / 'extending.md').read_text()


def _block(marker: str) -> str:
  (block,) = [b for b in re.findall(r'```python\n(.*?)```', DOC, flags=re.S) if marker in b]
  return textwrap.dedent(block)


def test_the_record_shown_is_the_toy_backends():
  toy = (ROOT / 'tests' / 'toy_backend' / '__init__.py').read_text()
  assert _block('Backend(') in toy


def test_the_source_shown_is_the_toy_sources():
  toy = (ROOT / 'tests' / 'toy_source.py').read_text()
  assert _block('def open_source') in toy


def test_every_file_named_exists():
  named = set(re.findall(r'`((?:realformer_jax|tests|experiments)/[\w/]+(?:\.py)?/?)`', DOC))
  named |= {
    f'realformer_jax/{p}'
    for p in re.findall(
      r'`((?:kernels|aot|interop|finetune|seq2seq|data|model|analysis)/\w+\.py)`', DOC
    )
  }
  assert len(named) > 15
  missing = sorted(p for p in named if '<' not in p and not (ROOT / p).exists())
  assert not missing, missing

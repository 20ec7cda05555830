"""Layers point down: realformer_jax/kernels imports nothing above it.

The kernels sit under the model (the model asks kernels/score_paths/score_path.py how to attend;
the einsum
attention is handed in, so kernels/ never imports model/), and over config.py alone. Every
import statement of every module under kernels/ counts, also one inside a function: a lazy
import up is still an import up. (This file covers kernels/ only; a test of the whole tree's
layers, if one is added, subsumes it.) And a backend's record is data: importing the kernels
loads no backend's lowering until a model runs through it.
"""

import ast
import os
import subprocess
import sys

import pytest
import repo_paths

ROOT = repo_paths.REPO
KERNELS = os.path.join(ROOT, 'realformer_jax', 'kernels')
# What kernels/ may import from the project: itself and the config layer below it.
ALLOWED = ('realformer_jax.kernels', 'realformer_jax.config')


def _module_name(path: str) -> str:
  relative = os.path.relpath(path, ROOT)[: -len('.py')].split(os.sep)
  return '.'.join(relative[:-1] if relative[-1] == '__init__' else relative)


def _imports(path: str) -> list[tuple[int, str]]:
  """(line, absolute module name) of every import in the file, at any depth."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  package = _module_name(path)
  if not path.endswith('__init__.py'):
    package = package.rpartition('.')[0]
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:  # relative: resolved against this file's package
        parts = package.split('.')
        base = '.'.join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
      found += [(node.lineno, f'{base}.{alias.name}') for alias in node.names]
  return found


def _kernel_files() -> list[str]:
  return sorted(
    os.path.join(folder, name)
    for folder, _, names in os.walk(KERNELS)
    for name in names
    if name.endswith('.py')
  )


def test_kernels_import_nothing_above_them():
  files = _kernel_files()
  assert len(files) > 20 and any(f.endswith(os.path.join('triton', 'attention.py')) for f in files)
  upward = [
    f'{os.path.relpath(path, ROOT)}:{line} imports {name}'
    for path in files
    for line, name in _imports(path)
    if name.startswith(('realformer_jax', 'experiments', 'benchmarks'))
    and not name.startswith(ALLOWED)
  ]
  assert not upward, '\n'.join(upward)


def test_the_rule_sees_a_lazy_import_up(tmp_path):
  # The checker itself: an import inside a function, and a relative one, are both found.
  source = 'def f():\n  from realformer_jax.model import encoder\nfrom .. import train\n'
  path = tmp_path / 'x.py'
  path.write_text(source)
  names = [name for _, name in _imports(str(path))]
  assert 'realformer_jax.model.encoder' in names and any(n.endswith('.train') for n in names)


def test_only_a_backend_record_leads_to_its_kernels():
  # Outside a backend's own folder nothing imports its kernel modules (the record names them,
  # imported on use), and the records import no jax: pure data.
  backends = os.path.join(KERNELS, 'backends')
  lowering = []
  for path in _kernel_files():
    own = os.path.dirname(path) if os.path.dirname(path) != backends else None
    for line, name in _imports(path):
      parts = name.split('.')
      if (
        name.startswith('realformer_jax.kernels.backends.')
        and len(parts) > 4
        and parts[4] in ('attention', 'qk_attention')
        and (own is None or os.path.basename(own) != parts[3])
      ):
        lowering.append(f'{os.path.relpath(path, ROOT)}:{line} imports {name}')
  assert not lowering, '\n'.join(lowering)
  records = [os.path.join(backends, 'registry.py')] + [
    os.path.join(backends, name, '__init__.py')
    for name in os.listdir(backends)
    if os.path.isfile(os.path.join(backends, name, '__init__.py'))
  ]
  assert len(records) >= 4
  for path in records:
    for line, name in _imports(path):
      assert not name.startswith(('jax', 'flax', 'numpy')), f'{path}:{line} imports {name}'


@pytest.mark.slow  # a fresh interpreter imports jax and flax (~5-10 s on 2 cores)
def test_importing_the_kernels_loads_no_backend_lowering():
  # A CPU-only install imports the model and the kernels without any backend's kernel module
  # (imported on use, when a model first runs through that backend).
  code = (
    'import sys, realformer_jax.kernels as k; '
    'assert len(k.backends.registered()) >= 3; '
    "print(sorted(m for m in sys.modules if m.startswith('realformer_jax.kernels.backends.') "
    "and m.rsplit('.', 1)[-1] in ('attention', 'qk_attention')))"
  )
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=ROOT)
  out = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, env=env, cwd=ROOT, check=True
  )
  assert out.stdout.strip() == '[]', out.stdout

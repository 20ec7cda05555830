"""0 import cycles: between the repository's packages (each of realformer_jax's sub-packages:
model, kernels, train, ..., commands, studies, configs; the top-level modules config, units, ...
are one node; experiments and benchmarks), and between the modules inside one package (a
package's __init__ is one module there). Read from the source with ast, nothing imported: every
import counts, also one inside a function or a relative one. A package's __init__ counts as part
of it, except realformer_jax/__init__.py, which only re-exports public names: an import through
it (`from realformer_jax import MaskedLM`) counts as one of the module that defines the name.
"""

import ast
import functools
import os

import repo_paths

REPO = repo_paths.REPO
PACKAGES = ('realformer_jax', 'experiments', 'benchmarks')
ROOT_INIT = os.path.join('realformer_jax', '__init__.py')
# Upward imports tolerated (none: the kernel self-check now lives in analysis/kernel_check.py,
# above the model).
ALLOWED: set = set()


def _module_name(path: str) -> str:
  parts = os.path.splitext(path)[0].split(os.sep)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


@functools.cache  # parsed once for the package and the module graphs
def _sources() -> dict:
  """Module name -> (repository-relative path, parsed tree), for every .py of PACKAGES."""
  found = {}
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(REPO, package)):
      for name in sorted(files):
        if name.endswith('.py'):
          path = os.path.relpath(os.path.join(folder, name), REPO)
          with open(os.path.join(REPO, path), encoding='utf-8') as f:
            found[_module_name(path)] = (path, ast.parse(f.read(), path))
  return found


def node(module: str) -> str:
  """The graph node of a module: realformer_jax.<sub-package>, or the top-level package."""
  parts = module.split('.')
  if parts[0] == 'realformer_jax' and len(parts) > 1:
    return 'realformer_jax.' + parts[1]
  return parts[0]


def _imported_modules(path: str, tree: ast.AST, modules: dict, reexports: dict) -> dict:
  """{repository module: line} of what one file imports (a name imported from a package resolves
  to its sub-module when there is one, and through realformer_jax's re-exports; a relative
  import against the file's own package)."""
  package = _module_name(path)
  if not path.endswith('__init__.py'):
    package = package.rpartition('.')[0]
  found = {}
  for item in ast.walk(tree):
    if isinstance(item, ast.Import):
      for alias in item.names:
        found.setdefault(alias.name, item.lineno)
    elif isinstance(item, ast.ImportFrom):
      base = item.module or ''
      if item.level:
        parts = package.split('.')
        base = '.'.join(parts[: len(parts) - item.level + 1] + ([base] if base else []))
      for alias in item.names:
        full = f'{base}.{alias.name}'
        if full in modules:
          target = full
        elif base == 'realformer_jax' and alias.name in reexports:
          target = reexports[alias.name]
        else:
          target = base
        found.setdefault(target, item.lineno)
  return {m: line for m, line in found.items() if m.split('.')[0] in PACKAGES}


def module_graph() -> dict:
  """Module -> {module: 'a.py:LINE imports b'} for every import of one repository module by
  another (realformer_jax/__init__.py's lazy re-exports left out: see the docstring)."""
  sources = _sources()
  reexports = {}
  for item in ast.walk(sources['realformer_jax'][1]):
    if isinstance(item, ast.ImportFrom) and item.module:
      reexports.update({alias.asname or alias.name: item.module for alias in item.names})
  graph = {}
  for module, (path, tree) in sources.items():
    edges = graph.setdefault(module, {})
    if path == ROOT_INIT:
      continue
    for target, line in sorted(_imported_modules(path, tree, sources, reexports).items()):
      if target != module:
        edges[target] = f'{path}:{line} imports {target}'
  return graph


def package_graph() -> dict:
  """Node -> {node: 'a.py:LINE imports b'} for every import between two different nodes."""
  graph = {}
  for module, edges in module_graph().items():
    out = graph.setdefault(node(module), {})
    for target, why in edges.items():
      if node(target) != node(module) and (why.split(':')[0], node(target)) not in ALLOWED:
        out.setdefault(node(target), why)
  return graph


def cycles(graph: dict) -> list:
  """The strongly connected components with more than one node (Tarjan), each sorted."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, {}):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def _explain(graph: dict, component: list) -> str:
  return '; '.join(graph[a][b] for a in component for b in sorted(graph[a]) if b in component)


def test_no_cycle_between_packages():
  graph = package_graph()
  assert {
    'realformer_jax.model',
    'realformer_jax.train',
    'experiments',
    'realformer_jax.studies',
  } <= set(graph)
  found = cycles(graph)
  assert not found, '\n'.join(f'{c}: {_explain(graph, c)}' for c in found)


def test_no_cycle_between_modules():
  # Inside one package too: two modules that import each other (even lazily, inside a
  # function) are one piece of knowledge split in two; the shared piece goes below both.
  graph = module_graph()
  assert 'realformer_jax.analysis.kernel_check' in graph
  found = cycles(graph)
  assert not found, '\n'.join(f'{c}: {_explain(graph, c)}' for c in found)


def test_the_module_graph_sees_a_lazy_and_a_relative_import():
  tree = ast.parse('def f():\n  from realformer_jax.model import encoder\nfrom . import units\n')
  modules = {'realformer_jax.model.encoder': None, 'realformer_jax.units': None}
  found = _imported_modules(os.path.join('realformer_jax', 'config.py'), tree, modules, {})
  assert found == {'realformer_jax.model.encoder': 2, 'realformer_jax.units': 3}


def test_the_checker_finds_a_cycle():
  graph = {'a': {'b': 'a.py imports b'}, 'b': {'c': '...'}, 'c': {'a': '...'}, 'd': {'a': ''}}
  assert cycles(graph) == [['a', 'b', 'c']]
  assert cycles({'a': {'b': ''}, 'b': {}}) == []


# The top of the house, and what may import each part of it: the commands over the studies, both
# over the library; the shipped configs are read by the commands (and named by path). Nothing
# else in realformer_jax imports them, even lazily; the repository's experiments/ and
# benchmarks/ sit beside the top, outside the package.
TOP = {
  'realformer_jax.commands': (),
  'realformer_jax.studies': ('realformer_jax.commands',),
  'realformer_jax.configs': ('realformer_jax.commands', 'realformer_jax.studies'),
}


def test_only_the_top_imports_the_commands_studies_and_configs():
  graph = package_graph()
  assert set(TOP) <= set(graph)
  up = [
    why
    for source, edges in graph.items()
    if source not in ('experiments', 'benchmarks')
    for target, why in edges.items()
    if target in TOP and source not in TOP[target]
  ]
  assert not up, '\n'.join(up)


def test_the_package_imports_nothing_outside_it():
  # Installed, realformer_jax is all there is (pyproject.toml): an import of the repository's
  # experiments/ or benchmarks/ from inside it, even lazily, fails for every user of the wheel.
  graph = package_graph()
  outside = [
    why
    for source, edges in graph.items()
    if source.startswith('realformer_jax')
    for target, why in edges.items()
    if not target.startswith('realformer_jax')
  ]
  assert not outside, '\n'.join(outside)

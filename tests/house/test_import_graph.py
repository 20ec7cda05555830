"""0 import cycles between the repository's packages: each of realformer_jax's sub-packages
(model, kernels, train, ...; the top-level modules config, units, ... are one node),
experiments, benchmarks, studies and configs. Read from the source with ast, nothing imported:
every import counts, also one inside a function. A package's __init__ counts as part of it,
except realformer_jax/__init__.py, which only re-exports public names: an import through it
(`from realformer_jax import MaskedLM`) counts as one of the module that defines the name.
"""

import ast
import os

import repo_paths

REPO = repo_paths.REPO
PACKAGES = ('realformer_jax', 'experiments', 'benchmarks', 'studies', 'configs')
ROOT_INIT = os.path.join('realformer_jax', '__init__.py')
# Upward imports tolerated (none: the kernel self-check now lives in analysis/kernel_check.py,
# above the model).
ALLOWED: set = set()


def _module_name(path: str) -> str:
  parts = os.path.splitext(path)[0].split(os.sep)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


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


def _imported_modules(tree: ast.AST, modules: dict, reexports: dict) -> set:
  """The repository modules one file imports (a name imported from a package resolves to its
  sub-module when there is one, and through realformer_jax's re-exports)."""
  found = set()
  for item in ast.walk(tree):
    if isinstance(item, ast.Import):
      found.update(alias.name for alias in item.names)
    elif isinstance(item, ast.ImportFrom) and item.module and item.level == 0:
      for alias in item.names:
        full = f'{item.module}.{alias.name}'
        if full in modules:
          found.add(full)
        elif item.module == 'realformer_jax' and alias.name in reexports:
          found.add(reexports[alias.name])
        else:
          found.add(item.module)
  return {m for m in found if m.split('.')[0] in PACKAGES}


def package_graph() -> dict:
  """Node -> {node: 'a.py imports b'} for every import between two different nodes."""
  sources = _sources()
  reexports = {}
  for item in ast.walk(sources['realformer_jax'][1]):
    if isinstance(item, ast.ImportFrom) and item.module:
      reexports.update({alias.asname or alias.name: item.module for alias in item.names})
  graph = {}
  for module, (path, tree) in sources.items():
    edges = graph.setdefault(node(module), {})
    if path == ROOT_INIT:
      continue
    for target in _imported_modules(tree, sources, reexports):
      if node(target) != node(module) and (path, node(target)) not in ALLOWED:
        edges.setdefault(node(target), f'{path} imports {target}')
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
  assert {'realformer_jax.model', 'realformer_jax.train', 'experiments', 'studies'} <= set(graph)
  found = cycles(graph)
  assert not found, '\n'.join(f'{c}: {_explain(graph, c)}' for c in found)


def test_the_checker_finds_a_cycle():
  graph = {'a': {'b': 'a.py imports b'}, 'b': {'c': '...'}, 'c': {'a': '...'}, 'd': {'a': ''}}
  assert cycles(graph) == [['a', 'b', 'c']]
  assert cycles({'a': {'b': ''}, 'b': {}}) == []

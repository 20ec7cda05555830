"""Optional dependencies, loaded where they are used.

The model, the kernels, the train step and `experiments.device_check` need only the core
dependencies of pyproject.toml (jax, flax, optax, orbax-checkpoint, ml_collections, numpy). The
data stack (TFDS, grain, SentencePiece, pyarrow, pythonbible), TensorBoard event files
(tensorboardX) and BLEU (sacrebleu) belong to the `train` extra: a module that uses one holds a
`lazy(...)` stand-in that imports it on first use, so `import realformer_jax.train` works
without them, and a missing one is a `MissingExtra` naming the extra to install (the commands
of experiments/ print it as one `error:` line). `public_names` is the same idea for a package's
own names: its `__init__` lists where each lives, and a name is imported when first used.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Callable, Mapping

# Import name -> (distribution, extra of pyproject.toml that installs it). Checked against
# pyproject.toml by tests/house/test_optional_dependencies.py.
OPTIONAL = {
  'tensorflow_datasets': ('tensorflow-datasets', 'train'),
  'grain': ('grain', 'train'),
  'sentencepiece': ('sentencepiece', 'train'),
  'tensorboardX': ('tensorboardX', 'train'),
  'pyarrow': ('pyarrow', 'train'),
  'pythonbible': ('pythonbible', 'train'),
  'sacrebleu': ('sacrebleu', 'train'),
}


class MissingExtra(ImportError):
  """An optional dependency is not installed; the message names the extra that installs it."""


def require(name: str, without: tuple[str, ...] = ()) -> types.ModuleType:
  """The module `name` (e.g. 'grain' or 'tensorboardX.proto.event_pb2'), imported now, or a
  MissingExtra naming the extra that installs its distribution.

  `without`: modules that `name` imports only if they happen to be installed, hidden while it
  is imported (unless already imported), so that it takes its fallback instead of paying for
  them."""
  hidden = [module for module in without if module not in sys.modules]
  sys.modules.update(dict.fromkeys(hidden))  # None in sys.modules: `import x` raises ImportError
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    top = name.split('.')[0]
    if top not in OPTIONAL or (e.name or '').split('.')[0] != top:
      raise  # not one of ours, or ours failing on something else: the real error
    distribution, extra = OPTIONAL[top]
    raise MissingExtra(
      f"{distribution} is not installed: this needs the '{extra}' extra: "
      f"pip install -e '.[{extra}]'",
      name=top,
    ) from None
  finally:
    for module in hidden:
      if sys.modules.get(module, ...) is None:
        del sys.modules[module]


class _Lazy(types.ModuleType):
  """A module stand-in that imports the real module at its first attribute access."""

  def __init__(self, name: str, without: tuple[str, ...] = ()):
    super().__init__(name)
    self.__dict__['_module'] = None
    self.__dict__['_without'] = without

  def __getattr__(self, attribute: str):
    module = self.__dict__['_module']
    if module is None:
      module = self.__dict__['_module'] = require(self.__name__, self.__dict__['_without'])
    return getattr(module, attribute)


def lazy(name: str, without: tuple[str, ...] = ()) -> types.ModuleType:
  """A stand-in for `import name` at module level: the import happens on first use (`without`:
  as in `require`)."""
  return _Lazy(name, without)


def public_names(
  namespace: dict, where: Mapping[str, str], *, submodules: bool = False
) -> tuple[Callable[[str], object], Callable[[], list]]:
  """A package's `__getattr__` and `__dir__` (PEP 562) that import its public names on first
  use, so that importing the package (or one of its submodules) loads none of them:

      __getattr__, __dir__ = public_names(globals(), {'Name': 'package.module', ...})

  `where` maps each name to the module that defines it ('.module': a submodule of the
  package); with `submodules`, any other name is
  tried as a submodule of the package (`data.preparation`). A name once found is stored in
  the package's namespace, so later lookups do not come back here."""
  package = namespace['__name__']

  def __getattr__(name: str):
    if name in where:
      value = getattr(importlib.import_module(where[name], package), name)
    elif submodules:
      try:
        value = importlib.import_module(f'{package}.{name}')
      except ModuleNotFoundError as e:
        if e.name != f'{package}.{name}':
          raise
        raise AttributeError(f'module {package!r} has no attribute {name!r}') from None
    else:
      raise AttributeError(f'module {package!r} has no attribute {name!r}')
    namespace[name] = value
    return value

  def __dir__() -> list:
    return sorted(set(namespace) | set(where))

  return __getattr__, __dir__

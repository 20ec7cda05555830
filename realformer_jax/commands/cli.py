"""What every command shares: one-line errors, absl flag parsing that reports a bad flag in one
line (with the closest known name for a mistyped config field), --help that exits 0, and
--print_config.

Two CLI styles, by rule: a command that takes a training config (`--config=configs/*.py` with
`--config.a.b=v` overrides: train, finetune, translate, compile, prepare_data, export_hf,
sharding_memory, device_check, device_estimate) uses absl flags, because ml_collections'
config_flags is absl; a command without a config (the studies, the benchmarks) uses argparse.
Both exit 0 on --help (absl prints the module docstring and flags, argparse its first line)."""

import ast
import importlib.util
import os
import re
import sys
import traceback
import types

import ml_collections
from absl import app, flags, logging

from realformer_jax import config_docs
from realformer_jax import configs as shipped_configs

# Where --help sends a reader for the config's fields.
CONFIG_HELP = (
  'Config file (configs/*.py[:arg], or a shipped one by name: tiny, realformer_large, '
  'finetune/glue:mrpc); change a field with --config.<section>.<field>=value. '
  "Every field's value and meaning: --print_config. The meanings are the comments beside the "
  'fields in their dataclasses: model realformer_jax/config.py (ModelConfig), data '
  'realformer_jax/data/config.py, train / mesh / distributed realformer_jax/train/config.py, '
  'finetune realformer_jax/finetune/config.py, translation realformer_jax/seq2seq/config.py.'
)


def define_print_config():
  return flags.DEFINE_bool(
    'print_config',
    False,
    'Print the resolved config (after --config.a.b=v overrides), each field with its meaning, '
    'and exit.',
  )


def print_config(config, schemas, notes=(), field_notes=()):
  """--print_config: every field of the resolved `config`, one a line with its meaning
  (`field_notes`: config_docs.describe's)."""
  print(config_docs.describe(config, schemas, notes, field_notes))


def fail(message: str, status: int = 1):
  print(f'error: {message}', file=sys.stderr)
  sys.exit(status)


def start(argv, quiet_libraries: bool = False) -> None:
  """What an absl command does first: refuse positional arguments (every input is a flag) and,
  unless --verbosity was given, log at WARNING (orbax logs every save at INFO);
  `quiet_libraries` also silences the libraries' own logs of a failure the command reports in
  one line."""
  if len(argv) > 1:
    fail(f'unexpected arguments: {argv[1:]}')
  quiet_logs(quiet_libraries)


def quiet_logs(libraries: bool = False) -> None:
  """`start`'s logging half, for a command that has checks to make before it."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
    if libraries:
      from realformer_jax.train import library_noise  # pylint: disable=import-outside-toplevel

      library_noise.quiet()


def fail_after_training(message: str, status: int = 1):
  """`fail` for an error raised once training has started: the run has already waited for
  its saves and closed everything it opened, but a failed save can leave orbax coroutines
  behind whose teardown prints tracebacks at interpreter exit; exiting at once keeps the
  error line the last thing on stderr."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(status)  # pylint: disable=protected-access


# absl's help flags; absl itself prints the usage and exits 1 (an error status) for them.
_HELP = ('--help', '-help', '-?', '-h', '--helpshort')
_HELP_FULL = ('--helpfull', '-helpfull')


def parse_flags(argv):
  """absl parsing, with every failure (including an unknown --config.a.b key, which
  ml_collections reports as an AttributeError) as one line; --help prints the command's
  docstring and flags and exits 0."""
  help_args = [a for a in argv[1:] if a in _HELP or a in _HELP_FULL]
  if help_args:
    app.usage(shorthelp=help_args[0] in _HELP, writeto_stdout=True)
    sys.exit(0)
  argv = [shipped_config(a) for a in argv]
  check_config_files(argv)
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    match = re.search(r"(\w+)\\?'", str(e))
    key = match.group(1) if match else str(e)
    names = [a.split('=')[0] for a in argv if a.startswith('--config.')]
    name = next((n for n in names if key in n.split('.')), '--config.*')
    fail(f'{name}: unknown config field ({key!r}){_suggestion(argv, name, key)}')
  except flags.Error as e:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    fail(lines[0] if len(lines) == 1 else f'{lines[0]} {lines[-1]}')


# The shipped configs, in a clone and installed alike (package data of realformer_jax).
_SHIPPED = os.path.dirname(os.path.abspath(shipped_configs.__file__))


def shipped_config(arg: str) -> str:
  """`arg` with a `--config=` that is not a file here made the shipped config it names
  (`shipped_path`); any other argument as it is."""
  if not arg.startswith('--config='):
    return arg
  return '--config=' + shipped_path(arg[len('--config=') :])


def shipped_path(spec: str) -> str:
  """A config spec `PATH[:ARG]` whose PATH is not a file here made the shipped config it names,
  so the documented commands run as written from any directory: by the docs' path
  (`configs/bert.py:size=base`) or by name (`realformer_large`, `finetune/glue:mrpc`). A file of
  that name in the current directory wins; a name that is no shipped config stays as given."""
  path, colon, config_arg = spec.partition(':')
  if not path or os.path.isabs(path) or os.path.exists(path):
    return spec
  name = path[len('configs/') :] if path.startswith('configs/') else path
  shipped = os.path.join(_SHIPPED, name if name.endswith('.py') else f'{name}.py')
  if not os.path.isfile(shipped):
    return spec
  return f'{shipped}{colon}{config_arg}'


def shipped_names() -> list[str]:
  """The shipped configs by name, as --config takes them: 'bert', 'finetune/glue', ..."""
  return sorted(
    os.path.relpath(os.path.join(folder, name), _SHIPPED)[: -len('.py')]
    for folder, _, files in os.walk(_SHIPPED)
    for name in files
    if name.endswith('.py') and name != '__init__.py'
  )


def check_config_files(argv):
  """One line for a --config file that cannot be a config: ml_collections would show a
  syntax error, or an error raised while the file runs (a failed import, a NameError in
  get_config), as a long traceback, a file without get_config() as an unknown field, and a
  get_config() that returns no ConfigDict as a traceback later. The file is run here once
  (configs are cheap), then again by the flag."""
  for arg in argv:
    if not arg.startswith('--config='):
      continue
    path, *config_args = arg.split('=', 1)[1].split(':', 1)
    if path and not os.path.exists(path):  # neither a file here nor a shipped config's name
      names = shipped_names()
      guess = config_docs.did_you_mean(path.removeprefix('configs/').removesuffix('.py'), names)
      fail(
        f'--config {path}: no such file, nor a shipped config of that name{guess}; '
        f'shipped: {", ".join(names)}'
      )
    if not os.path.isfile(path):
      continue  # a directory: `loaded` names it
    with open(path, 'rb') as f:
      source = f.read()
    try:
      ast.parse(source, filename=path)
    except SyntaxError as e:
      fail(f'--config {path}: syntax error at line {e.lineno}: {e.msg}')
    # Run first: a file that raises while it runs (a failed import, a `from x import *` of a
    # broken module) is that error, whatever names it would have defined.
    try:
      module = _run_config_file(path)
    except Exception as e:  # pylint: disable=broad-except  # anything the user's code raises
      raised = f'{_where(e, path)}{type(e).__name__}: {_first_line(e)}'
      fail(f'--config {path}: raised while it ran: {raised}')
    if not callable(getattr(module, 'get_config', None)):
      fail(f'--config {path}: defines no get_config() (a config file returns its config from it)')
    try:
      config = module.get_config(*config_args)
    except Exception as e:  # pylint: disable=broad-except  # anything the user's code raises
      fail(f'--config {path}: {_where(e, path)}{type(e).__name__}: {_first_line(e)}')
    if not isinstance(config, ml_collections.ConfigDict):
      returned = 'None' if config is None else type(config).__name__
      fail(f'--config {path}: get_config() returned {returned}, not a ml_collections.ConfigDict')


def _run_config_file(path: str) -> types.ModuleType:
  """The config file run as a module of its own (not registered: the flag loads it again)."""
  spec = importlib.util.spec_from_file_location('_checked_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _where(error: BaseException, path: str) -> str:
  """'line N: ' of the innermost frame of `error` in the file `path`, or ''."""
  lines = [
    frame.lineno
    for frame in traceback.extract_tb(error.__traceback__)
    if os.path.abspath(frame.filename) == os.path.abspath(path)
  ]
  return f'line {lines[-1]}: ' if lines else ''


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [''])[0]


def _suggestion(argv, name: str, key: str) -> str:
  """' (did you mean ...?)' from the fields beside `key` in the --config file, if it loads."""
  path = name.split('.')[1:]  # '--config.train.lerning_rate' -> ['train', 'lerning_rate']
  config_args = [a.split('=', 1)[1] for a in argv if a.startswith('--config=')]
  try:  # the flag holds no value yet when its own overrides fail: load the file again
    node = flags.FLAGS['config'].parser.parse(config_args[-1])
    for part in path[: path.index(key)]:
      node = node[part]
    return config_docs.did_you_mean(key, node.keys())
  except Exception:  # pylint: disable=broad-except  # no loadable config: no hint
    return ''


def loaded(config):
  """The --config value, or one line naming why its file did not load (a config file that
  failed to load raises on first use, not when parsed)."""
  try:
    config.keys()
  except OSError as e:
    fail(f'--config: {str(e).strip().splitlines()[-1].strip()}')
  return config

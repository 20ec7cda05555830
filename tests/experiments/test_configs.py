"""Every command a config file's docstring shows runs as written and takes a training step.

The commands are read from the docstrings of realformer_jax/configs/**/*.py, so a new config is
covered as soon as it documents its command. Each runs in a subprocess exactly as written (DIR -> a
fresh directory), plus the toy flags of its entry point: the paper sizes keep their depth, head
counts, LN placement, remat, scan unrolling, vocabulary and 'auto' accumulation, and shrink only
width, sequence length, batch and step count, so a config that cannot start (a tokenizer the corpus
cannot support, a batch that cannot fit) fails here."""

import ast
import concurrent.futures
import os
import pathlib
import re
import shlex
import subprocess
import sys

import jit_cache
import pytest
import repo_paths
from data_fixtures import bible_config
from finetune_fixtures import MOCKED_MAIN
from toy_flags import EXPECTED_OUTPUT, TOY_ARGS, TOY_FLAGS

from realformer_jax import data

REPO = pathlib.Path(repo_paths.REPO)
# The shipped configs; a command names one as `--config=configs/<file>` (commands/cli.py).
CONFIGS = REPO / 'realformer_jax' / 'configs'

# Configs of TFDS catalog datasets (GLUE, SQuAD) run under tfds.testing.mock_data, with the
# test corpus' tokenizer (the random-init tokenizer would be trained on mocked text).
_MOCKED_CONFIGS = ('configs/finetune/glue.py', 'configs/finetune/squad.py')


def documented_commands():
  """(config file, command) for every `python -m ...` line in the configs' docstrings."""
  found = []
  for path in sorted(CONFIGS.rglob('*.py')):
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ''
    # A command may continue over lines ending in a backslash.
    for command in re.findall(
      r'^\s*(python -m .*?)(?<!\\)$', docstring.replace('\\\n', ' '), flags=re.M
    ):
      # As a shell runs it: a trailing `# comment` is not an argument.
      words = shlex.split(command, comments=True)
      found.append((str(path.relative_to(REPO)), shlex.join(words)))
  return found


COMMANDS = documented_commands()


def test_every_config_documents_its_command():
  documented = {path for path, _ in COMMANDS}
  for path in sorted(CONFIGS.rglob('*.py')):
    if path.name != '__init__.py':
      assert str(path.relative_to(REPO)) in documented, f'{path} shows no command to run it'


def test_every_documented_entry_point_has_toy_flags():
  for path, command in COMMANDS:
    module = shlex.split(command)[2]
    assert module in TOY_FLAGS, f'{path}: {command}: no toy flags for {module} in this test'


def _run(command: str, workdir: str) -> subprocess.CompletedProcess:
  argv = shlex.split(command.replace('DIR', workdir).replace('/tmp/realformer_tiny', workdir))
  module = argv[2]
  argv = [arg for arg in argv if not arg.startswith(('--out=', '--workdirs='))]
  argv += [arg.replace('DIR', workdir) for arg in TOY_ARGS.get(module, [])]
  flags = dict(TOY_FLAGS[module], **{'data.data_dir': bible_config().data_dir})
  mocked = any(config in command for config in _MOCKED_CONFIGS)
  if mocked:
    tokenizer = data.prepare(bible_config())
    flags.update({'data.vocab_file': tokenizer.source, 'model.vocab_size': tokenizer.vocab_size})
  argv += [f'--config.{key}={value}' for key, value in flags.items()]
  env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS='true', **jit_cache.env())
  argv[0] = sys.executable
  if mocked:  # python -c <run the module under mock_data> module args...
    argv[1:3] = ['-c', MOCKED_MAIN, module]
  return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_every_documented_config_command_takes_a_step(tmp_path):
  data.prepare(bible_config())  # the corpus once, before the subprocesses share it
  # Two at a time: most of each run is single-threaded start-up and compilation.
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    runs = {
      (path, command): pool.submit(_run, command, str(tmp_path / f'run{i}'))
      for i, (path, command) in enumerate(COMMANDS)
    }
  for (path, command), future in runs.items():
    result = future.result()
    output = result.stdout + result.stderr
    assert result.returncode == 0, f'{path}: {command}\n{output[-3000:]}'
    assert EXPECTED_OUTPUT[shlex.split(command)[2]] in output, f'{path}: {command}\n{output}'
  assert len(runs) >= 9


def test_paper_configs_train_at_the_paper_batch_with_auto_accumulation():
  from realformer_jax.configs import bert  # pylint: disable=import-outside-toplevel

  for size in bert.SIZES:
    config = bert.get_config(f'size={size},ln=realformer')
    assert config.train.grad_accum_steps == 'auto'
    assert config.train.global_batch_size == (256 if size == 'xlarge' else 512)
    assert config.data.vocab_size == config.model.vocab_size == 30522
    assert config.data.fit_vocab_to_corpus


@pytest.mark.parametrize(
  'arg, message', [('size=huge', "size='huge'"), ('ln=mid', "ln='mid'"), ('depth=3', "'depth=3'")]
)
def test_bert_config_rejects_bad_args(arg, message):
  from realformer_jax.configs import bert  # pylint: disable=import-outside-toplevel

  with pytest.raises(ValueError, match=re.escape(message)):
    bert.get_config(arg)


def test_finetune_configs_read_their_argument_and_take_tiny_py_model():
  # pylint: disable=import-outside-toplevel
  from realformer_jax.configs import tiny
  from realformer_jax.configs.finetune import glue, squad

  pretraining = tiny.get_config()
  config = glue.get_config('rte')  # no init: configs/tiny.py's model, randomly initialised
  assert config.data.dataset == 'glue/rte' and not config.finetune.init
  for field in ('num_layers', 'hidden_size', 'ln_placement', 'position_embedding'):
    assert config.model[field] == pretraining.model[field], field
  assert config.model.vocab_size == config.data.vocab_size == pretraining.data.vocab_size
  assert config.model.dropout_rate is None  # fine-tuning's own field: not taken from tiny.py
  config = squad.get_config('version=v2.0,init=/ckpt')
  assert config.data.dataset == 'squad/v2.0' and config.finetune.init == '/ckpt'
  assert config.model.num_layers is None  # from the checkpoint
  with pytest.raises(ValueError, match=re.escape("config arg 'depth=3'")):
    glue.get_config('mrpc,depth=3')

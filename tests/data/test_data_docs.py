"""Every command of docs/data.md and the README's "Your own corpus" runs as written, at toy
overrides, on a corpus this test writes: the text and JSONL runs train and evaluate (issue 29's
done-when), the Parquet run holds out a fraction, prepare_data prepares ahead."""

import concurrent.futures
import os
import re
import shlex
import subprocess
import sys

import jit_cache
import pytest
from data_fixtures import write_corpus
from toy_flags import EXPECTED_OUTPUT, TOY_FLAGS

from tests import scale_out_support as support

DOC = os.path.join(support.REPO, 'docs', 'data.md')
README = os.path.join(support.REPO, 'README.md')
EXPECTED = dict(EXPECTED_OUTPUT, **{'experiments.prepare_data': 'prepared corpus files-'})


def documented_commands() -> list[str]:
  """The `python -m ...` commands of docs/data.md's ```bash blocks and of the README's
  "Your own corpus" section (backslash lines joined), each once."""
  readme = open(README).read()
  section = readme[readme.index('## Your own corpus') :]
  text = open(DOC).read() + section[: section.index('\n## ')]
  commands = []
  for block in re.findall(r'```bash\n(.*?)```', text, flags=re.S):
    for command in re.findall(r'^(python -m .*)$', block.replace('\\\n', ' '), flags=re.M):
      commands.append(' '.join(command.split()))
  return list(dict.fromkeys(commands))


def _run(command: str, corpus: str, workdir: str, data_dir: str) -> subprocess.CompletedProcess:
  command = command.replace('corpus/', corpus + '/').replace('DIR', workdir)
  argv = shlex.split(command)
  argv[0] = sys.executable
  flags = dict(TOY_FLAGS['experiments.train'], **{'data.data_dir': data_dir})
  argv += [f'--config.{key}={value}' for key, value in flags.items()]
  env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS='true', **jit_cache.env())
  return subprocess.run(
    argv, cwd=support.REPO, env=env, capture_output=True, text=True, timeout=900
  )


def test_docs_show_text_jsonl_parquet_and_prepare_commands():
  commands = documented_commands()
  assert any("train_files='corpus/train-*.txt'" in c and 'experiments.train' in c for c in commands)
  assert any('train.jsonl' in c and 'text_feature=text' in c for c in commands)
  assert any('.parquet' in c for c in commands)
  assert any('experiments.prepare_data' in c for c in commands)


@pytest.mark.slow
def test_every_documented_corpus_command_runs(tmp_path):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  corpus = str(tmp_path / 'corpus')
  write_corpus(corpus)
  # 800 documents: 1% held out is ~8 of them.
  many = write_corpus(str(tmp_path / 'more'), train_files=1, docs_per_file=800, seed=1)
  pq.write_table(pa.table({'text': many['train-0.txt']}), os.path.join(corpus, 'train.parquet'))
  data_dir = str(tmp_path / 'cache')
  commands = documented_commands()
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    runs = {
      command: pool.submit(_run, command, corpus, str(tmp_path / f'run{i}'), data_dir)
      for i, command in enumerate(commands)
    }
  for command, future in runs.items():
    result = future.result()
    output = result.stdout + result.stderr
    assert result.returncode == 0, f'{command}\n{output[-3000:]}'
    assert EXPECTED[shlex.split(command)[2]] in output, f'{command}\n{output[-3000:]}'

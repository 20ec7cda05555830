"""Issue 68's second list, the edges left after its first pass, each through the real command
(experiments.finetune / prepare_data / train at toy size) and each ending in one line:

- `--config.finetune.init=WORKDIR` after a config file read without `init=` starts from the
  checkpoint's architecture (the random init's model.* the file set do not stand in its way);
- `finetune --print_config` prints the config first: no library log line before it;
- a full disk while prepare_data writes a document shard (a real one: a private tmpfs) is one
  error line, no temporary file left;
- an eval set without a [MASK] slot is one note, with no [MASK] comparison (`0.0000 vs 0.0000`)
  nor a verdict drawn from one.
"""

import os
import re
import subprocess
import sys

import fault_support as fs
import finetune_fixtures
import pytest
from data_fixtures import write_corpus
from toy_flags import TRAIN_TOY_FLAGS


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  return fs.trained_workdir(tmp_path_factory, 'edges')[0]


@pytest.mark.slow  # a trained toy workdir, a fine-tuning CLI subprocess
def test_finetune_init_as_a_flag_starts_from_the_checkpoint(trained, tmp_path):
  result = fs.cli(
    'experiments.finetune',
    '--config=configs/finetune/bible_sections.py',  # no init=: the file sets tiny's model
    f'--config.finetune.init={trained}',  # as the command's docstring shows
    f'--workdir={tmp_path / "ft"}',
    *finetune_fixtures.cli_flags(),
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert re.search(rf'^fine-tuning from {re.escape(trained)} at step 4 ', result.stdout, re.M)
  # A model field the user gives is still compared with the checkpoint's.
  result = fs.cli(
    'experiments.finetune',
    '--config=configs/finetune/bible_sections.py',
    f'--config.finetune.init={trained}',
    '--config.model.hidden_size=48',
    f'--workdir={tmp_path / "ft2"}',
    *finetune_fixtures.cli_flags(),
  )
  assert result.returncode == 1, result.stdout + result.stderr
  fs.the_line(result.stderr, r'error: model\.hidden_size=48: the starting checkpoint .*')


@pytest.mark.slow  # a CLI subprocess that reads the embedded task's dataset info (~8 s)
def test_finetune_print_config_prints_the_config_first():
  result = fs.cli(
    'experiments.finetune',
    '--config=configs/finetune/bible_sections.py',
    '--print_config',
    *finetune_fixtures.cli_flags(),
  )
  assert result.returncode == 0, result.stderr
  assert result.stderr == ''
  assert result.stdout.startswith("data.dataset = 'bible_sections'  # "), result.stdout[:200]


@pytest.mark.slow  # the training CLI at toy size
def test_an_eval_set_without_a_mask_slot_is_one_note_not_a_comparison(tmp_path):
  # No chosen token becomes [MASK] (as a one-line eval set whose few slots were all kept or
  # randomly replaced): deterministic.
  code, out, err = fs.run(
    tmp_path / 'w', data__mask_token_rate=0.0, train__num_train_steps=2, train__eval_every_steps=2
  )
  assert code == 0, out + err
  fs.the_line(
    '\n'.join(line for line in err.splitlines() if not line.startswith('prepare ')),
    r'note: the eval set has no \[MASK\] slot \(\d+ predictions, all kept or randomly replaced '
    r'tokens\): \[MASK\] accuracy and loss are not measured; give more eval text .*',
  )
  assert '[MASK]' not in out, out
  final = [line for line in out.splitlines() if line.startswith('final eval ')]
  assert len(final) == 1 and '[MASK] accuracy not above' not in final[0], out


@pytest.mark.slow  # the prepare_data CLI (~2 s)
@fs.NEEDS_PRIVATE_MOUNTS
def test_a_full_disk_while_a_document_shard_is_written_is_one_line(tmp_path):
  """ArrayRecord's writer reports ENOSPC as a RuntimeError (measured: 'write() failed: No space
  left on device; writing ...'): one error line, as when the packed store meets it."""
  write_corpus(tmp_path / 'corpus', train_files=3, docs_per_file=300)  # ~140 KB of text
  mount = tmp_path / 'tmpfs'
  mount.mkdir()
  flags = dict(
    TRAIN_TOY_FLAGS,
    **{
      'data.vocab_size': 60,
      'data.tokenizer_model_type': 'bpe',
      'data.max_len': 16,
      'data.train_files': f'{tmp_path}/corpus/train-*.txt',
      'data.eval_files': f'{tmp_path}/corpus/eval.txt',
      'data.data_dir': f'{mount}/data',
    },
  )
  command = [sys.executable, '-m', 'experiments.prepare_data', '--config=configs/tiny.py']
  command += [f'--config.{k}={v}' for k, v in flags.items()]
  script = (
    f'mount -t tmpfs -o size=48k tmpfs {mount} && {{ {fs.shell_join(command)}; status=$?; '
    f'find {mount} -type f -name "*.tmp.*"; exit $status; }}'
  )
  proc = fs.in_private_mounts(script)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  shards = re.escape(os.path.join(str(mount), 'data', 'file-shards'))
  fs.the_line(
    proc.stderr,
    rf'error: no space left on the device of {shards} while preparing data under '
    rf'data\.data_dir={re.escape(str(mount))}/data: free space .*',
  )
  assert '.tmp.' not in proc.stdout  # find listed no temporary file left behind


@pytest.mark.slow  # a toy train run on a file corpus, then refused resumes
def test_a_resume_after_the_corpus_changed_says_the_corpus_changed(tmp_path):
  """The data config is unchanged but a file was added: the listing of the files (a stat each)
  refuses the resume in one line naming the file, before any preparation (no new corpus
  directory, no 'prepare' line). An edit that kept the size is not told from a touch by a
  listing: preparation hashes it, and the resume is refused as a changed corpus (not 'resume
  with the data config it was trained with', which the user did)."""
  write_corpus(tmp_path / 'corpus', train_files=3, docs_per_file=300)
  flags = {
    'data.vocab_size': 60,
    'data.tokenizer_model_type': 'bpe',
    'data.max_len': 16,
    'data.train_files': f'{tmp_path}/corpus/train-*.txt',
    'data.eval_files': f'{tmp_path}/corpus/eval.txt',
    'data.data_dir': f'{tmp_path}/data',
  }
  overrides = {k.replace('.', '__'): v for k, v in flags.items()}
  workdir = str(tmp_path / 'run')
  code, out, err = fs.run(workdir, **overrides)
  assert code == 0, out + err
  prepared = sorted(os.listdir(tmp_path / 'data'))
  added = tmp_path / 'corpus' / 'train-9.txt'
  added.write_text(
    '\n\n'.join(f'Zebra quokka number {i} yodels over the xylophone.' for i in range(300))
  )
  code, out, err = fs.run(workdir, **overrides)
  assert code == 1, out + err
  line = fs.the_line(err, r'error: .*').group(0)
  manifest = re.escape(str(tmp_path / 'data'))
  assert re.search(
    rf'the corpus of the run in {re.escape(workdir)} grew since checkpoint step \d+ \(1 file '
    rf'added: {re.escape(str(added))}\): the files named now are 5 files of .* MB, the run '
    rf'trained on 4 files of .* MB \({manifest}/files-\w+/corpus\.json\); .*put the corpus '
    r'back as it was to resume, or train on it in a new --workdir$',
    line,
  ), line
  assert not re.search(r'^prepare ', out + err, re.M)  # no preparation before the refusal
  assert sorted(os.listdir(tmp_path / 'data')) == prepared

  added.unlink()
  edited = tmp_path / 'corpus' / 'train-0.txt'
  text = edited.read_text()
  edited.write_text(text.replace(text.split()[0], 'q' * len(text.split()[0]), 1))  # same size
  code, out, err = fs.run(workdir, **overrides)
  assert code == 1, out + err
  line = fs.the_line(err, r'error: .*').group(0)
  # The tokenizer check ('the data config is the one step N records, so the corpus changed
  # since') where the edit trains another tokenizer; here it does not, and the data position's
  # check refuses the other store.
  assert re.search(r'the corpus changed since|a changed corpus', line), line
  assert 'resume with the data config it was trained with' not in line

"""Issue 59, the artifacts half, through the real commands (experiments.train, export_hf,
finetune at toy size) on one trained toy workdir:

- export_hf --out inside the run's checkpoints/ or tensorboard/: one line;
- a replaced tokenizer, or a sibling run's config.json put back, is refused by export, resume
  and fine-tuning (each step records its model and tokenizer: run_record.json); a resume
  refuses another model before it prepares any data, and another tokenizer;
- a step that lost its checksums.json is damaged, not "saved before checksums": flipped bytes
  in it never resume;
- the exported Hugging Face tokenizer gives training's ids on the corpus, [MASK] included;
- the final evaluation goes through the divergence guard, and the final line says plainly
  when the model is at the floors;
- the first hour: export_hf on a fine-tuning workdir, stale staging directories, byte-identical
  exports, a checkpoints/ that cannot take a step directory after the probe, a second Ctrl-C
  before any checkpoint, warmup above the run's length, fine-tuning's --print_config and its
  starting point, a paper-size config on a CPU.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import fault_support as fs
import finetune_fixtures
import pytest
from data_fixtures import bible_config
from train_fixtures import REPO

from realformer_jax import data, train
from realformer_jax.config import ConfigError
from realformer_jax.data import preparation
from realformer_jax.interop import hf_export
from realformer_jax.train import checkpoint_integrity, checkpoint_record

pytestmark = pytest.mark.slow  # a trained toy workdir and CLI subprocesses


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(workdir, stdout) of `experiments.train` at toy size: checkpoints at steps 2 and 4."""
  return fs.trained_workdir(tmp_path_factory, 'issue59')


@pytest.fixture(scope='module')
def exported(trained, tmp_path_factory):
  out = str(tmp_path_factory.mktemp('issue59_export') / 'hf')
  result = fs.cli('experiments.export_hf', f'--workdir={trained[0]}', f'--out={out}')
  assert result.returncode == 0, result.stderr
  return out


@pytest.fixture(scope='module')
def other_tokenizer():
  """Another SentencePiece model of the same corpus (another vocabulary size)."""
  return data.prepare(bible_config(vocab_size=1000)).source


def _one_error(result, pattern):
  assert result.returncode == 1, result.stdout + result.stderr
  return fs.the_line(result.stderr, f'error: {pattern}')


def _finetune_from(workdir, tmp_path, *more):
  return fs.cli(
    'experiments.finetune',
    f'--config=configs/finetune/bible_sections.py:init={workdir}',  # as its docstring shows
    f'--workdir={tmp_path / "ft"}',
    *finetune_fixtures.cli_flags(),
    *more,
  )


def _copy(trained, tmp_path):
  return fs.copy_workdir(trained[0], tmp_path / 'run')


# --- how a run ends, and what its lines say ------------------------------------------------


def test_the_run_says_plainly_how_it_went(trained):
  _, out = trained
  # The first step's time is a warm-up, not the basis of an ETA.
  assert re.search(
    r'^step 1/4 \|.*\| first step \d+m\d\ds \(warm-up: ETA from the steps after', out, re.M
  )
  assert re.search(r'^step 2/4 \|.* tok/s \| ETA \d+m\d\ds$', out, re.M)
  # The two loss floors have names that cannot be confused.
  assert 'token-frequency floor' in out and '(unigram ' not in out
  # Four steps teach nothing: the final line says so plainly.
  final = [line for line in out.splitlines() if line.startswith('final eval')]
  assert len(final) == 1
  assert (
    'NOT TRAINED: at or below the context-free floors (eval loss not below the copy-aware'
    in (final[0])
  )


def test_the_final_evaluation_goes_through_the_divergence_guard(tmp_path):
  """learning_rate=1e6 with warmup 1: step 1 trains at rate 0 and step 2's loss is that of the
  initial state, so only the state saved at the last step (2) has exploded, which no later
  step judges: the final evaluation does."""
  workdir = str(tmp_path / 'run')
  code, out, err = fs.run(
    workdir,
    train__learning_rate=1e6,
    train__num_train_steps=2,
    train__warmup_steps=1,
    train__checkpoint_every_steps=1,
    train__eval_every_steps=100,
  )
  assert code == 1, out + err
  fs.the_line(
    err,
    r'error: (exploded eval loss \S+ \(above 10x the run.s first loss \S+, '
    r'loss_reference\.json\)|non-finite eval loss \S+) at the final evaluation of step 2: the '
    r'state saved at step 2 has diverged; moved that checkpoint aside to 2\.diverged: a rerun '
    r'resumes from step 1',
  )
  assert 'final eval' not in out
  assert fs.checkpoint_entries(workdir) == ['1', '2.diverged']
  # What an export then takes is the sane step.
  result = fs.cli('experiments.export_hf', f'--workdir={workdir}', f'--out={tmp_path / "hf"}')
  assert result.returncode == 0, result.stderr
  assert ' at step 1 ' in result.stdout


# --- export --out, staging, determinism ------------------------------------------------------


def test_export_out_inside_the_runs_managed_directories_is_refused(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  out = os.path.join(workdir, 'checkpoints', '2', 'hf')
  result = fs.cli('experiments.export_hf', f'--workdir={workdir}', f'--out={out}')
  _one_error(
    result,
    re.escape(
      f"--out {out}: inside the run's checkpoints/, whose contents the run manages (old "
      'checkpoint steps are rotated away, damaged ones renamed, event files appended): the '
      'export could be deleted with them; name a directory outside it'
    ),
  )
  assert not os.path.exists(out)
  for inside in ('checkpoints', 'tensorboard/hf', 'best'):
    with pytest.raises(
      hf_export.ExportError, match=r"inside the run's (checkpoints|tensorboard|best)/"
    ):
      hf_export.check_out_dir(os.path.join(workdir, inside), workdir)
  hf_export.check_out_dir(os.path.join(workdir, 'hf'), workdir)  # beside them: fine


def test_exports_of_one_step_are_identical_and_dead_staging_is_removed(trained, exported, tmp_path):
  out = tmp_path / 'hf'
  out.mkdir()
  dead = subprocess.Popen(['true'])
  dead.wait()
  host = socket.gethostname()
  stale = [f'.export-{dead.pid}', f'.export-{host}-{dead.pid}']  # left by a kill -9
  live = f'.export-{host}-{os.getpid()}'  # another export still writing (this process)
  other_host = f'.export-otherhost-{dead.pid}'  # cannot be judged from here
  for name in stale + [live, other_host]:
    (out / name).mkdir()
    (out / name / 'model.safetensors').write_bytes(b'partial')
  result = fs.cli('experiments.export_hf', f'--workdir={trained[0]}', f'--out={out}')
  assert result.returncode == 0, result.stderr
  left = sorted(name for name in os.listdir(out) if name.startswith('.export-'))
  assert left == sorted([live, other_host])
  files = sorted(name for name in os.listdir(exported))
  assert files == sorted(name for name in os.listdir(out) if not name.startswith('.export-'))
  for name in files:  # byte for byte: the safetensors metadata in one order
    assert (out / name).read_bytes() == open(os.path.join(exported, name), 'rb').read(), name


def test_export_of_a_finetuning_workdir_says_what_it_is(tmp_path):
  workdir = tmp_path / 'ft'
  (workdir / 'checkpoints' / '3').mkdir(parents=True)
  (workdir / 'checkpoints' / '3' / 'commit_success.txt').write_text('')
  config = {'model': {}, 'data': {'test_split': ''}, 'finetune': {'init': ''}, 'train': {}}
  (workdir / 'config.json').write_text(json.dumps(config))
  result = fs.cli('experiments.export_hf', f'--workdir={workdir}', f'--out={tmp_path / "hf"}')
  # A fine-tuning run exports once it has finished (issue 69): this one has no results.json.
  _one_error(
    result,
    re.escape(
      f'{workdir}/results.json: missing or unreadable: the fine-tuning run has not finished '
      '(a rerun of its command resumes it); its best checkpoint is exported once it has'
    ),
  )


# --- what a step records: its model and tokenizer ------------------------------------------


def test_every_step_records_its_model_and_tokenizer(trained):
  workdir, _ = trained
  config = fs.read_json(os.path.join(workdir, 'config.json'))
  tokenizer = data.tokenizers.load(os.path.join(workdir, 'tokenizer.model'))
  for step in (2, 4):
    step_dir = os.path.join(workdir, 'checkpoints', str(step))
    record = checkpoint_record.read(step_dir)
    assert record['format'] == checkpoint_record.FORMAT
    assert record['config'] == config
    assert record['tokenizer_sha256'] == tokenizer.sha256
    listed = fs.read_json(os.path.join(step_dir, checkpoint_integrity.CHECKSUMS_FILE))['files']
    assert checkpoint_record.RECORD_FILE in listed  # its bytes are checked like the rest


def test_a_replaced_tokenizer_is_refused_by_export_and_finetuning(
  trained, other_tokenizer, tmp_path
):
  workdir = _copy(trained, tmp_path)
  ours = data.tokenizers.load(os.path.join(workdir, 'tokenizer.model'))
  other = data.tokenizers.load(other_tokenizer)
  with open(os.path.join(workdir, 'tokenizer.model'), 'wb') as f:
    f.write(other.file_bytes())
  refusal = re.escape(
    f'{workdir}/tokenizer.model: not the tokenizer the run in {workdir} was trained with '
    f'(SHA-256 {other.sha256[:16]}; checkpoint step 4 (run_record.json) records '
    f"{ours.sha256[:16]}): its ids would mean other pieces to the model; put back the run's "
    'own tokenizer file'
  )
  result = fs.cli('experiments.export_hf', f'--workdir={workdir}', f'--out={tmp_path / "hf"}')
  _one_error(result, refusal)
  assert not os.path.exists(tmp_path / 'hf')
  _one_error(_finetune_from(workdir, tmp_path), refusal)
  # A run saved before steps recorded it: the packed store's tokenizer_sha256 says it.
  for step in (2, 4):
    for name in (checkpoint_record.RECORD_FILE, checkpoint_integrity.CHECKSUMS_FILE):
      os.remove(os.path.join(workdir, 'checkpoints', str(step), name))
  with pytest.raises(ConfigError, match=r'records [0-9a-f]{16}\): its ids') as raised:
    train.load_workdir(workdir).tokenizer  # pylint: disable=expression-not-assigned
  assert 'the packed store ' in str(raised.value)


def test_a_resume_with_another_tokenizer_is_refused(trained, other_tokenizer, tmp_path):
  """The same model resumed on a tokenizer other than the one its steps record (here given as
  data.vocab_file): its ids would mean other pieces; one line, the checkpoints untouched."""
  workdir = _copy(trained, tmp_path)
  before = fs.checkpoint_entries(workdir)
  ours = data.tokenizers.load(os.path.join(workdir, 'tokenizer.model'))
  other = data.tokenizers.load(other_tokenizer)
  code, out, err = fs.run(
    workdir, **dict(fs.TRAINED, train__num_train_steps=6), data__vocab_file=other_tokenizer
  )
  assert code == 1, out + err
  fs.the_line(
    err,
    re.escape(
      f'error: {other_tokenizer}: not the tokenizer the run in {workdir} was trained with '
      f'(SHA-256 {other.sha256[:16]}; checkpoint step 4 (run_record.json) records '
      f'{ours.sha256[:16]}): its ids would mean other pieces to the model; resume with the data '
      'config it was trained with, or use a new --workdir'
    ),
  )
  assert fs.checkpoint_entries(workdir) == before


def test_a_sibling_config_json_is_refused_by_export_resume_and_finetuning(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  path = os.path.join(workdir, 'config.json')
  sibling = fs.read_json(path)
  sibling['model'].update(ln_placement='post', dropout_rate=0.3)  # another run's
  with open(path, 'w') as f:
    json.dump(sibling, f)
  result = fs.cli('experiments.export_hf', f'--workdir={workdir}', f'--out={tmp_path / "hf"}')
  refusal = re.escape(
    f'{path} describes another model than checkpoint step 4 holds: model.dropout_rate=0.3 (the '
    "step has 0.1), model.ln_placement='post' (the step has 'realformer'); the step records its "
    "own model (run_record.json): put back the run's own config.json"
  )
  _one_error(result, refusal)
  _one_error(_finetune_from(workdir, tmp_path), refusal)
  # A resume as that sibling (Post-LN) is refused before any data is prepared: its data_dir is
  # never made.
  data_dir = str(tmp_path / 'not_prepared')
  code, out, err = fs.run(
    workdir, **fs.TRAINED, model__ln_placement='post', data__data_dir=data_dir
  )
  assert code == 1, out + err
  fs.the_line(
    err,
    re.escape(
      f'error: {workdir} holds checkpoints (latest step 4) of another model: '
      "model.ln_placement='post' (checkpoint step 4 has 'realformer'); use a new --workdir, or "
      'the old config, to resume it'
    ),
  )
  assert not os.path.exists(data_dir)


def test_a_step_that_lost_its_checksums_is_damaged_not_trusted(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  step_4 = os.path.join(workdir, 'checkpoints', '4')
  os.remove(os.path.join(step_4, checkpoint_integrity.CHECKSUMS_FILE))
  fs.flip_bytes(fs.largest_file(os.path.join(step_4, 'state')), 5000)
  code, out, err = fs.run(workdir, **dict(fs.TRAINED, train__num_train_steps=6))
  assert code == 0, out + err
  fs.the_line(
    err,
    re.escape(
      f'warning: checkpoint step 4 in {workdir}/checkpoints is damaged (its checksums.json is '
      'missing, though its run_record.json says it was saved with one: its bytes cannot be '
      'verified): moved aside to 4.damaged; trying the next older step'
    ),
  )
  assert f'resumed from the checkpoint at step 2 in {workdir}/checkpoints' in out
  # Without its record too, the older steps of the run say it: they had inventories.
  step_6 = os.path.join(workdir, 'checkpoints', '6')
  for name in (checkpoint_record.RECORD_FILE, checkpoint_integrity.CHECKSUMS_FILE):
    os.remove(os.path.join(step_6, name))
  assert checkpoint_integrity.problem(step_6) == (
    'its checksums.json is missing, though the older step 2 of the same run has one: its bytes '
    'cannot be verified'
  )
  # An older step without one is a run resumed across the upgrade: its restore is the check.
  step_2 = os.path.join(workdir, 'checkpoints', '2')
  for name in (checkpoint_record.RECORD_FILE, checkpoint_integrity.CHECKSUMS_FILE):
    os.remove(os.path.join(step_2, name))
  assert checkpoint_integrity.problem(step_2) is None


# --- the exported tokenizer ------------------------------------------------------------------


def _corpus_lines(count=240, words=15):
  """Passages of `words` words from documents spread over the corpus (its text as stored)."""
  records = preparation.prepared_data(bible_config()).train_records
  lines = []
  for index in range(0, len(records), max(len(records) // 60, 1)):
    text = records[index]['text']
    split = (text.decode() if isinstance(text, bytes) else text).split()
    lines += [' '.join(split[i : i + words]) for i in range(0, words * 4, words)]
  return [line for line in lines if line][:count]


def test_the_exported_tokenizer_gives_trainings_ids_with_masks_and_punctuation(trained, exported):
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

  ours = data.tokenizers.load(os.path.join(trained[0], 'tokenizer.model'))
  theirs = AutoTokenizer.from_pretrained(exported)
  hf = lambda text: theirs(text, add_special_tokens=False)['input_ids']
  lines = _corpus_lines()
  assert len(lines) > 100
  masked = 0
  for line in lines:
    ids = [int(i) for i in ours.encode(line)]
    assert hf(line) == ids, line
    pieces = theirs.convert_ids_to_tokens(ids)
    if ours.unk_id in ids:
      continue  # an unknown character has no piece to rebuild the text from
    # Training masks ids: a word's first piece (which carries its '▁'), before another word or
    # before punctuation attached to it ('free [MASK]; you'). The text a user writes for that.
    for i, piece in enumerate(pieces):
      rest = pieces[i + 1 :]
      attached = next((k for k, p in enumerate(rest) if p.startswith('▁')), len(rest))
      if not piece.startswith('▁') or not all(not c.isalnum() for p in rest[:attached] for c in p):
        continue
      text = (''.join(pieces[:i]) + '▁[MASK]' + ''.join(rest)).replace('▁', ' ').strip()
      want = ids[:i] + [ours.mask_id] + ids[i + 1 :]
      assert hf(text) == want, (text, theirs.convert_ids_to_tokens(hf(text)))
      masked += 1
  assert masked > 1000
  assert theirs.convert_ids_to_tokens(hf('free [MASK]; you'))[1:3] == ['[MASK]', ';']


# --- the first hour ----------------------------------------------------------------------------


def test_a_checkpoints_dir_that_refuses_the_step_directory_fails_at_once(tmp_path):
  """The save's probe passes, then the step's directory cannot be made (a checkpoints/ made
  read-only in between): before, orbax waited 300 s at a barrier and named no cause."""
  workdir = str(tmp_path / 'run')
  code, out, err = fs.run(workdir, faults='mkdir_denied_after_probe:2', timeout=200, **fs.TRAINED)
  assert code == 1, out + err
  fs.the_line(
    err,
    re.escape(
      f'error: saving the checkpoint at step 2 failed: permission denied writing to {workdir}/'
      'checkpoints; no checkpoint was committed before; make it writable and rerun to start '
      'from step 0'
    ),
  )


def test_a_second_ctrl_c_before_any_checkpoint_says_none_exists(tmp_path):
  workdir = str(tmp_path / 'run')
  proc = fs.start(
    workdir,
    faults='slow_eval:1:60',
    train__num_train_steps=4,
    train__eval_every_steps=1,
    train__checkpoint_every_steps=100,
  )
  fs.wait_for_line(proc.stderr, r'^FAULT: evaluating step 1$', [])
  proc.send_signal(signal.SIGINT)
  # Said at once, while the evaluation holds the main thread.
  fs.wait_for_line(proc.stdout, r'^Ctrl-C: stopping after the step in progress', [])
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, out + err
  fs.the_line(
    err,
    r'error: interrupted twice: stopped without saving; no checkpoint was saved yet: a rerun '
    r'starts from step 0',
  )
  assert fs.committed_steps(workdir) == []


def test_a_warmup_longer_than_the_run_names_the_fix(tmp_path):
  code, out, err = fs.run(str(tmp_path / 'run'), train__num_train_steps=40, train__warmup_steps=60)
  assert code == 1, out + err
  fs.the_line(
    err,
    re.escape(
      'error: train.warmup_steps=60: must be in [0, train.num_train_steps=40]: a warmup longer '
      'than the run never reaches the peak learning rate; e.g. --config.train.warmup_steps=4 '
      '(a tenth of the run)'
    ),
  )


def test_finetuning_shows_its_schedule_and_where_it_starts(trained, other_tokenizer, tmp_path):
  result = fs.cli(
    'experiments.finetune',
    '--config=configs/finetune/bible_sections.py',
    '--print_config',
    *finetune_fixtures.cli_flags(),
  )
  assert result.returncode == 0, result.stderr
  # 16 examples, batch 8, one epoch: 2 steps (not the config's 1,000,000).
  assert re.search(
    r'^train\.num_train_steps = 2  # derived: finetune\.num_epochs=1 x 2 steps an epoch '
    r'\(16 train examples / batch 8, rounded up\)$',
    result.stdout,
    re.M,
  ), result.stdout
  # From the trained workdir with another tokenizer given as data.vocab_file: said, recorded.
  workdir = trained[0]
  result = _finetune_from(workdir, tmp_path, f'--config.data.vocab_file={other_tokenizer}')
  assert result.returncode == 0, result.stdout + result.stderr
  other = data.tokenizers.load(other_tokenizer)
  assert re.search(
    rf'^fine-tuning from {re.escape(workdir)} at step 4 \(checksums verified, config '
    rf'[0-9a-f]{{16}}, corpus store=packed-\S+\); tokenizer {other.sha256[:16]} '
    rf'\({re.escape(other_tokenizer)}\)$',
    result.stdout,
    re.M,
  ), result.stdout
  assert f'warning: data.vocab_file={other_tokenizer} is not the tokenizer {workdir} was' in (
    result.stderr
  )
  recorded = fs.read_json(tmp_path / 'ft' / 'starting_point.json')
  assert recorded['tokenizer_file'] == other_tokenizer
  assert recorded['tokenizer_sha256'] == other.sha256[:16]
  assert recorded['step'] == 4 and recorded['workdir'] == workdir


def test_a_paper_size_config_on_a_cpu_says_so_before_compiling(tmp_path):
  tokenizer = data.prepare(bible_config())
  command = [
    sys.executable,
    '-m',
    'experiments.train',
    '--config=configs/realformer_large.py',
    f'--workdir={tmp_path / "run"}',
    f'--config.data.data_dir={bible_config().data_dir}',
    f'--config.data.vocab_size={bible_config().vocab_size}',
    f'--config.model.vocab_size={tokenizer.vocab_size}',
    '--config.data.eval_batches=1',
  ]
  proc = subprocess.Popen(
    command, cwd=REPO, env=fs.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  seen = []
  watchdog = threading.Timer(300, proc.kill)  # no note: it would go on to compile BERT-Large
  watchdog.start()
  try:
    line = fs.wait_for_line(proc.stdout, r'^note: training on CPU|^model: ', seen)
  finally:
    watchdog.cancel()
    proc.kill()  # it would compile BERT-Large next
    proc.communicate()
  assert re.fullmatch(
    r'note: training on CPU \(\d+ device\(s\), no GPU or TPU found\): this model \(~3\d\d\.\dM '
    r'parameters in its matmuls and word embeddings; the model line counts every one\) needs '
    r'~\d+\.\d GiB for its train state alone'
    r'( \(this host has [\d.]+ GiB\))? and ~\S+ a step, .+ for 1,000,000 steps '
    r'\(estimated: .+ FLOPs a step at the \d+ GFLOP/s this '
    r'CPU measured\); the first step also compiles\. For a run a CPU finishes: '
    r'--config=configs/tiny\.py \(~4 minutes on 2 cores\)\n',
    line,
  ), line

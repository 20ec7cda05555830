"""Toy fine-tuning configs for the suite: a 2-layer, 32-wide model, a few examples, one epoch.

The tokenizer is the shared test corpus' SentencePiece model (data_fixtures.py), given as
data.vocab_file, so no test trains one of its own.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import repo_paths
from data_fixtures import bible_config
from train_fixtures import TINY_MODEL

from realformer_jax import data, finetune

REPO = repo_paths.REPO

TOY_MODEL = {**TINY_MODEL, 'max_len': 64}  # pretraining's toy model, 64 positions
TOY = {
  'data.max_len': 32,
  'data.max_examples': 16,
  'train.global_batch_size': 8,
  'train.log_every_steps': 1,
  'finetune.num_epochs': 1,
  'train.learning_rate': 1e-3,
}


def tokenizer_file() -> str:
  """The shared test corpus' tokenizer (trained once per session)."""
  return data.prepare(bible_config()).source


def toy_config(dataset: str, model=True, **overrides):
  """Keyword names use '__' for '.', e.g. toy_config('glue/mrpc', data__max_len=48).
  `model=False` leaves the model section unset (a checkpoint's)."""
  config = finetune.default_config()
  config.data.dataset = dataset
  config.data.data_dir = bible_config().data_dir
  config.data.vocab_file = tokenizer_file()
  if model:
    config.model.update(TOY_MODEL)
    config.model.vocab_size = data.prepare(bible_config()).vocab_size
  for path, value in {**TOY, **{k.replace('__', '.'): v for k, v in overrides.items()}}.items():
    section, field = path.split('.')
    config[section][field] = value
  return config


def files_toy_flags(ln_placement: str = 'post') -> list[str]:
  """Flags of a toy run on your own files (finetune/files.py): toy sizes, the shared tokenizer
  and a toy model (random init; Post-LN: a standard BERT once exported, RealFormer: the
  shipped PyTorch module)."""
  model = {f'model.{k}': v for k, v in TOY_MODEL.items()}
  model.update(
    {
      'model.ln_placement': ln_placement,
      'model.position_embedding': 'learned',  # configs/tiny.py's rotary has no BERT class
      'model.vocab_size': data.prepare(bible_config()).vocab_size,
    }
  )
  values = {**model, **TOY, 'data.max_examples': -1, 'data.vocab_file': tokenizer_file()}
  return [f'--config.{k}={v}' for k, v in values.items()] + ['--config.train.stop_at_step=2']


def cli_flags(**overrides) -> list[str]:
  values = {**TOY, 'data.data_dir': bible_config().data_dir, **overrides}
  return [f'--config.{k}={v}' for k, v in values.items()]


# Runs a module's main under tfds.testing.mock_data: a subprocess sees the fake GLUE / SQuAD
# records the in-process tests see (the command itself is unchanged).
MOCKED_MAIN = (
  'import runpy, sys; import tensorflow_datasets as tfds; '
  'sys.argv = sys.argv[1:]; module = sys.argv[0]; '
  'ctx = tfds.testing.mock_data(num_examples=16); ctx.__enter__(); '
  "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def run_cli(module: str, *args, mocked: bool = False, timeout: int = 600):
  """`python -m module args...` (optionally under mock_data) with the suite's JAX settings."""
  data.prepare(bible_config())
  command = (
    [sys.executable, '-c', MOCKED_MAIN, module] if mocked else [sys.executable, '-m', module]
  ) + list(args)
  env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS='true')
  return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


# Your own labelled files (finetune/files.py) for the tests of --train_file.
# Two classes a toy model can tell apart by their words.
_WORDS = {
  'sky': 'light day night heaven star cloud'.split(),
  'land': 'king house war city gold sword'.split(),
}


def labelled_rows(count: int, pair: bool = False) -> list[dict]:
  """Alternating 'sky' / 'land' texts (and a second text, reversed, if `pair`)."""
  rows = []
  for i in range(count):
    label = ('sky', 'land')[i % 2]
    words = _WORDS[label]
    row = {'text': ' '.join(words[(i + k) % len(words)] for k in range(5)), 'label': label}
    if pair:
      row['second'] = ' '.join(reversed(row['text'].split()))
    rows.append(row)
  return rows


def write_table(path, rows: list[dict]) -> str:
  """rows as .csv / .tsv (a header line) or .jsonl, by the path's extension."""
  if str(path).endswith('.jsonl'):
    path.write_text(''.join(json.dumps(row) + '\n' for row in rows))
  else:
    with open(path, 'w', newline='') as f:
      delimiter = '\t' if str(path).endswith('.tsv') else ','
      writer = csv.DictWriter(f, list(rows[0]), delimiter=delimiter)
      writer.writeheader()
      writer.writerows(rows)
  return str(path)


def write_squad(path, count: int) -> str:
  contexts = []
  for i in range(count):
    answer = _WORDS['sky'][i % 6]
    context = f'the king saw the {answer} over the city of gold'
    question = 'what did the king see'
    contexts.append(
      {
        'context': context,
        'qas': [
          {
            'id': str(i),
            'question': question,
            'answers': [{'text': answer, 'answer_start': context.index(answer)}],
          }
        ],
      }
    )
  path.write_text(json.dumps({'data': [{'title': 'toy', 'paragraphs': contexts}], 'version': '1'}))
  return str(path)


def assert_export_matches(workdir, out, texts, pairs=None) -> dict:
  """The Hugging Face export in `out` of the fine-tuning run in `workdir` computes what the
  run's best checkpoint computes in JAX (a classifier's logits; a span extractor's start and end
  logits at the real positions), and its tokenizer gives the run's ids; returns its config."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  from realformer_jax import SequenceClassifier  # pylint: disable=import-outside-toplevel
  from realformer_jax.finetune import encoding, export  # pylint: disable=import-outside-toplevel
  from realformer_jax.model.models import SpanExtractor  # pylint: disable=import-outside-toplevel

  run = export.load_best(str(workdir))
  arrays = encoding.encode_texts(run.tokenizer, texts, pairs, 32)
  ids, mask, segments = (arrays[k] for k in ('input_ids', 'input_mask', 'segment_ids'))
  inputs = dict(
    input_ids=torch.tensor(ids),
    attention_mask=torch.tensor(mask),
    token_type_ids=torch.tensor(segments),
  )
  if 'classifier' in run.params:
    classes = run.params['classifier']['classifier']['bias'].shape[0]
    ours = SequenceClassifier(run.model_config, classes).apply(
      {'params': run.params}, ids, mask, segments
    )
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(out), trust_remote_code=True
    )
    with torch.no_grad():
      theirs = model(**inputs).logits.numpy()
    np.testing.assert_allclose(theirs, np.asarray(ours), atol=1e-4, rtol=1e-4)
  else:
    ours = SpanExtractor(run.model_config).apply({'params': run.params}, ids, mask, segments)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(
      str(out), trust_remote_code=True
    )
    with torch.no_grad():
      output = model(**inputs)
    real = mask > 0
    for mine, hf in zip(ours, (output.start_logits, output.end_logits)):
      np.testing.assert_allclose(hf.numpy()[real], np.asarray(mine)[real], atol=1e-4, rtol=1e-4)
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
  encoded = hf_tokenizer(texts[0], pairs[0] if pairs else None)['input_ids']
  assert encoded == ids[0][: int(mask[0].sum())].tolist()
  return model.config

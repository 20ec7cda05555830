"""Training (on the generic loop) and BLEU for the encoder-decoder on WEB -> BBE.

    spec = seq2seq_task.validate(seq2seq_config.default_translation_config())
    trained = trainer.train(spec, workdir, on_log=...)   # or restores a finished workdir
    scores = trainer.evaluate_bleu(trained, 'test', search='beam')

Training is realformer_jax/train/loop.py with the translation task (task.py): checkpoints,
mid-run resume with the data position, SIGTERM, the workdir lock, one-line errors and
TensorBoard metrics are the loop's. A finished run (its last checkpoint at num_train_steps and
`history.json` written) is restored instead of trained again; so is a workdir of the older
trainer, which saved only the final parameters in `<workdir>/params`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from realformer_jax.model.params import unbox
from realformer_jax.seq2seq import data as data_lib
from realformer_jax.seq2seq import decoding
from realformer_jax.seq2seq.model import Seq2Seq
from realformer_jax.train import build, loop
from realformer_jax.train.checkpointing import Checkpointer
from realformer_jax.train.config import RunSpec

OnLog = Callable[[int, int, dict], None]  # (step, num_train_steps, scalars)
HISTORY_FILE = 'history.json'


@dataclasses.dataclass
class Trained:
  """A trained (or restored) run: what evaluation and the speed benchmark need. A run that
  stopped before the end of its schedule (SIGTERM inside train.preemption.return_on_preemption,
  or train.stop_at_step) has `stopped_at` set and no parameters."""

  spec: RunSpec
  model: Seq2Seq
  params: Any
  data: data_lib.TranslationData
  history: dict  # train/dev curves and timings (also <workdir>/history.json)
  stopped_at: Optional[int] = None
  stopped_by: Optional[str] = None  # the signal that stopped it ('SIGTERM', 'SIGINT'), if one did


def train(spec: RunSpec, workdir: str, *, on_log: Optional[OnLog] = None) -> Trained:
  """Trains one run on the training loop (resuming from its checkpoints), or restores it
  when it has finished."""
  data = data_lib.prepare(spec.data)
  model = Seq2Seq(spec.model)
  restored = _restore_finished(spec, workdir, model)
  if restored is not None:
    return Trained(spec, model, restored[0], data, restored[1])
  start = time.perf_counter()
  result = loop.run(spec, workdir, on_log=on_log)
  if result.get('preempted') or result['step'] < spec.train.num_train_steps:
    return Trained(
      spec, model, None, data, {}, stopped_at=result['step'], stopped_by=result.get('signal')
    )
  history = _history(workdir, data, spec, seconds=time.perf_counter() - start)
  with open(os.path.join(workdir, HISTORY_FILE), 'w') as f:
    json.dump(history, f, indent=2)
  return Trained(spec, model, _final_params(spec, workdir), data, history)


def _restore_finished(spec: RunSpec, workdir: str, model: Seq2Seq):
  """(params, history) of a finished run in `workdir`, else None."""
  history_path = os.path.join(workdir, HISTORY_FILE)
  if not os.path.isfile(history_path):
    return None
  with open(history_path) as f:
    history = json.load(f)
  old_params = os.path.join(os.path.abspath(workdir), 'params')
  if os.path.isdir(old_params):  # the older trainer's final parameters
    longest = spec.data.bucket_lengths[-1]
    ids = jnp.zeros((1, longest), jnp.int32)
    abstract = unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids)['params']))
    return ocp.StandardCheckpointer().restore(old_params, abstract), history
  checkpointer = Checkpointer(workdir, spec.train.keep_checkpoints, writer=False)
  try:
    finished = checkpointer.latest_step() == spec.train.num_train_steps
  finally:
    checkpointer.close()
  return (_final_params(spec, workdir), history) if finished else None


def _final_params(spec: RunSpec, workdir: str) -> Any:
  """The parameters of the newest intact checkpoint, on this process's devices."""
  setup = build.make_setup(spec)
  checkpointer = Checkpointer(workdir, spec.train.keep_checkpoints, writer=False)
  try:
    step = checkpointer.newest_intact_step()
    return checkpointer.restore_state(step, setup.layout.abstract).params
  finally:
    checkpointer.close()


def _history(workdir: str, data, spec: RunSpec, seconds: float) -> dict:
  """The run's train and dev curves (from its TensorBoard events: the last value logged at a
  step wins, so a resumed run's repeated steps count once) and how long this call trained."""
  scalars = loop.read_scalars(workdir)
  by_step = lambda tag: dict(scalars.get(tag, []))
  train_loss, nll = by_step('train/loss'), by_step('train/nll')
  dev_nll, dev_accuracy = by_step('eval/nll'), by_step('eval/accuracy')
  per_epoch = data_lib.batches_per_epoch(data, spec.data)
  return {
    'train': [
      {'step': int(s), 'train/loss': train_loss[s], 'train/nll': nll.get(s)}
      for s in sorted(train_loss)
    ],
    'dev': [
      {'step': int(s), 'dev/nll': dev_nll[s], 'dev/accuracy': dev_accuracy[s]}
      for s in sorted(dev_nll)
    ],
    'batches_per_epoch': per_epoch,
    'dropped_train_pairs': data.dropped,
    'train_seconds': seconds,
    'epochs': spec.train.num_train_steps / per_epoch,
  }


@functools.lru_cache(maxsize=None)
def _search_fn(
  model: Seq2Seq, search: str, max_len: int, bos_id: int, beam_size: int, alpha: float
):
  """jit((params, source, mask, eos_id) -> tokens); the EOS id is traced (one compilation
  serves real decoding and the no-EOS timing)."""
  if search == 'greedy':
    return jax.jit(
      lambda params, source, mask, eos_id: decoding.greedy_search(
        model, params, source, mask, max_len=max_len, bos_id=bos_id, eos_id=eos_id
      )[0]
    )
  if search == 'beam':
    return jax.jit(
      lambda params, source, mask, eos_id: decoding.beam_search(
        model,
        params,
        source,
        mask,
        beam_size=beam_size,
        max_len=max_len,
        bos_id=bos_id,
        eos_id=eos_id,
        alpha=alpha,
      )[0]
    )
  raise ValueError(f'search={search!r}: must be greedy or beam')


def search_fn(trained: Trained, search: str, source_length: int, eos_id: Optional[int] = None):
  """A jitted (params, source, source_mask) -> tokens [B, max_len] for one source length
  (`eos_id` -1: no token ends a sequence, so every row decodes to the length limit)."""
  d = trained.spec.sections['decode']
  max_len = min(trained.spec.model.max_len, math.ceil(d.length_ratio * source_length))
  fn = _search_fn(trained.model, search, max_len, trained.data.bos_id, d.beam_size, float(d.alpha))
  eos = jnp.asarray(trained.data.eos_id if eos_id is None else eos_id, jnp.int32)
  return lambda params, source, mask: fn(params, source, mask, eos)


def translate(trained: Trained, split: str, search: str) -> list[str]:
  """Detokenised outputs for every pair of `split`, in the split's order."""
  data = trained.data
  outputs = [''] * len(data.splits[split])
  for batch, rows in data_lib.eval_batches(
    data, split, trained.spec.data, batch_size=trained.spec.sections['decode'].batch_size
  ):
    fn = search_fn(trained, search, batch['source'].shape[1])
    tokens = np.asarray(fn(trained.params, batch['source'], batch['source_mask']))
    for row, index in enumerate(rows):
      outputs[index] = data.tokenizer.decode(ids for ids in tokens[row] if ids != 0)
  return outputs


def evaluate_bleu(trained: Trained, split: str, search: str) -> dict:
  """Corpus BLEU (sacrebleu, default 13a tokenisation) of `search` outputs against the BBE."""
  from sacrebleu.metrics import BLEU  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  hypotheses = translate(trained, split, search)
  seconds = time.perf_counter() - start
  metric = BLEU()
  bleu = metric.corpus_score(hypotheses, [trained.data.splits[split].references])
  return {
    'bleu': bleu.score,
    'signature': str(metric.get_signature()),
    'seconds': seconds,
    'hypotheses': hypotheses,
  }

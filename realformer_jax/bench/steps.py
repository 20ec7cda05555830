"""Train steps under benchmark: the project's train step, with our model or Hugging Face's.

Both candidates run `realformer_jax.train.step.make_train_step` (what `train_and_evaluate`
compiles: sum-of-losses gradient divided by the number of predictions, global-norm clipping,
AdamW with warmup/decay schedule and weight-decay mask, a finite-gradients check), jitted with the
state donated. Ours goes through `train.build` (mesh, logical shardings) exactly as training
does. Hugging Face's FlaxBertForMaskedLM enters the same step through `HFMaskedLM`, an adapter
with MaskedLM's `apply` signature that gathers HF's full logits at the masked positions, so the
loss code is `losses.mlm_loss_and_metrics` for both. The only intended difference is the model:
ours evaluates the MLM head at the masked positions only.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from realformer_jax import train as train_lib
from realformer_jax.mlm import MaskedLMTask
from realformer_jax.train import build
from realformer_jax.train import step as step_lib


@dataclasses.dataclass(frozen=True)
class Shape:
  """One benchmark shape (BERT-style encoder, MLM pretraining batch)."""

  name: str
  hidden: int
  layers: int
  heads: int
  vocab: int
  seq_len: int
  batch: int
  mlp: int = 0  # 0: 4 * hidden
  predictions: int = 20  # masked positions per sequence (BERT at seq 128: 20)

  @property
  def mlp_dim(self) -> int:
    return self.mlp or 4 * self.hidden

  @property
  def tokens(self) -> int:
    return self.batch * self.seq_len


def make_batch(shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
  """A synthetic MLM batch: full-length sequences, two segments, distinct masked positions."""
  rng = np.random.default_rng(seed)
  b, l, p = shape.batch, shape.seq_len, shape.predictions
  ids = rng.integers(5, shape.vocab, size=(b, l)).astype(np.int32)
  segments = (np.arange(l)[None, :] >= l // 2).astype(np.int32).repeat(b, 0)
  positions = np.sort(np.stack([rng.choice(l, p, replace=False) for _ in range(b)]), -1)
  return {
    'input_ids': ids,
    'input_mask': np.ones((b, l), np.int32),
    'segment_ids': segments,
    'masked_positions': positions.astype(np.int32),
    'masked_ids': np.take_along_axis(ids, positions, 1).astype(np.int32),
    'masked_weights': np.ones((b, p), np.float32),
  }


def train_config(
  shape: Shape, *, ln_placement: str = 'post', dropout: float = 0.1, **model_overrides: Any
) -> ml_collections.ConfigDict:
  """The project's training config for one benchmark shape (defaults otherwise: AdamW 1e-4,
  warmup 10k, clipping 1.0, single-device mesh)."""
  config = train_lib.default_config()
  config.data.vocab_size = shape.vocab
  config.data.max_len = shape.seq_len
  config.data.max_predictions = shape.predictions
  config.train.global_batch_size = shape.batch
  model = dict(
    hidden_size=shape.hidden,
    num_layers=shape.layers,
    num_heads=shape.heads,
    mlp_dim=shape.mlp_dim,
    max_len=max(512, shape.seq_len),
    dropout_rate=dropout,
    attention_dropout_rate=dropout,
    ln_placement=ln_placement,
    **model_overrides,
  )
  for name, value in model.items():
    config.model[name] = value
  return config


def hf_bert_config(shape: Shape, *, dropout: float = 0.1):
  import transformers  # optional dependency (the 'test' extra)

  return transformers.BertConfig(
    vocab_size=shape.vocab,
    hidden_size=shape.hidden,
    num_hidden_layers=shape.layers,
    num_attention_heads=shape.heads,
    intermediate_size=shape.mlp_dim,
    max_position_embeddings=max(512, shape.seq_len),
    type_vocab_size=2,
    hidden_dropout_prob=dropout,
    attention_probs_dropout_prob=dropout,
  )


@dataclasses.dataclass
class Step:
  """A jitted train step `fn(state, batch, rng) -> (state, metrics)` with its inputs."""

  fn: Any  # jax.jit-wrapped step
  state: Any  # TrainState (or its abstract shapes)
  batch: dict
  rng: jax.Array
  context: Callable = contextlib.nullcontext  # what lowering must run under (mesh + rules)

  def lower(self):
    with self.context():
      return self.fn.lower(self.state, self.batch, self.rng)


def make_project_step(
  config: ml_collections.ConfigDict, batch: dict, seed: int = 1, abstract: bool = False
) -> Step:
  """The project's train step for `config`, as `train.build.compile_train_step` jits it.

  `abstract=True` gives the state as shapes only: for compile-time and memory analysis.
  """
  spec = train_lib.validate_config(
    config, device_count=jax.device_count(), process_count=jax.process_count()
  )
  setup = train_lib.make_setup(spec)
  fn = jax.jit(
    step_lib.make_train_step(
      setup.model,
      setup.tx,
      spec.task,
      build.learning_rate_schedule(spec.train),
      grad_accum_steps=spec.train.grad_accum_steps,
      param_shardings=setup.layout.param_shardings,
    ),
    in_shardings=(setup.layout.shardings, setup.batch_sharding, setup.replicated),
    out_shardings=(setup.layout.shardings, setup.replicated),
    donate_argnums=0,
  )
  if abstract:
    state = setup.layout.abstract
  else:
    state = setup.init_state(jax.random.key(seed))
  return Step(
    fn,
    state,
    jax.device_put(batch, setup.batch_sharding),
    jax.device_put(jax.random.key(seed), setup.replicated),
    lambda: build.activate(setup.mesh, setup.rules),
  )


class HFMaskedLM:
  """FlaxBertForMaskedLM behind MaskedLM's `apply` signature: logits [B, P, V] at the masked
  positions, gathered from HF's logits at every position (which HF always computes)."""

  def __init__(self, hf_model):
    self.hf_model = hf_model

  def apply(
    self,
    variables,
    input_ids,
    input_mask,
    segment_ids,
    masked_positions,
    *,
    deterministic: bool,
    step=None,
    rngs=None,
  ):
    del step
    logits_BxLxV = self.hf_model(
      input_ids,
      attention_mask=input_mask,
      token_type_ids=segment_ids,
      params=variables['params'],
      train=not deterministic,
      dropout_rng=None if deterministic else rngs['dropout'],
    ).logits
    return jnp.take_along_axis(logits_BxLxV, masked_positions[..., None], axis=1)


def make_hf_step(
  hf_config,
  config: ml_collections.ConfigDict,
  batch: dict,
  seed: int = 1,
  abstract: bool = False,
  dtype: str = 'float32',
) -> Step:
  """The project's train step around FlaxBertForMaskedLM (same optimizer, loss, checks);
  `dtype` is HF's compute dtype (its parameters stay float32, as ours)."""
  import transformers  # optional dependency (the 'test' extra)

  hf_model = transformers.FlaxBertForMaskedLM(
    hf_config, seed=seed, dtype=jnp.dtype(dtype), _do_init=False
  )
  train = train_lib.validate_config(config).train
  tx = build.make_optimizer(train)
  fn = jax.jit(
    step_lib.make_train_step(
      HFMaskedLM(hf_model),
      tx,
      MaskedLMTask(),
      build.learning_rate_schedule(train),
      grad_accum_steps=train.grad_accum_steps,
    ),
    donate_argnums=0,
  )

  def init(key):
    params = hf_model.init_weights(key, (1, batch['input_ids'].shape[1]))
    return step_lib.TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params)
    )

  key = jax.random.key(seed)
  state = jax.eval_shape(init, key) if abstract else jax.jit(init)(key)
  return Step(fn, state, jax.tree.map(jnp.asarray, batch), key)


def compile_hf_step(
  shape: Shape, devices: list, *, dropout: float, dtype: str
) -> jax.stages.Compiled:
  """Hugging Face's train step at `shape`, compiled (never run) for `devices`, e.g. a target's
  compile-only devices: the batch split over them, everything else replicated."""
  step = make_hf_step(
    hf_bert_config(shape, dropout=dropout),
    train_config(shape, dropout=dropout),
    make_batch(shape),
    abstract=True,
    dtype=dtype,
  )
  mesh = Mesh(devices, ('data',))
  replicated = NamedSharding(mesh, PartitionSpec())
  abstract = lambda tree, sharding: jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
  )
  return step.fn.lower(
    abstract(step.state, replicated),
    abstract(step.batch, NamedSharding(mesh, PartitionSpec('data'))),
    abstract(step.rng, replicated),
  ).compile()

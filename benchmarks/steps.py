"""Train steps under benchmark: ours (MaskedLM) and Hugging Face's FlaxBertForMaskedLM.

Both steps do forward + backward + global-norm clipping + AdamW, are jitted with the state
donated, and compute the same loss (`losses.mlm_loss_and_metrics` over the masked positions).
The only intended difference is the model: ours evaluates the MLM head at the masked positions
only; Hugging Face's model returns logits at every position, which we gather at the masked
positions before the same loss.

`make_project_step` is a stand-in for the project's train step (branch `train`), built from the
same pieces (MaskedLM + mlm loss + optax AdamW with clipping, jit with donation); switch to
`realformer_jax.train` once it lands on main.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from realformer_jax import MaskedLM, ModelConfig
from realformer_jax import losses
from realformer_jax import params as params_lib

LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0


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


def make_optimizer() -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(CLIP_NORM),
                     optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY))


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


def model_config(shape: Shape, *, ln_placement: str = 'post', dropout: float = 0.1,
                 **overrides: Any) -> ModelConfig:
  return ModelConfig(
      vocab_size=shape.vocab, hidden_size=shape.hidden, num_layers=shape.layers,
      num_heads=shape.heads, mlp_dim=shape.mlp_dim, max_len=max(512, shape.seq_len),
      dropout_rate=dropout, attention_dropout_rate=dropout, ln_placement=ln_placement,
      **overrides).validate()


def hf_bert_config(shape: Shape, *, dropout: float = 0.1):
  import transformers  # optional dependency (the 'test' extra)
  return transformers.BertConfig(
      vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
      num_attention_heads=shape.heads, intermediate_size=shape.mlp_dim,
      max_position_embeddings=max(512, shape.seq_len), type_vocab_size=2,
      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)


@dataclasses.dataclass
class Step:
  """A jitted train step `fn(state, batch, rng) -> (state, metrics)` and its initial state."""

  fn: Callable
  state: Any
  batch: dict

  def lower(self, rng):
    return self.fn.lower(self.state, self.batch, rng)


def _jit_step(loss_fn, optimizer):
  def train_step(state, batch, rng):
    params, opt_state, step = state
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng, step)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
    return (params, opt_state, step + 1), metrics
  return jax.jit(train_step, donate_argnums=(0,))


def make_project_step(config: ModelConfig, batch: dict, seed: int = 0,
                      abstract: bool = False) -> Step:
  """Our MaskedLM train step (stand-in for the project's `train_step`).

  `abstract=True` gives the state as shapes only: for compile-time and memory analysis.
  """
  model = MaskedLM(config)
  deterministic = config.dropout_rate == 0 and config.attention_dropout_rate == 0

  def loss_fn(params, batch, rng, step):
    logits = model.apply({'params': params}, batch['input_ids'], batch['input_mask'],
                         batch['segment_ids'], batch['masked_positions'],
                         deterministic=deterministic, step=step,
                         rngs={'dropout': jax.random.fold_in(rng, step)})
    return losses.mlm_loss_and_metrics(logits, batch['masked_ids'], batch['masked_weights'])

  optimizer = make_optimizer()
  init_batch = jax.tree.map(jnp.asarray, batch)

  def init(key):
    variables = model.init(key, init_batch['input_ids'][:1], init_batch['input_mask'][:1],
                           init_batch['segment_ids'][:1], init_batch['masked_positions'][:1])
    params = params_lib.unbox(variables['params'])
    return params, optimizer.init(params), jnp.zeros((), jnp.int32)

  return Step(_jit_step(loss_fn, optimizer), _init_state(init, seed, abstract), init_batch)


def _init_state(init, seed: int, abstract: bool):
  """Real initial state, or only its shapes (enough to lower and compile)."""
  if abstract:
    return jax.eval_shape(init, jax.random.key(seed))
  return jax.jit(init)(jax.random.key(seed))


def make_hf_step(hf_config, batch: dict, seed: int = 0, abstract: bool = False) -> Step:
  """FlaxBertForMaskedLM train step: full logits, gathered at the masked positions."""
  import transformers
  model = transformers.FlaxBertForMaskedLM(hf_config, seed=seed, _do_init=False)
  deterministic = (hf_config.hidden_dropout_prob == 0
                   and hf_config.attention_probs_dropout_prob == 0)

  def loss_fn(params, batch, rng, step):
    logits_BxLxV = model(batch['input_ids'], attention_mask=batch['input_mask'],
                         token_type_ids=batch['segment_ids'], params=params,
                         dropout_rng=jax.random.fold_in(rng, step), train=not deterministic
                         ).logits
    logits_BxPxV = jnp.take_along_axis(logits_BxLxV, batch['masked_positions'][..., None], 1)
    return losses.mlm_loss_and_metrics(logits_BxPxV, batch['masked_ids'],
                                       batch['masked_weights'])

  optimizer = make_optimizer()

  def init(key):
    params = model.init_weights(key, (1, batch['input_ids'].shape[1]))
    return params, optimizer.init(params), jnp.zeros((), jnp.int32)

  return Step(_jit_step(loss_fn, optimizer), _init_state(init, seed, abstract),
              jax.tree.map(jnp.asarray, batch))

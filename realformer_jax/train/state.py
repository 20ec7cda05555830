"""Train state, optimizer, and sharded initialisation (no host ever holds the whole model).

Shardings come from the parameters' logical names: `jax.eval_shape(model.init)` gives boxed
abstract params -> `nn.get_partition_spec` -> logical specs; optimizer moments reuse their
parameter's spec (`optax.tree_map_params`); `nn.logical_to_mesh_sharding` maps them onto the
mesh; `jax.jit(init, out_shardings=...)` then creates every array directly in its shards.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from realformer_jax.model.params import unbox
from realformer_jax.train import partitioning
from realformer_jax.train.task import TaskModel

# Parameters that get weight decay; BERT exempts biases and LayerNorm (and here also the
# residual gates and every other scalar or vector parameter).
_DECAYED_PARAM_NAMES = ('kernel', 'embedding')


class OptimizerConfig(Protocol):
  """What the schedule and optimizer read: TrainConfig (train/config.py) or a task's subclass of
  it (seq2seq/config.py)."""

  learning_rate: float
  warmup_steps: int
  num_train_steps: int
  weight_decay: float
  adam_b1: float
  adam_b2: float
  adam_eps: float
  clip_grad_norm: float


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array  # int32 scalar: optimizer updates applied so far
  params: Any
  opt_state: Any


def learning_rate_schedule(train: OptimizerConfig) -> optax.Schedule:
  """Linear warmup from 0 to the peak, then linear decay to 0 at num_train_steps."""
  warmup = optax.linear_schedule(0.0, train.learning_rate, train.warmup_steps)
  decay = optax.linear_schedule(
    train.learning_rate, 0.0, train.num_train_steps - train.warmup_steps
  )
  return optax.join_schedules([warmup, decay], [train.warmup_steps])


def weight_decay_mask(params: Any) -> Any:
  return jax.tree_util.tree_map_with_path(
    lambda path, _: getattr(path[-1], 'key', None) in _DECAYED_PARAM_NAMES, params
  )


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """`optax.clip_by_global_norm` as one scalar factor: t * min(1, max_norm / ||g||).

  optax picks per element between t and t / ||g|| * max_norm. The division is an "expensive"
  op to XLA, so XLA:CPU writes the clipped gradient out as its own array instead of fusing it
  into both AdamW moment updates: an extra write and two extra reads of every gradient (~5% of
  a BERT-Base step). The factor form fuses. Same values up to one rounding; same (empty) state.
  """

  def update_fn(updates, state, params=None):
    del params
    factor = jnp.minimum(1.0, max_norm / optax.tree.norm(updates))  # ||g|| = 0 -> 1
    return jax.tree.map(lambda t: t * factor.astype(t.dtype), updates), state

  return optax.GradientTransformation(lambda params: optax.ClipByGlobalNormState(), update_fn)


def make_optimizer(train: OptimizerConfig) -> optax.GradientTransformation:
  adamw = optax.adamw(
    learning_rate_schedule(train),
    b1=train.adam_b1,
    b2=train.adam_b2,
    eps=train.adam_eps,
    weight_decay=train.weight_decay,
    mask=weight_decay_mask,
  )
  if train.clip_grad_norm > 0:
    return optax.chain(clip_by_global_norm(train.clip_grad_norm), adamw)
  return adamw


@dataclasses.dataclass(frozen=True)
class StateLayout:
  """What a sharded TrainState looks like: shapes, dtypes and shardings of every leaf."""

  abstract: TrainState  # ShapeDtypeStructs carrying their shardings
  shardings: TrainState  # NamedShardings

  @property
  def param_shardings(self) -> Any:
    return self.shardings.params


def _make_init_fn(model, tx, batch_size, data_config, task: TaskModel):
  def init(rng: jax.Array) -> TrainState:
    params = unbox(task.init_variables(model, rng, data_config, batch_size)['params'])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  return init


def state_layout(
  model: Any, tx: optax.GradientTransformation, data_config: Any, mesh, rules, task: TaskModel
) -> StateLayout:
  """Abstract sharded TrainState, computed without allocating any parameter."""
  # One row per data-parallel shard keeps init's activation constraints divisible.
  batch_size = partitioning.data_parallel_size(mesh, rules)
  rng = jax.random.key(0)
  with partitioning.activate(mesh, rules):
    boxed = jax.eval_shape(lambda r: task.init_variables(model, r, data_config, batch_size), rng)
  params = unbox(boxed['params'])
  abstract = TrainState(
    step=jax.ShapeDtypeStruct((), jnp.int32),
    params=params,
    opt_state=jax.eval_shape(tx.init, params),
  )
  param_specs = nn.get_partition_spec(boxed['params'])
  is_spec = lambda x: isinstance(x, PartitionSpec)
  opt_specs = optax.tree_map_params(
    tx,
    lambda _, spec: spec,
    abstract.opt_state,
    param_specs,
    transform_non_params=lambda _: PartitionSpec(),
    is_leaf=is_spec,
  )
  specs = TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs)
  shardings = partitioning.to_mesh_shardings(specs, mesh, rules)
  abstract = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )
  return StateLayout(abstract=abstract, shardings=shardings)


def init_state(
  model: Any,
  tx: optax.GradientTransformation,
  data_config: Any,
  layout: StateLayout,
  rng: jax.Array,
  mesh,
  rules,
  task: TaskModel,
) -> TrainState:
  """Fresh TrainState, created shard by shard on the devices that own it."""
  batch_size = partitioning.data_parallel_size(mesh, rules)
  init = _make_init_fn(model, tx, batch_size, data_config, task)
  with partitioning.activate(mesh, rules):
    return jax.jit(init, out_shardings=layout.shardings)(rng)

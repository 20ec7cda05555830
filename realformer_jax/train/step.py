"""The train and eval steps of every task: tasks differ only in what task.py asks of them (model
call, loss sums, batch weight).

`train_step(state, batch, rng) -> (state, metrics)` is pure: dropout randomness is
`fold_in(rng, state.step)` (then per microbatch), so a resumed run replays the same numbers.
With `grad_accum_steps = A` the batch is split into A microbatches scanned inside the step; the
gradient is that of the summed loss over all microbatches divided by the total number of
predictions, which is exactly the big-batch gradient (up to float summation order).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp
import optax

from realformer_jax.analysis import diagnostics
from realformer_jax.train.task import TaskModel

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array  # int32 scalar: optimizer updates applied so far
  params: Any
  opt_state: Any


def _forward_sums(
  task: TaskModel,
  model: Any,
  params: Any,
  batch: Batch,
  *,
  step: jax.Array,
  rng: Optional[jax.Array],
) -> Metrics:
  """The task's metric sums (`task.sum_metrics`) of one (micro)batch."""
  return task.loss_sums(task.forward(model, params, batch, step=step, rng=rng), batch)


def split_microbatches(batch: Batch, num_micro: int) -> Batch:
  """[B, ...] -> [A, B/A, ...], microbatch j = rows j, j+A, j+2A, ...

  Strided, not contiguous: each device's rows split evenly across microbatches, so no row
  leaves its device (needs (B / data-parallel size) % A == 0, checked by validate_config).
  """

  def split(x):
    x = x.reshape((x.shape[0] // num_micro, num_micro) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)

  return jax.tree.map(split, batch)


def make_train_step(
  model: Any,
  tx: optax.GradientTransformation,
  task: TaskModel,
  schedule: optax.Schedule,
  *,
  grad_accum_steps: int = 1,
  param_shardings: Any = None,
  log_layer_grad_norms: bool = False,
) -> Callable[..., tuple[TrainState, Metrics]]:
  """Builds the pure train step of `task` with `grad_accum_steps` microbatches (an int:
  'auto' is resolved before: build.resolve). `schedule` is the optimizer's learning
  rate, logged per step. `param_shardings` pins gradients to the parameters' layout (under FSDP
  this makes XLA reduce-scatter gradients instead of all-reducing them);
  `log_layer_grad_norms` adds each layer's sublayer gradient norms to the metrics."""
  num_micro = grad_accum_steps
  if not isinstance(num_micro, int) or num_micro < 1:
    raise ValueError(f'grad_accum_steps={num_micro!r}: a positive int (resolve auto first)')

  def grads_and_sums(params, batch, rng, step, loss_scale):
    def loss(p):
      sums = _forward_sums(task, model, p, batch, step=step, rng=rng)
      return sums[task.loss_sum] * loss_scale, sums

    grads, sums = jax.grad(loss, has_aux=True)(params)
    if param_shardings is not None:
      grads = jax.lax.with_sharding_constraint(grads, param_shardings)
    return grads, sums

  def train_step(state: TrainState, batch: Batch, rng: jax.Array):
    step_rng = jax.random.fold_in(rng, state.step)
    # Mean over every prediction of the whole batch, however it is split. The count comes from
    # the batch, so the 1/count rides on the backward pass's scalar seed: dividing the finished
    # gradients instead is one more read and write of every gradient.
    loss_scale = 1.0 / jnp.maximum(task.batch_weight(batch), 1.0)
    if num_micro == 1:
      grads, sums = grads_and_sums(
        state.params, batch, jax.random.fold_in(step_rng, 0), state.step, loss_scale
      )
    else:

      def accumulate(carry, xs):
        index, micro = xs
        grads, sums = grads_and_sums(
          state.params, micro, jax.random.fold_in(step_rng, index), state.step, loss_scale
        )
        return jax.tree.map(jnp.add, carry, (grads, sums)), None

      zeros = (
        jax.tree.map(jnp.zeros_like, state.params),
        {name: jnp.zeros((), jnp.float32) for name in task.sum_metrics},
      )
      (grads, sums), _ = jax.lax.scan(
        accumulate, zeros, (jnp.arange(num_micro), split_microbatches(batch, num_micro))
      )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.tree.norm(grads)  # the same reduction clipping does: XLA computes it once
    # Finite gradients do not make a finite state: an inf learning rate, an eps that is 0 in
    # float32 or a squared gradient that overflows the second moment writes inf or NaN with a
    # finite loss. So the loop checks the new state itself before it saves it (loop.py).
    metrics = dict(
      sums,
      grad_norm=grad_norm,
      learning_rate=schedule(state.step),
      grads_finite=jnp.isfinite(grad_norm),
      state_finite=all_finite((params, opt_state)),
    )
    if log_layer_grad_norms:  # [num_layers] per sublayer: signal-propagation studies
      metrics['layer_grad_norms'] = diagnostics.per_layer_grad_norms(grads)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def all_finite(tree: Any) -> jax.Array:
  """One bool: every float in `tree` is finite. One reduction per leaf, each fused by XLA into
  the elementwise update that writes the leaf (no further pass over the state)."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def make_eval_step(
  model: Any, task: TaskModel, grad_accum_steps: int = 1
) -> Callable[[TrainState, Batch], tuple[Metrics, Metrics]]:
  """`eval_step(state, batch) -> (sums, outputs)`: the task's metric sums of one eval batch and
  its per-row outputs for host-side metrics (`task.eval_outputs`), in the
  train step's microbatches (a batch that needs accumulation to train also needs it to
  evaluate: the forward pass alone holds [B, H, L, L] scores)."""
  num_micro = grad_accum_steps

  def forward(params, batch, step):
    outputs = task.forward(model, params, batch, step=step, rng=None)
    return task.loss_sums(outputs, batch), task.eval_outputs(outputs, batch)

  def eval_step(state: TrainState, batch: Batch) -> tuple[Metrics, Metrics]:
    if num_micro == 1:
      return forward(state.params, batch, state.step)

    def accumulate(totals, micro):
      sums, outputs = forward(state.params, micro, state.step)
      return jax.tree.map(jnp.add, totals, sums), outputs

    zeros = {name: jnp.zeros((), jnp.float32) for name in task.sum_metrics}
    totals, outputs_A = jax.lax.scan(accumulate, zeros, split_microbatches(batch, num_micro))
    return totals, jax.tree.map(_merge_microbatches, outputs_A)

  return eval_step


def _merge_microbatches(x_AxM: jax.Array) -> jax.Array:
  """[A, B/A, ...] from split_microbatches back to [B, ...] in the batch's row order."""
  return jnp.swapaxes(x_AxM, 0, 1).reshape((-1,) + x_AxM.shape[2:])

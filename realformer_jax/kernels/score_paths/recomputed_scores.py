"""The layer stack with residual attention, without saving any layer's carried scores.

Under reverse-mode autodiff a scanned stack saves what each layer's backward pass needs; with
residual attention (and per-layer rematerialisation) that includes every layer's incoming
carried sum acc_{l-1}, a float32 [B, H, L, L] tensor: N of them. At BERT-Base, batch 1,
L = 8192 that is 12 x 3.2 GB. But the sum is invertible layer by layer:

    acc_l = acc_{l-1} + s_l,   s_l = scale * Q_l K_l^T, a function of the layer's input x_l only,

so going down the stack acc_{l-1} = acc_l - s_l can be rebuilt from the final sum and the
saved layer inputs x_l ([B, L, D], small). This custom VJP saves only those and the final
sum; the backward pass, from the top layer down:
  1. s_l from x_l (the layer run on a zero carry, of which only the scores output is used:
     XLA drops the rest of that layer);
  2. acc_{l-1} = acc_l - s_l (layer 0: exactly zero);
  3. the layer's VJP at (x_l, acc_{l-1}): cotangents for its parameters, x_l and acc_{l-1}.
Each layer is recomputed once (as with remat_policy='full') plus its QK^T once more. Peak
memory holds O(1) score-sized tensors instead of O(N). acc_{l-1} is rebuilt to float32
rounding (|error| <= ulp(acc_l)), used only to recompute that layer's softmax.

`ModelConfig.residual_scores_backward='recomputed'` selects it (encoder.py); gradients match
the saved path to float32 rounding (tests/model/test_recomputed_scores.py).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

# layer_fn(params_l, x, acc, index, key, aux) -> (y, acc_new); aux: the layers' shared inputs
# (block.LayerInputs: mask bias, score scale, gate), a pytree whose cotangent is summed.
LayerFn = Callable[..., tuple[jax.Array, jax.Array]]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def residual_stack(
  layer_fn: LayerFn,
  params_N: Any,
  x_BxLxD: jax.Array,
  acc0_BxHxLxL: jax.Array,
  keys_N: Optional[jax.Array],
  aux: Any,
) -> jax.Array:
  """The output of N layers (stacked params, per-layer dropout keys or None)."""
  return _forward(layer_fn, params_N, x_BxLxD, acc0_BxHxLxL, keys_N, aux)[0]


def _forward(layer_fn, params_N, x, acc0, keys_N, aux):
  return scan_up(layer_fn, params_N, x, acc0, keys_N, aux)


def _residual_stack_fwd(layer_fn, params_N, x, acc0, keys_N, aux):
  y, (xs_N, acc) = _forward(layer_fn, params_N, x, acc0, keys_N, aux)
  return y, (params_N, xs_N, acc, keys_N, aux)


def _residual_stack_bwd(layer_fn, residuals, g_y):
  def layer_down(params_l, x_l, acc, index, key, aux, g_x, g_acc):
    _, own_scores = layer_fn(params_l, x_l, jnp.zeros_like(acc), index, key, aux)
    # Layer 0's incoming sum is the zero the stack started from: exact, not a difference.
    acc_prev = jnp.where(index == 0, jnp.zeros_like(acc), acc - own_scores)
    _, vjp = jax.vjp(
      lambda p, x, a, c: layer_fn(p, x, a, index, key, c), params_l, x_l, acc_prev, aux
    )
    g_params, g_x_prev, g_acc_prev, g_aux = vjp((g_x, g_acc))
    return g_params, g_x_prev, g_acc_prev, acc_prev, g_aux

  return scan_down(layer_down, residuals, g_y)


residual_stack.defvjp(_residual_stack_fwd, _residual_stack_bwd)


# The two scans both recomputing stacks share (this one and
# kernels/score_paths/recomputed_stack.py, whose
# layers re-run going down carry the kernels' carried.TopDown instead of a bare sum).


def num_layers(params_N) -> int:
  return jax.tree.leaves(params_N)[0].shape[0]


def scan_up(layer_fn, params_N, x, carry0, keys_N, aux):
  """(y, (each layer's input x_l stacked, the top layer's carried sum))."""

  def body(carry, inputs):
    x, scores = carry
    params_l, index, key = inputs
    y, scores = layer_fn(params_l, x, scores, index, key, aux)
    return (y, scores), x  # save each layer's input

  indices = jnp.arange(num_layers(params_N))
  (y, scores), xs_N = jax.lax.scan(body, (x, carry0), (params_N, indices, keys_N))
  return y, (xs_N, scores)


def scan_down(layer_down, residuals, g_y):
  """The custom VJP's cotangents (params_N, x, acc0, keys_N, aux), from the top layer down.

  residuals: (params_N, xs_N, acc_top, keys_N, aux) as the forward pass saved them;
  layer_down(params_l, x_l, acc_l, index, key, aux, g_x, g_acc) -> (g_params_l, g_x_{l-1},
  g_acc_{l-1}, acc_{l-1}, g_aux_l): one layer's VJP, rebuilding the sum below it.
  """
  params_N, xs_N, acc_top, keys_N, aux = residuals

  def body(carry, inputs):
    g_x, g_acc, acc = carry
    params_l, x_l, index, key = inputs
    g_params, g_x_prev, g_acc_prev, acc_prev, g_aux = layer_down(
      params_l, x_l, acc, index, key, aux, g_x, g_acc
    )
    return (g_x_prev, g_acc_prev, acc_prev), (g_params, g_aux)

  indices = jnp.arange(num_layers(params_N))
  (g_x0, g_acc0, _), (g_params_N, g_aux_N) = jax.lax.scan(
    body, (g_y, jnp.zeros_like(acc_top), acc_top), (params_N, xs_N, indices, keys_N), reverse=True
  )
  g_aux = jax.tree.map(lambda g: jnp.sum(g, axis=0), g_aux_N)  # aux is shared by every layer
  return g_params_N, g_x0, g_acc0, None, g_aux

"""The recomputed-scores layer stack (recomputed_scores.py) on the fused kernels.

Same contract as `recomputed_scores.residual_stack` — saves only each layer's input x_l and the
final sum; going down, each layer is re-run and acc_{l-1} rebuilt — but the rebuilding happens
inside the backward kernel, which reads acc_l anyway, instead of in a pass of its own:
  1. layer l is re-run from x_l with its known sum acc_l (`carried.TopDown`, through the
     layer function of score_path._TopDownPath): the forward
     kernel reads acc_l as the softmax input (no Q K^T for the sum, nothing written);
  2. the layer's VJP: the backward kernel reads acc_l and g_l, writes g_{l-1} and
     acc_{l-1} = acc_l - scale Q_l K_l^T in place, and the layer's other parts get their
     gradients as usual.
Per layer and score element: 8 bytes going up, 4 (re-run) + 16 + 4 (dQ) going down; two
score-sized buffers live at a time (plus the kernels' outputs written in place), however
deep the stack, which is what lets BERT-Base train at L = 16384 on an 80 GB device.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from realformer_jax.kernels.score_paths import carried, recomputed_scores

# layer_fn(params_l, x, scores_carry, index, key, aux) -> (y, scores_carry').
LayerFn = Callable[..., tuple[jax.Array, Any]]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def kernel_residual_stack(
  layer_fns: tuple[LayerFn, LayerFn],
  params_N: Any,
  x_BxLxD: jax.Array,
  acc0_BxHxLxL: jax.Array,
  keys_N: Optional[jax.Array],
  aux: Any,
) -> jax.Array:
  """The output of N layers (stacked params, per-layer dropout keys or None). `layer_fns`:
  (going up: carries the bare sum; going down: carries `carried.TopDown`)."""
  return recomputed_scores.scan_up(layer_fns[0], params_N, x_BxLxD, acc0_BxHxLxL, keys_N, aux)[0]


def _stack_fwd(layer_fns, params_N, x, acc0, keys_N, aux):
  y, (xs_N, acc) = recomputed_scores.scan_up(layer_fns[0], params_N, x, acc0, keys_N, aux)
  return y, (params_N, xs_N, acc, keys_N, aux)


def _stack_bwd(layer_fns, residuals, g_y):
  layer_fn = layer_fns[1]

  def layer_down(params_l, x_l, acc, index, key, aux, g_x, g_acc):
    def layer(p, x, acc_l, shadow, c):
      return layer_fn(p, x, carried.TopDown(acc_l, shadow), index, key, c)

    _, vjp = jax.vjp(layer, params_l, x_l, acc, jnp.zeros_like(acc), aux)
    # The output shadow's cotangent is unused by the kernel's VJP (carried.py); the shadow's
    # "cotangent" is acc_{l-1}, which the backward kernel rebuilt in place.
    g_params, g_x_prev, g_acc_prev, acc_prev, g_aux = vjp(
      (g_x, carried.TopDown(g_acc, jnp.zeros_like(acc)))
    )
    return g_params, g_x_prev, g_acc_prev, acc_prev, g_aux

  return recomputed_scores.scan_down(layer_down, residuals, g_y)


kernel_residual_stack.defvjp(_stack_fwd, _stack_bwd)

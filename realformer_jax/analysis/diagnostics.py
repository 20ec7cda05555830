"""Signal-propagation diagnostics: residual-stream second moments, per-layer gradient norms of
each sublayer, and the DS-Init gradient ratios beta_LN / beta_RC.

All of them read things the model exposes for free when they are not asked for:

  * `residual_second_moment`, sown into 'intermediates' by every layer (apply with
    `mutable=['intermediates']` to get it);
  * each layer's output, through flax's `capture_intermediates` (`layer_outputs`; for analysis
    only), e.g. for `token_cosine`, the rank-collapse measure;
  * parameter gradients, from any grads tree of `MaskedLM` / `SequenceClassifier` / `Encoder`
    (scan layout [num_layers, ...] or loop layout `layers_<i>`);
  * trunk probes: `EncoderLayer` adds a zero 'perturbations' variable to x, r and z of each
    sublayer (block.py). They exist only when the caller passes that collection, so the
    gradients w.r.t. the activations are plain `jax.grad` w.r.t. those zeros:

      perturbations = diagnostics.zero_perturbations(model, params, *inputs)
      def loss_fn(variables):
        logits = model.apply(variables, *inputs)
        return loss(logits)
      param_grads, probe_grads = diagnostics.param_and_probe_grads(loss_fn, params,
                                                                   perturbations)
      ratios = diagnostics.beta_ratios(probe_grads)        # {'attention': {...}, 'mlp': {...}}

Every function here is pure jnp and jittable (they return jnp arrays of shape [num_layers]), so
the training loop can compute them inside its step and pull them to the host with its metrics.

DS-Init ratios (Zhang, Titov & Sennrich 2019, section 3). For one sublayer with trunk input x,
residual sum r = x + g·F(.) and trunk output z (= LN(r) in Post-LN), writing dv = dL/dv:
    beta_LN = |dr| / |dz|     backward through the norm (paper, Post-LN: 0.82-0.86)
    beta_RC = |dx| / |dr|     backward through the residual connection and its branch
                              (paper: 1.10-1.22)
    beta    = beta_LN * beta_RC = |dx| / |dz|   (< 1: the gradient shrinks going down)
Norms are Frobenius norms over the whole [batch, length, hidden] gradient. Where the trunk has
no norm (Pre-LN, none, ReZero) z = r and beta_LN = 1. The gradient w.r.t. the branch output o
itself equals dr (r = x + o), so it carries no information beyond dr and is not probed.
"""

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from realformer_jax.model import params as params_lib

SUBLAYERS = ('attention', 'mlp')
# Trunk probe names per sublayer: (input x, residual sum r, output z). block.py defines them.
PROBES = {
  'attention': ('attention_input', 'attention_residual', 'attention_output'),
  'mlp': ('attention_output', 'mlp_residual', 'mlp_output'),
}


def _encoder_subtree(tree: Mapping) -> Mapping:
  """The dict that directly holds the encoder layers ('layers' or 'layers_<i>'), in the scan
  layout; works on params / grads / intermediates / perturbations of any model."""
  tree = params_lib.stack_layers(tree)  # loop layout -> scan layout; identity otherwise

  def find(node):
    if not isinstance(node, Mapping):
      return None
    if 'layers' in node:
      return node
    for child in node.values():
      found = find(child)
      if found is not None:
        return found
    return None

  found = find(tree)
  if found is None:
    raise ValueError('no encoder layers (a "layers" or "layers_<i>" subtree) in this tree')
  return found


def layer_tree(tree: Mapping) -> Mapping:
  """The per-layer subtree with every leaf stacked on a leading [num_layers] axis."""
  return _encoder_subtree(tree)['layers']


def _stacked_norm(subtree: Any) -> jax.Array:
  """sqrt of the sum of squares over everything but the leading layer axis -> [num_layers]."""
  squares = [
    jnp.sum(jnp.square(leaf.astype(jnp.float32)), axis=tuple(range(1, leaf.ndim)))
    for leaf in jax.tree.leaves(subtree)
  ]
  return jnp.sqrt(sum(squares))


def per_layer_grad_norms(grads: Mapping) -> dict[str, jax.Array]:
  """L2 norm of the gradient of each layer's children, float32 [num_layers] each.

  Keys are the layer's submodules / parameters: always 'attention' (q, k, v and output
  projections with their biases) and 'mlp' (both FFN matrices), plus 'attention_norm' /
  'mlp_norm' where the layer has norms and 'attention_gate' / 'mlp_gate' for ReZero/SkipInit.
  """
  layers = layer_tree(nn.meta.unbox(grads))
  return {name: _stacked_norm(child) for name, child in layers.items()}


def gate_values(params: Mapping) -> dict[str, jax.Array]:
  """ReZero / SkipInit gates per layer ([num_layers] each); empty for other branches."""
  layers = layer_tree(nn.meta.unbox(params))
  return {name: layers[name] for name in ('attention_gate', 'mlp_gate') if name in layers}


def residual_second_moments(intermediates: Mapping) -> jax.Array:
  """mean(y^2) of each layer's output, float32 [num_layers], from the 'intermediates'
  collection of an apply with mutable=['intermediates'] (either layout)."""
  sown = layer_tree(intermediates)['residual_second_moment']
  return jnp.asarray(sown[0] if isinstance(sown, tuple) else sown, jnp.float32)


def _is_layer_call(module: nn.Module, method_name: str) -> bool:
  from realformer_jax.model.block import EncoderLayer  # late: block.py does not import this file

  return isinstance(module, EncoderLayer) and method_name == '__call__'


def layer_outputs(model: nn.Module, variables: Mapping, *args, **kwargs) -> jax.Array:
  """Every encoder layer's output, stacked: [num_layers, batch, length, hidden].

  Uses `capture_intermediates`, which also keeps every sown value (attention maps included):
  for analysis batches, not inside a training step.
  """
  _, state = model.apply(
    variables, *args, capture_intermediates=_is_layer_call, mutable=['intermediates'], **kwargs
  )
  (outputs, _scores), _ = layer_tree(state['intermediates'])['__call__'][0]
  return outputs


def token_cosine(x_BxLxD: jax.Array, input_mask_BxL: jax.Array) -> jax.Array:
  """Mean cosine similarity between the distinct real tokens of each sequence, averaged over
  the batch (scalar). Near 1: the tokens' representations have collapsed onto one direction
  (rank collapse), which deep attention stacks suffer at init."""
  x = x_BxLxD.astype(jnp.float32)
  x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  mask = input_mask_BxL.astype(jnp.float32)
  pair_BxLxL = mask[:, :, None] * mask[:, None, :] * (1.0 - jnp.eye(x.shape[1]))
  cos_BxLxL = jnp.einsum('bld,bmd->blm', x, x)
  per_seq = jnp.sum(cos_BxLxL * pair_BxLxL, (1, 2)) / jnp.maximum(jnp.sum(pair_BxLxL, (1, 2)), 1)
  return jnp.mean(per_seq)


def zero_perturbations(model: nn.Module, params: Mapping, *args, **kwargs) -> dict:
  """Zeros for every trunk probe of `model.apply({'params': params}, *args, **kwargs)`.

  Traces the model once for the shapes (jax.eval_shape); nothing is computed.
  """

  def probes():
    _, state = model.apply({'params': params}, *args, mutable=['perturbations'], **kwargs)
    return state['perturbations']

  shapes = jax.eval_shape(probes)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def param_and_probe_grads(
  loss_fn: Callable[[dict], jax.Array],
  params: Mapping,
  perturbations: Mapping,
  has_aux: bool = False,
):
  """Gradients of `loss_fn(variables)` w.r.t. the parameters and the trunk activations.

  `loss_fn` must pass `variables` (a dict with 'params' and 'perturbations') to model.apply.
  Returns (param_grads, probe_grads[, aux]); probe_grads mirrors the perturbations tree.
  """
  variables = {'params': params, 'perturbations': perturbations}
  if has_aux:
    grads, aux = jax.grad(loss_fn, has_aux=True)(variables)
    return grads['params'], grads['perturbations'], aux
  grads = jax.grad(loss_fn)(variables)
  return grads['params'], grads['perturbations']


def probe_grad_norms(probe_grads: Mapping) -> dict[str, jax.Array]:
  """Frobenius norm of dL/d(activation) per probe, float32 [num_layers] each."""
  layers = layer_tree(probe_grads)
  return {name: _stacked_norm(value) for name, value in layers.items()}


def beta_ratios(probe_grads: Mapping, eps: float = 1e-30) -> dict[str, dict[str, jax.Array]]:
  """DS-Init gradient ratios per sublayer and layer: {'attention'|'mlp': {'beta_ln',
  'beta_rc', 'beta'}} -> float32 [num_layers] (definitions in the module docstring)."""
  norms = probe_grad_norms(probe_grads)
  out = {}
  for sublayer in SUBLAYERS:
    x_name, r_name, z_name = PROBES[sublayer]
    dx, dr, dz = norms[x_name], norms[r_name], norms[z_name]
    out[sublayer] = {
      'beta_ln': dr / jnp.maximum(dz, eps),
      'beta_rc': dx / jnp.maximum(dr, eps),
      'beta': dx / jnp.maximum(dz, eps),
    }
  return out


def flatten_metrics(values: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'attention': [L], ...} (nested dicts allowed) -> {'prefix/attention/layer_03': scalar}
  for a metrics writer. Works on host (numpy) values."""
  flat = {}
  for key, value in values.items():
    name = f'{prefix}/{key}' if prefix else key
    if isinstance(value, Mapping):
      flat.update(flatten_metrics(value, name))
    else:
      for i, v in enumerate(value):
        flat[f'{name}/layer_{i:02d}'] = v
  return flat

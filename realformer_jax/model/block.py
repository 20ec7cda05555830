"""One encoder layer: attention and feed-forward sublayers around the residual stream.

Order of operations (D = dropout on the branch output, g = residual gate, N = norm):
  post / realformer:  h = N(x + g·D(Attn(x)));     y = N(h + g·D(FFN(h)))
  pre:                h = x + g·D(Attn(N(x)));     y = h + g·D(FFN(N(h)))
  none:               h = x + g·D(Attn(x));        y = h + g·D(FFN(h))
Residual attention (the carried scores) is independent of the norm placement and of the gate.

Residual branches (`residual_branch`; the rule for norms and gates is placement.py's, shared
with the decoder; docs/design.md "Layer-norm placement"):
  plain           g = 1.
  rezero          g = a trainable float32 scalar per branch (two per layer: 'attention_gate',
                  'mlp_gate'), initialised to 0, and NO norm inside the layer whatever the
                  placement (Bachlechner et al. 2020): x -> x + g·F(x). Every layer is the
                  identity map at init. Norms outside the layer stack stay: the embedding
                  norm, and Pre-LN's final norm. So 'post' and 'none' give the same layers,
                  'realformer' adds residual attention, 'pre' adds the final norm.
  skipinit        the same zero-initialised trainable scalar (De & Smith 2020), but only
                  norms that sit ON the residual branch are removed: Pre-LN's N(x) before
                  F goes (x -> x + g·F(x), final norm kept); Post-LN's norms sit on the
                  trunk after the sum and stay (x -> N(x + g·F(x)), the identity up to
                  re-normalisation at init). It differs from rezero only for post/realformer.
  fixed_schedule  g = min(1, step / gate_schedule_steps), not trained (Su Jianlin): the same
                  value for every branch, computed by the encoder from the `step` call
                  argument. Norms follow the placement; use ln_placement='none' for the
                  norm-free form.

Diagnostics hooks (free unless asked for, see realformer_jax/analysis/diagnostics.py):
  * `residual_second_moment` (sow, 'intermediates'): mean(y^2) of the layer output.
  * trunk probes (`perturb`, 'perturbations'), per sublayer s in {attention, mlp}:
      'attention_input'  x, the layer input (the attention sublayer's trunk input);
      '<s>_residual'     r = x + g·D(F(.)), the residual sum;
      '<s>_output'       z, the sublayer's trunk output: N(r) for post/realformer, r otherwise;
                         'attention_output' is also the FFN sublayer's input x.
    Gradients w.r.t. them give the DS-Init ratios beta_LN = |dr|/|dz|, beta_RC = |dx|/|dr|.
"""

from typing import Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig
from realformer_jax.kernels import ScorePath
from realformer_jax.model import initializers
from realformer_jax.model.activations import get_activation
from realformer_jax.model.attention import ResidualSelfAttention
from realformer_jax.model.layers import Dropout, configured_dense
from realformer_jax.model.normalization import Norm
from realformer_jax.model.placement import placement, trained_gate

ACTIVATION_AXES = ('batch', 'length', 'embed')

# Speed: a norm recomputed in the backward pass saves only its input (the norm would otherwise
# save about three [B, L, D] tensors per call); recomputing it costs far less than stacking
# those per layer under nn.scan. Same parameters, same numbers.
RecomputedNorm = nn.remat(Norm, prevent_cse=False)


class FeedForward(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, layer: jax.Array) -> jax.Array:
    cfg = self.config
    dense = lambda features, axes, fan_in, fan_out, role, name: configured_dense(
      cfg,
      features=(features,),
      kernel_axes=axes,
      kernel_init=initializers.kernel_init(
        cfg, fan_in=fan_in, fan_out=fan_out, role=role, layer=layer + 1
      ),
      name=name,
    )
    h_BxLxF = dense(cfg.mlp_dim, ('embed', 'mlp'), cfg.hidden_size, cfg.mlp_dim, 'mlp_in', 'wi')(
      x_BxLxD
    )
    h_BxLxF = nn.with_logical_constraint(h_BxLxF, ('batch', 'length', 'mlp'))
    activation = get_activation(cfg.activation)
    wo = dense(cfg.hidden_size, ('mlp', 'embed'), cfg.mlp_dim, cfg.hidden_size, 'mlp_out', 'wo')
    # Speed: recompute activation(h) in the backward pass (elementwise, cheap) so that only h is
    # saved for it; exact GELU would otherwise save four [B, L, F] tensors per layer.
    return nn.remat(lambda mdl, h: mdl(activation(h)), prevent_cse=False)(wo, h_BxLxF)


@flax.struct.dataclass
class LayerInputs:
  """What every layer of the stack gets besides its carry and index (one value for all)."""

  bias_Bx1x1xL: jax.Array  # additive padding mask (attention.mask_bias)
  scale: jax.Array  # multiplier of Q K^T (attention.score_scale)
  gate: Optional[jax.Array]  # the fixed_schedule gate min(1, step / K); None otherwise
  # Dropout off. Static (not a leaf), so remat and scan trace it as a Python bool.
  deterministic: bool = flax.struct.field(pytree_node=False, default=True)
  # How attention runs and its scores are carried (kernels.stack_path, chosen once by the
  # encoder); None: each layer takes kernels.layer_path. Static, like `deterministic`.
  path: Optional[ScorePath] = flax.struct.field(pytree_node=False, default=None)


class EncoderLayer(nn.Module):
  """Scan body: ((x, scores), layer, inputs) -> ((y, scores'), None). `layer` is 0-based."""

  config: ModelConfig

  def _gate(self, name: str, gate_value: Optional[jax.Array]) -> Optional[jax.Array]:
    if placement(self.config).trained_gate:  # ReZero / SkipInit: one scalar per branch
      return trained_gate(self, name)
    return gate_value  # fixed_schedule: the encoder's min(1, step / K); plain: None

  def _add(self, x, branch_out, gate, deterministic):
    branch_out = Dropout(self.config.dropout_rate, generator=self.config.dropout_generator)(
      branch_out, deterministic=deterministic
    )
    if gate is not None:
      branch_out = branch_out * gate.astype(branch_out.dtype)
    return x + branch_out

  def _probe(self, name: str, x: jax.Array) -> jax.Array:
    # A zero 'perturbations' variable added to x, so that grad w.r.t. it is dL/dx. A no-op
    # (no variable, no computation) unless the caller passes that collection; skipped at init
    # so that init() returns parameters only.
    if self.is_initializing():
      return x
    return self.perturb(name, x)

  @nn.compact
  def __call__(self, carry, layer: jax.Array, inputs: LayerInputs):
    cfg = self.config
    x_BxLxD, prev_scores = carry
    bias_Bx1x1xL, scale, gate_value = inputs.bias_Bx1x1xL, inputs.scale, inputs.gate
    deterministic = inputs.deterministic
    layout = placement(cfg)
    post = layout.post
    norm = lambda name: RecomputedNorm(cfg, name=name) if layout.layer_norms else (lambda t: t)

    attention = ResidualSelfAttention(cfg, name='attention')
    attention_norm, mlp_norm = norm('attention_norm'), norm('mlp_norm')

    x_BxLxD = self._probe('attention_input', x_BxLxD)
    attn_in = x_BxLxD if post else attention_norm(x_BxLxD)
    attn_out, scores = attention(
      attn_in, bias_Bx1x1xL, scale, prev_scores, layer, deterministic, inputs.path
    )
    h_BxLxD = self._add(x_BxLxD, attn_out, self._gate('attention_gate', gate_value), deterministic)
    h_BxLxD = self._probe('attention_residual', h_BxLxD)
    if post:
      h_BxLxD = attention_norm(h_BxLxD)
    h_BxLxD = nn.with_logical_constraint(h_BxLxD, ACTIVATION_AXES)
    h_BxLxD = self._probe('attention_output', h_BxLxD)  # also the FFN sublayer's input

    mlp_in = h_BxLxD if post else mlp_norm(h_BxLxD)
    mlp_out = FeedForward(cfg, name='mlp')(mlp_in, layer)
    y_BxLxD = self._add(h_BxLxD, mlp_out, self._gate('mlp_gate', gate_value), deterministic)
    y_BxLxD = self._probe('mlp_residual', y_BxLxD)
    if post:
      y_BxLxD = mlp_norm(y_BxLxD)
    y_BxLxD = nn.with_logical_constraint(y_BxLxD, ACTIVATION_AXES)
    y_BxLxD = self._probe('mlp_output', y_BxLxD)
    # Residual-stream second moment per layer, for signal-propagation diagnostics.
    self.sow(
      'intermediates', 'residual_second_moment', jnp.mean(jnp.square(y_BxLxD.astype(jnp.float32)))
    )
    return (y_BxLxD, scores), None

"""Weight initialisers chosen by name (`ModelConfig.init`, `ModelConfig.parameterization`).

Every dense kernel is initialised through `kernel_init`, which knows the kernel's fan-in and
fan-out (the kernels are multi-dimensional, e.g. [embed, heads, kv], so shape-based fan
inference would be wrong), its role in the block and its 1-based depth `layer` (a traced value
under `nn.scan`; DS-Init divides its bound by sqrt(layer)).

Realised standard deviations (m = fan-in, n = fan-out; docs/design.md §4):

  init                std of every dense kernel            sampled from
  'bert'              0.8796 * init_std                    N(0, init_std^2) cut at +-2 init_std
                                                           (TF1 BERT: the cut is NOT corrected)
  'truncated_normal'  init_std                             N cut at +-2 sigma, sampled with
                                                           1.1368472 * init_std so sigma is exact
  'lecun'             sqrt(1 / m)                          normal
  'he'                sqrt(2 / m)                          normal
  'xavier'            sqrt(2 / (m + n))                    U(+-sqrt(6 / (m + n)))
  'ds_init'           gamma * alpha * sqrt(2/(m+n) / l)    U(+-gamma*alpha*sqrt(6/(m+n)/l))

DS-Init (Zhang, Titov & Sennrich 2019) scales the Xavier bound of every kernel of encoder layer
l (1-based: q, k, v, attention output, both FFN matrices) by 1/sqrt(l); kernels outside the
layer stack (MLM transform, pooler, classifier) have no depth and get l = 1, i.e. Xavier.
Q, K and V are three d x d matrices stored in one fused kernel; each slice gets its own d x d
fans and its own draw.

Embedding tables are lookups, not matmuls: they always use the BERT truncated normal with
`init_std` (corrected when `init='truncated_normal'`), whatever `init` says.

NTK parameterisation stores W_ntk = sqrt(m) * W and multiplies the layer output by 1/sqrt(m) at
run time (`DenseGeneral(ntk=True)`), so every `init` has an NTK form computing the same function
at step 0; with `init='lecun'` the stored weights are N(0, 1), the textbook NTK form. Embedding
tables have fan-in 1 (one-hot input), for which both parameterisations coincide: they stay as
they are (also where the word table doubles as the tied MLM decoder).
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig

Initializer = Callable[[jax.Array, tuple, jnp.dtype], jax.Array]

# Variance of a standard normal truncated at +-2 sigma.
TRUNCATED_NORMAL_VARIANCE = 0.7737413
TRUNCATED_NORMAL_STD = TRUNCATED_NORMAL_VARIANCE**0.5  # 0.8796; 1 / 0.8796 = 1.1368472


def truncated_normal(std: float, corrected: bool) -> Initializer:
  """Normal cut at +-2 std. `corrected=True` rescales so the realised std is `std`;
  uncorrected (TF1's truncated_normal_initializer) realises 0.8796 * std."""
  scale = std / TRUNCATED_NORMAL_STD if corrected else std

  def init(key, shape, dtype=jnp.float32):
    return (scale * jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)).astype(dtype)

  return init


def normal(std) -> Initializer:
  def init(key, shape, dtype=jnp.float32):
    return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)

  return init


def uniform(bound) -> Initializer:
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)

  return init


def _scaled(base: Initializer, factor) -> Initializer:
  def init(key, shape, dtype=jnp.float32):
    return (base(key, shape, jnp.float32) * factor).astype(dtype)

  return init


def xavier_bound(fan_in: int, fan_out: int) -> float:
  return (6.0 / (fan_in + fan_out)) ** 0.5


def ds_init_bound(config: ModelConfig, fan_in: int, fan_out: int, layer) -> jax.Array:
  """gamma * alpha * xavier_bound / sqrt(l), l 1-based (traced under nn.scan)."""
  depth = jnp.asarray(1.0 if layer is None else layer, jnp.float32)
  return (
    config.ds_init_gamma * config.ds_init_alpha * xavier_bound(fan_in, fan_out) / jnp.sqrt(depth)
  )


def standard_kernel_init(
  config: ModelConfig, *, fan_in: int, fan_out: int, layer: Optional[jax.Array] = None
) -> Initializer:
  """The standard-parameterisation initialiser named by `config.init` (see module docstring)."""
  if config.init == 'bert':
    return truncated_normal(config.init_std, corrected=False)
  if config.init == 'truncated_normal':
    return truncated_normal(config.init_std, corrected=True)
  if config.init == 'lecun':
    return normal((1.0 / fan_in) ** 0.5)
  if config.init == 'he':
    return normal((2.0 / fan_in) ** 0.5)
  if config.init == 'xavier':
    return uniform(xavier_bound(fan_in, fan_out))
  if config.init == 'ds_init':
    return uniform(ds_init_bound(config, fan_in, fan_out, layer))
  raise ValueError(f'init={config.init!r}: unknown initialiser')


def kernel_init(
  config: ModelConfig,
  *,
  fan_in: int,
  fan_out: int,
  role: str = 'dense',
  layer: Optional[jax.Array] = None,
) -> Initializer:
  """Initialiser for a dense kernel. `role='query'` gets T5's 1/sqrt(d_head) folding;
  `layer` is the 1-based depth inside the encoder stack (None outside it)."""
  init = standard_kernel_init(config, fan_in=fan_in, fan_out=fan_out, layer=layer)
  if role == 'query' and config.attention_scale == 't5':
    # T5: no 1/sqrt(d) in the forward pass, so shrink the query init instead.
    init = _scaled(init, config.head_dim**-0.5)
  if config.parameterization == 'ntk':
    # Stored sqrt(m) larger; DenseGeneral(ntk=True) multiplies by 1/sqrt(m) at run time.
    init = _scaled(init, fan_in**0.5)
  return init


def embedding_init(config: ModelConfig) -> Initializer:
  """Embedding tables: BERT's truncated normal in both parameterisations (fan-in 1)."""
  return truncated_normal(config.init_std, corrected=config.init == 'truncated_normal')

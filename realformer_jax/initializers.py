"""Weight initialisers chosen by name (`ModelConfig.init`, `ModelConfig.parameterization`).

Every dense kernel is initialised through `kernel_init`, which knows the kernel's fan-in and
fan-out (the kernels are multi-dimensional, e.g. [embed, heads, kv], so shape-based fan
inference would be wrong), its role in the block and its 1-based depth `layer` (a traced value
under `nn.scan`; DS-Init divides its bound by sqrt(layer)).
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from realformer_jax.config import ModelConfig

Initializer = Callable[[jax.Array, tuple, jnp.dtype], jax.Array]

# Variance of a standard normal truncated at +-2 sigma.
TRUNCATED_NORMAL_VARIANCE = 0.7737413
TRUNCATED_NORMAL_STD = TRUNCATED_NORMAL_VARIANCE ** 0.5  # 0.8796


def truncated_normal(std: float, corrected: bool) -> Initializer:
  """Normal cut at +-2 std. `corrected=True` rescales so the realised std is `std`."""
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


def kernel_init(config: ModelConfig, *, fan_in: int, fan_out: int, role: str = 'dense',
                layer: Optional[jax.Array] = None) -> Initializer:
  """Initialiser for a dense kernel. `role='query'` gets T5's 1/sqrt(d_head) folding."""
  if config.parameterization == 'ntk':
    # NTK: unit-variance weights; DenseGeneral multiplies by 1/sqrt(fan_in) at run time.
    base = normal(1.0)
  elif config.init == 'bert':
    base = truncated_normal(config.init_std, corrected=False)
  elif config.init == 'truncated_normal':
    base = truncated_normal(config.init_std, corrected=True)
  elif config.init == 'lecun':
    base = normal((1.0 / fan_in) ** 0.5)
  elif config.init == 'he':
    base = normal((2.0 / fan_in) ** 0.5)
  elif config.init == 'xavier':
    base = uniform((6.0 / (fan_in + fan_out)) ** 0.5)
  elif config.init == 'ds_init':
    depth = 1.0 if layer is None else jnp.asarray(layer, jnp.float32)
    xavier_bound = (6.0 / (fan_in + fan_out)) ** 0.5
    base = uniform(config.ds_init_gamma * config.ds_init_alpha * xavier_bound
                   / jnp.sqrt(depth))
  else:
    raise ValueError(f'init={config.init!r}: unknown initialiser')

  if role == 'query' and config.attention_scale == 't5':
    # T5: no 1/sqrt(d) in the forward pass, so shrink the query init instead.
    query_scale = config.head_dim ** -0.5
    return lambda key, shape, dtype=jnp.float32: (
        base(key, shape, jnp.float32) * query_scale).astype(dtype)
  return base


def embedding_init(config: ModelConfig) -> Initializer:
  if config.parameterization == 'ntk':
    return normal(1.0)
  return truncated_normal(config.init_std, corrected=config.init == 'truncated_normal')

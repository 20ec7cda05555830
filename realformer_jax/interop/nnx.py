"""The linen modules of this package inside a Flax NNX program.

    from flax import nnx
    from realformer_jax.interop.nnx import to_nnx
    model = to_nnx(MaskedLM(cfg), ids, rngs=nnx.Rngs(0))  # an initialised nnx.Module
    logits = model(ids, mask)             # dropout: model(ids, mask, deterministic=False)
    optimizer = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)

linen stays the source of truth: `to_nnx` wraps a linen module with `nnx.bridge.ToNNX` and
initialises it on sample inputs. It does so with NNX's eager sharding off: every parameter of
this package carries logical axis names ('embed', 'vocab', 'layers', ...), which eager sharding
would turn into a device placement at creation and so demand a mesh before the model exists.
The names are kept as each `nnx.Param`'s `out_sharding` metadata, so `logical_specs(model)`
gives the PartitionSpecs of logical names a user maps onto a mesh with their own rules
(`flax.linen.logical_to_mesh_sharding`), exactly as the linen training loop does.

`nnx.to_pure_dict(nnx.state(model, nnx.Param))` is the linen `params` tree of the same module.
"""

from typing import Any

import flax.linen as nn
from flax import nnx


def to_nnx(
  module: nn.Module, *sample_args: Any, rngs: nnx.Rngs, **sample_kwargs: Any
) -> nnx.Module:
  """`module` (a linen module, e.g. `MaskedLM(cfg)` or `Encoder(cfg)`) as an NNX module whose
  parameters are initialised from `rngs` by a call on `sample_args` / `sample_kwargs`."""
  with nnx.use_eager_sharding(False):
    model = nnx.bridge.ToNNX(module, rngs=rngs)
    nnx.bridge.lazy_init(model, *sample_args, **sample_kwargs)
  return model


def logical_specs(model: nnx.Module) -> Any:
  """PartitionSpecs of logical axis names for `model`'s parameters, as a plain dict shaped like
  the linen params (`nnx.to_pure_dict(nnx.state(model, nnx.Param))`); None is a replicated
  axis. `flax.linen.logical_to_mesh_sharding(specs, mesh, rules)` turns them into shardings."""
  return nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(model, nnx.Param)))

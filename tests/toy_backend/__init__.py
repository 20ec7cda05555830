"""A toy kernel backend: the fused kernels' contract in plain jnp, as a newcomer would add one.

The whole backend is this folder: the record below, its one registration, and attention.py.
tests/kernels/test_kernel_backends.py copies the folder outside the repository, imports it and
trains a model through it (docs/extending.md, "A kernel backend").
"""

from realformer_jax.kernels import backends

BACKEND = backends.register(
  backends.Backend(
    name='toy',
    attention_impl='toy_einsum',  # model.attention_impl='toy_einsum' selects it
    platform='cpu',  # it runs as it is on a CPU (no interpret mode needed)
    attention=f'{__name__}.attention',  # imported when a model first runs through it
    dropout=False,  # attention.py draws no dropout mask: the record says so, select refuses it
  )
)

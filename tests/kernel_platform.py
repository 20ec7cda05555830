"""How the kernel tests run on this machine: compiled on the kernels' own hardware, else in
Pallas interpret mode (the one place this is decided for tests/kernels/test_kernels.py).

On a GPU the Triton kernels run compiled (and the Mosaic ones interpreted); on a TPU the Mosaic
kernels compiled (Triton interpreted); on a CPU both interpreted. Compiled kernels are held to
the platform's tolerance: their float32 dots may run at TF32 (GPU) or bfloat16 passes (TPU), so
a stated float32 tolerance is widened to the run-time self-check's (analysis/kernel_check.py)."""

import jax

from realformer_jax import kernels
from realformer_jax.analysis import kernel_check

PLATFORM = kernels.platform_of(jax.devices())
NATIVE = {'gpu': 'triton', 'tpu': 'mosaic'}.get(PLATFORM)


def interpret(backend: str) -> bool:
  """Whether the `backend` kernels run in interpret mode here."""
  return backend != NATIVE


def attention_platform(backend: str) -> str:
  """ModelConfig.attention_platform that runs `backend` here: this platform's own kernels
  compiled, any other in interpret mode ('cpu')."""
  return PLATFORM if not interpret(backend) else 'cpu'


def blocks(backend: str, seq_len: int, toy: dict) -> dict:
  """Tile sizes: the toy ones in interpret mode (many tiles), the real ones compiled."""
  if interpret(backend):
    return toy
  block_q, block_k, block_bwd = kernels.block_sizes(backend, seq_len, False)
  return dict(block_q=block_q, block_k=block_k, block_bwd=block_bwd)


def rtol(stated: float) -> float:
  """A stated tolerance, widened on an accelerator to the compiled kernels' float32 one."""
  return stated if NATIVE is None else max(stated, kernel_check.TOLERANCE['float32'])

"""Run by tests/kernels/test_mosaic_gpu.py in a subprocess with JAX_PLATFORMS=cpu and the CUDA
plugin installed (the `aot` extra): the Hopper kernels (kernels/backends/mosaic_gpu/) lowered
and compiled deviceless for an H100 (sm_90a; realformer_jax/aot/targets.py): post attention's
forward + backward through the fused op, the qk forward, and the qk backward (the dS kernel
with the 12 layers' keys resident in shared memory, inside Triton's GEMMs), bfloat16, dropout
on. Prints one JSON line: the Mosaic GPU calls in each optimized program, by the named scope
they carry, and the dS kernel's registers, spills and SASS instructions per score element."""

import json
import os
import pathlib
import re
import shutil
import tempfile

# Mosaic GPU assembles its kernels during XLA's compile, deviceless too: the plugin writes each
# kernel's PTX and ptxas report here (read before jax starts compiling).
DUMP = tempfile.mkdtemp(prefix='mosaic_gpu_dump_')
os.environ.update(MOSAIC_GPU_DUMP_TO=DUMP, MOSAIC_GPU_DUMP_PTX='1', MOSAIC_GPU_DUMP_PTXAS='1')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from realformer_jax import kernels  # noqa: E402
from realformer_jax.aot import sass, targets  # noqa: E402
from realformer_jax.kernels.backends.mosaic_gpu import qk_attention  # noqa: E402
from realformer_jax.kernels.dropout.dropout_bits import keep_threshold  # noqa: E402


def _calls(text: str) -> list[str]:
  """The named scope (mosaic_gpu_...) of every Mosaic GPU custom call in an optimized program."""
  calls = [line for line in text.splitlines() if 'custom_call_target="mosaic_gpu' in line]
  return sorted(
    re.search(r'mosaic_gpu_[a-z_]+', line.split('op_name=')[1]).group(0) for line in calls
  )


def _machine_code(kernel: str) -> dict:
  """ptxas's spill bytes and the SASS instructions per score element (aot/sass.py) of the
  Mosaic GPU kernel named `kernel`, from the dump."""
  ptx = next(pathlib.Path(DUMP).glob(f'{kernel}_*.ptx'))
  report = ptx.with_suffix('.ptxas').read_text()
  spills = [int(n) for n in re.findall(r'(\d+) bytes spill (?:stores|loads)', report)]
  (cost,) = sass.sass_cost(ptx.read_text()).values()
  return {
    'spill_bytes': sum(spills),
    'registers': int(re.search(r'Used (\d+) registers', report).group(1)),
    'sass_per_element': cost.total_per_element,
  }


def main(batch=1, seq_len=512, heads=2, head_dim=64, layers=12):
  mesh = Mesh(np.array(targets.parse('h100:1').devices()[:1]), ('x',))
  one = NamedSharding(mesh, P())
  bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=one)  # noqa: E731
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=one)  # noqa: E731
  tiles = kernels.block_sizes('mosaic_gpu', seq_len, False)
  spec = kernels.KernelSpec(
    'mosaic_gpu', carry_in=False, carry_out=False, keep_threshold=keep_threshold(0.9),
    heads_total=heads, block_q=tiles[0], block_k=tiles[1], block_bwd=tiles[2],
  )  # fmt: skip
  scalars = (
    f32(batch, seq_len),
    f32(batch, 2),
    jax.ShapeDtypeStruct((4,), jnp.uint32, sharding=one),
  )

  def loss(qkv, bias, fparams, iparams):
    out, _ = kernels.fused_attention(qkv, None, bias, fparams, iparams, spec)
    return jnp.sum(out.astype(jnp.float32))

  post = jax.jit(jax.grad(loss)).lower(bf16(batch, seq_len, 3, heads, head_dim), *scalars)

  def qk(stack, v, bias, fparams, iparams, layer):
    return qk_attention.forward(stack, v, bias, fparams, iparams, layer, spec)[0]

  stack = bf16(2, layers, batch, seq_len, heads, head_dim)
  layer = jax.ShapeDtypeStruct((1,), jnp.int32, sharding=one)
  rows = bf16(batch, seq_len, heads, head_dim)
  qk_fwd = jax.jit(qk).lower(stack, rows, *scalars, layer)

  def qk_bwd(stack, v, do, m, log_l, delta, bias, fparams, iparams, layer):
    g_stack = jnp.zeros(stack.shape, stack.dtype)
    return qk_attention.backward(
      stack, v, do, (m, log_l), delta, bias, fparams, iparams, layer, None, g_stack, spec
    )

  stats = (f32(batch, heads, seq_len),) * 3  # m, log l, delta
  with qk_attention.resident_keys():  # the Hopper dS kernel: opt-in
    qk_bwd = jax.jit(qk_bwd).lower(stack, rows, rows, *stats, *scalars, layer)
  print(
    json.dumps(
      {
        'tiles': list(tiles),
        'post': _calls(post.compile().as_text()),
        'qk_forward': _calls(qk_fwd.compile().as_text()),
        'qk_backward': _calls(qk_bwd.compile().as_text()),
        'qk_ds_machine_code': _machine_code('mosaic_gpu_qk_attention_ds'),
      }
    )
  )


if __name__ == '__main__':
  try:
    main()
  finally:
    shutil.rmtree(DUMP, ignore_errors=True)

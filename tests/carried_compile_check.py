"""Run by tests/aot/test_carried_backward_sass.py in a subprocess with JAX_PLATFORMS=cpu and the
CUDA plugin installed (the `aot` extra): RealFormer's carried-sum kernels (scores carry), forward
and backward as the layer stack calls them (carries in and out, acc_{l-1} rebuilt), dQ by the
path the first argument names ('read_back' or 'atomic': attention.dq_path), compiled
deviceless for an H100 (realformer_jax/aot/targets.py) at head size 64, bf16, dropout on. Prints
one JSON line: the Pallas kernels in the optimized program and what each states it costs, the
atomic updates in their bodies (`atomic_rmw` in the jaxpr), and from the PTX XLA dumped, each
kernel's SASS for sm_90a (aot/sass.py): its global atomic instructions and each loop's
instructions, exponentials and score elements per trip (the kernel's stated tile over its
threads)."""

import json
import pathlib
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from realformer_jax.aot import ptx, sass, targets
from realformer_jax.kernels import KernelSpec
from realformer_jax.kernels.backends.triton import attention as triton_attention
from realformer_jax.kernels.backends.triton import plan_tiles
from realformer_jax.kernels.dropout.dropout_bits import keep_threshold
from realformer_jax.kernels.plumbing import fused

ATOMIC_OPCODES = ('RED', 'ATOM', 'ATOMG', 'REDG')  # global atomics (ATOMS is shared memory)


def main(path: str, seq_len: int = 256, batch: int = 2, heads: int = 2, head_dim: int = 64):
  mesh = Mesh(np.array(targets.parse('h100:1').devices()[:1]), ('x',))
  one = NamedSharding(mesh, P())
  block_q, block_k, block_bwd = plan_tiles(seq_len, False)
  spec = KernelSpec(
    'triton',
    carry_in=True,
    carry_out=True,
    keep_threshold=keep_threshold(0.9),
    heads_total=heads,
    block_q=block_q,
    block_k=block_k,
    block_bwd=block_bwd,
  )

  def step(qkv, acc, bias, fparams, iparams, g_out, g_acc):
    out, lse, acc_out, bits = fused.kernel_forward(qkv, acc, bias, fparams, iparams, spec)
    return fused.attention_backward(
      qkv, acc_out, g_acc, bias, fparams, iparams, out, lse, bits, g_out, spec, rebuild=True
    )

  scores = (batch, heads, seq_len, seq_len)
  rows = (batch, seq_len, heads, head_dim)
  args = [
    jax.ShapeDtypeStruct((batch, seq_len, 3, heads, head_dim), jnp.bfloat16, sharding=one),
    jax.ShapeDtypeStruct(scores, jnp.float32, sharding=one),
    jax.ShapeDtypeStruct((batch, seq_len), jnp.float32, sharding=one),
    jax.ShapeDtypeStruct((batch, 2), jnp.float32, sharding=one),
    jax.ShapeDtypeStruct((4,), jnp.uint32, sharding=one),
    jax.ShapeDtypeStruct(rows, jnp.float32, sharding=one),
    jax.ShapeDtypeStruct(scores, jnp.float32, sharding=one),
  ]
  compiled_step = jax.jit(step, in_shardings=(one,) * len(args))
  with tempfile.TemporaryDirectory() as dump, triton_attention.dq_path(path):
    text = compiled_step.lower(*args).compile({'xla_dump_to': dump}).as_text()
    jaxpr = str(jax.make_jaxpr(step)(*args))
    stated = {}
    for name, metadata in re.findall(
      r'name = "(\w+)"[^\n]*?serialized_metadata = "(\{.*?\})"', text
    ):
      stated[name] = json.loads(metadata.replace('\\22', '"'))
    # only the kernels' own modules: XLA's fusions' PTX is not always one this ptxas takes
    costs = sass.from_dump(dump, tuple(stated))
    code = {}
    for file in sorted(pathlib.Path(dump).glob('*.ptx')):
      if set(ptx.entries(file.read_text())) & set(stated):
        code.update(sass.functions(sass.disassemble(file.read_text())))
  report = {
    'kernels': sorted(stated),
    'atomic_rmw': jaxpr.count('atomic_rmw'),
    'stated': stated,
    'global_atomics': {
      name: sum(ins.opcode.split('.')[0] in ATOMIC_OPCODES for ins in instructions)
      for name, instructions in code.items()
      if name in stated
    },
    'loops': {
      name: costs[name].with_tile(float(stated[name].get('tile_elements', 0))).record()['loops']
      for name in stated
      if name in costs
    },
  }
  print(json.dumps(report))


if __name__ == '__main__':
  main(sys.argv[1], *(int(a) for a in sys.argv[2:]))

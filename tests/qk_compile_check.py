"""Run by tests/kernels/test_qk_carry.py in a subprocess with JAX_PLATFORMS=cpu and the CUDA plugin
installed (the `aot` extra): the qk kernels' op, forward and backward, compiled deviceless for
an H100 (realformer_jax/aot/targets.py), bfloat16 stack, 8 layers (the backward's slot
buckets), dropout on, once with each dropout generator. Prints one JSON line, by generator:
the Pallas kernels in the optimized program, what each states it costs, the atomic updates in
the kernels' bodies (`atomic_rmw`, what `plgpu.atomic_add` binds, counted in the jaxpr: the
Triton IR in the program is bytecode), and from the PTX XLA dumped for sm_90a (aot/ptx.py)
each kernel's innermost loops that issue warpgroup MMAs (their MMA count and the N of every
`wgmma.wait_group N` in them), its `mul.hi.u32` count (philox's inline PTX) and its
exponentials: `ex2.approx.ftz.f32` (the softmax's inline PTX) and libdevice `__nv_expf`'s
range reduction (`fma.rm.f32`), which the kernels no longer call."""

import json
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from realformer_jax.aot import ptx, targets
from realformer_jax.kernels.dropout.dropout_bits import GENERATORS
from realformer_jax.kernels.plumbing.select import AttentionPlan
from realformer_jax.kernels.score_paths import qk_carry


def main(seq_len: int = 256, layers: int = 8, batch: int = 1, heads: int = 2, head_dim: int = 64):
  report = {
    generator: compiled(generator, seq_len, layers, batch, heads, head_dim)
    for generator in GENERATORS
  }
  print(json.dumps(report))


def compiled(generator: str, seq_len: int, layers: int, batch: int, heads: int, head_dim: int):
  mesh = Mesh(np.array(targets.parse('h100:1').devices()[:1]), ('x',))
  one = NamedSharding(mesh, P())
  plan = AttentionPlan('pallas', 'triton', False, 128, 64, 64, dropout_generator=generator)

  def loss(stack, v, weights, bias, key):
    context, passed = qk_carry.kernel_attention(
      plan, stack, v, jnp.asarray(layers // 2), bias, jnp.asarray(head_dim**-0.5), None, key, 0.9
    )
    return jnp.sum(context.astype(jnp.float32) * weights) + jnp.sum(passed.astype(jnp.float32))

  rows = (batch, seq_len, heads, head_dim)
  args = (
    jax.ShapeDtypeStruct((2, layers) + rows, jnp.bfloat16, sharding=one),
    jax.ShapeDtypeStruct(rows, jnp.bfloat16, sharding=one),
    jax.ShapeDtypeStruct(rows, jnp.float32, sharding=one),
    jax.ShapeDtypeStruct((batch, 1, 1, seq_len), jnp.float32, sharding=one),
    jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=one),
  )
  grad = jax.jit(jax.grad(loss, argnums=(0, 1)), in_shardings=(one,) * 5, out_shardings=(one,) * 2)
  with tempfile.TemporaryDirectory() as dump:
    text = grad.lower(*args).compile({'xla_dump_to': dump}).as_text()
    kernels = ptx.entries(ptx.dumped(dump))
  atomics = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(*args)).count('atomic_rmw')
  stated = {}
  for name, metadata in re.findall(
    r'name = "(realformer_qk_attention_\w+)".*?serialized_metadata = "(\{.*?\})"', text
  ):
    stated[name] = json.loads(metadata.replace('\\22', '"'))
  ours = {name: body for name, body in kernels.items() if name.startswith('realformer_qk')}
  mma_loops = {
    name: [
      {'mma': loop.count('wgmma.mma_async'), 'waits': loop.mma_waits()}
      for loop in ptx.innermost_mma_loops(body)
    ]
    for name, body in ours.items()
  }
  mul_hi = {
    name: ptx.opcodes(body.splitlines()).get('mul.hi.u32', 0) for name, body in ours.items()
  }
  exps = {
    name: {
      'ex2': ptx.opcodes(body.splitlines()).get('ex2.approx.ftz.f32', 0),
      'libdevice_expf': ptx.opcodes(body.splitlines()).get('fma.rm.f32', 0),
    }
    for name, body in ours.items()
  }
  return {
    'kernels': sorted(stated),
    'atomic_rmw': atomics,
    'stated': stated,
    'mma_loops': mma_loops,
    'mul_hi': mul_hi,
    'exps': exps,
  }


if __name__ == '__main__':
  main(*(int(a) for a in sys.argv[1:]))

"""Run by tests/kernels/test_ring_permutes.py in a subprocess with 8 forced CPU devices:

    python -m tests.ring_permutes_check FAMILY SEQUENCE [rerun]

the collective-permutes in the lowered (not compiled: XLA may fuse or split them) train step of
a tiny model of FAMILY (tests/sequence_parallel_check.py's) on a sequence axis of SEQUENCE
devices. Each ring loop body appears once in the program text whatever its trip count, so the
count says how many ring passes a step's program holds: with residual_carry='qk' the layers
going up run the forward ring, and going down only the backward's (the forward's output and
row statistics saved, qk_carry.SavedAttention), never the forward again. `rerun`: as before
that, the layers re-run going down keep nothing and run the forward ring again (the count to
compare with). Prints one JSON line."""

import json
import sys

import jax

from realformer_jax.kernels.score_paths import score_path
from realformer_jax.train import build, pretraining
from tests import sequence_parallel_check as check


def main():
  family, sequence = sys.argv[1], int(sys.argv[2])
  if sys.argv[3:] == ['rerun']:
    score_path.RingQKPath.saved_attention = lambda self, stack0: None
  mesh = (1, 1, 1, sequence)
  devices = jax.devices()[:sequence]
  spec = pretraining.validate_config(
    check.config_for(family, mesh), device_count=len(devices), process_count=1
  )
  setup = build.make_setup(spec, devices)
  train_step = build.step_lib.make_train_step(
    setup.model,
    setup.tx,
    setup.task,
    build.learning_rate_schedule(spec.train),
    grad_accum_steps=spec.train.grad_accum_steps,
    param_shardings=setup.layout.param_shardings,
  )
  jitted = jax.jit(
    train_step,
    in_shardings=(setup.layout.shardings, setup.batch_sharding, setup.replicated),
    out_shardings=(setup.layout.shardings, setup.replicated),
  )
  batch = next(iter(setup.abstract_batches()))
  with build.activate(setup.mesh, setup.rules):
    text = jitted.lower(setup.layout.abstract, batch, setup.abstract_rng()).as_text()
  print(json.dumps({'collective_permutes': text.count('stablehlo.collective_permute')}))


if __name__ == '__main__':
  main()

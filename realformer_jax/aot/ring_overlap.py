"""The ring's communication in an ESTIMATED step: how much of it hides behind the ring's compute.

A sequence split over n devices (kernels/score_paths/ring_attention.py) sends every key / value
block n - 1
hops going up and n - 1 (with its gradient, n) going down, per layer; each hop is a
collective-permute the roofline already costs (roofline.py: S bytes over the interconnect, its
loop's trip count times). The ring issues each hop before the block compute it does not
depend on, so the hop hides behind that compute where the compute is longer. Every hop of a
ring carries the same bytes and every block the same work, so the exposed link time is

    exposed = max(0, ring link seconds - ring block compute seconds)

summed over the step, where the ring's block compute is every kernel the ring's ops lowered to
(their HLO op_name carries ring_attention.SCOPE). The step with the ring overlapped is then

    compute + other collectives + exposed

(other collectives, e.g. a data-parallel gradient all-reduce, stay unoverlapped, as in
`Estimate.seconds`). All of it is as estimated as the roofline it reads.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from realformer_jax.aot.roofline import Estimate
from realformer_jax.kernels.score_paths.ring_attention import SCOPE

PERMUTE = 'collective-permute'


@dataclasses.dataclass(frozen=True)
class RingOverlap:
  hops: int  # collective-permutes executed per step
  link_bytes: float  # bytes they send per device
  link_seconds: float  # their estimated interconnect time
  block_seconds: float  # the ring's block compute they can hide behind
  other_seconds: float  # every other kernel and collective, unoverlapped

  @property
  def exposed_seconds(self) -> float:
    return max(0.0, self.link_seconds - self.block_seconds)

  @property
  def step_seconds(self) -> float:
    """The ESTIMATED step with each hop hidden behind its block's compute."""
    return self.other_seconds + self.block_seconds + self.exposed_seconds


def _in_ring(kernel) -> bool:
  return SCOPE in kernel.op_name


def ring_overlap(estimate: Estimate) -> Optional[RingOverlap]:
  """The ring's share of `estimate`, or None for a program without a ring."""
  hops = [k for k in estimate.kernels if k.opcode.startswith(PERMUTE) and _in_ring(k)]
  if not hops:
    return None
  block = [k for k in estimate.kernels if _in_ring(k) and not k.is_collective]
  link = sum(k.total_seconds for k in hops)
  block_seconds = sum(k.total_seconds for k in block)
  return RingOverlap(
    hops=sum(k.count for k in hops),
    link_bytes=sum(k.work.get('link_bytes', 0.0) * k.count for k in hops),
    link_seconds=link,
    block_seconds=block_seconds,
    other_seconds=estimate.seconds - link - block_seconds,
  )


def report_lines(estimate: Estimate) -> list[str]:
  """experiments.compile's lines about the ring (none without one)."""
  ring = ring_overlap(estimate)
  if ring is None:
    return []
  return [
    f'ring attention (kernels/score_paths/ring_attention.py): {ring.hops:,} hops per step, '
    f'{ring.link_bytes / 1e9:.1f} GB sent per device, ESTIMATED {ring.link_seconds * 1e3:.1f} '
    f"ms of link time against {ring.block_seconds * 1e3:.1f} ms of the ring's block compute: "
    f'{ring.exposed_seconds * 1e3:.1f} ms exposed',
    f'ESTIMATED step time with each ring hop hidden behind its block: '
    f'{ring.step_seconds * 1e3:.1f} ms (aot/ring_overlap.py)',
  ]


def figures(estimate: Estimate) -> Optional[dict]:
  """The ring's figures for report.json (None without a ring)."""
  ring = ring_overlap(estimate)
  if ring is None:
    return None
  return {
    **dataclasses.asdict(ring),
    'exposed_seconds': ring.exposed_seconds,
    'step_seconds': ring.step_seconds,
  }

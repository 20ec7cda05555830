"""benchmarks/trace_breakdown.py sorts a program's ops with the estimate's opcode lists
(realformer_jax/aot/categories.py): a data-movement kernel and a collective land in the same
category in the measured breakdown as in the roofline estimate. Pure HLO text, no device."""
# ruff: noqa: E501  (HLO instructions are one line each, as XLA prints them)

from benchmarks import trace_breakdown
from realformer_jax.aot import categories, roofline, targets

PROGRAM = """HloModule moves

%reverse_rows (p0: f32[64,64]) -> f32[64,64] {
  %p0 = f32[64,64]{1,0} parameter(0)
  ROOT %rev.1 = f32[64,64]{1,0} reverse(%p0), dimensions={0}
}

%scaled (p0: f32[64,64]) -> f32[64,64] {
  %p0 = f32[64,64]{1,0} parameter(0)
  %c = f32[] constant(2)
  %b = f32[64,64]{1,0} broadcast(%c), dimensions={}
  ROOT %m = f32[64,64]{1,0} multiply(%p0, %b)
}

ENTRY %main (x: f32[64,64]) -> f32[64,64] {
  %x = f32[64,64]{1,0} parameter(0)
  %reverse_fusion = f32[64,64]{1,0} fusion(%x), kind=kLoop, calls=%reverse_rows
  %a2a-start = ((f32[64,64]{1,0}), f32[64,64]{1,0}) all-to-all-start(%reverse_fusion), replica_groups={{0,1}}
  %a2a-done = f32[64,64]{1,0} all-to-all-done(%a2a-start)
  %broadcast-1 = f32[64,64]{1,0} collective-broadcast(%a2a-done), replica_groups={{0,1}}
  ROOT %scale_fusion = f32[64,64]{1,0} fusion(%broadcast-1), kind=kLoop, calls=%scaled
}
"""


def test_measured_and_estimated_breakdowns_sort_ops_alike():
  measured = trace_breakdown.categorize_hlo(PROGRAM)
  assert measured['reverse_fusion'] == trace_breakdown.MOVEMENT
  assert measured['a2a-start'] == measured['a2a-done'] == trace_breakdown.COLLECTIVE
  assert measured['broadcast-1'] == trace_breakdown.COLLECTIVE
  assert measured['scale_fusion'] == trace_breakdown.OTHER
  estimated = {
    k.name: k.category for k in roofline.estimate(PROGRAM, targets.parse('h100:2')).kernels
  }
  assert estimated['reverse_fusion'] == categories.COPIES
  assert estimated['a2a-start'] == estimated['broadcast-1'] == categories.COLLECTIVES
  assert estimated['scale_fusion'] == categories.ELEMENTWISE

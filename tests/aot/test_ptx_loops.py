"""aot/ptx.py finds a kernel's loops by control flow, not by text order: a hand-written PTX body
laid out as LLVM lays out a rotated loop nest (the inner loop placed after the outer latch,
entered and left by jumps), as the qk kernels' PTX is."""

from realformer_jax.aot import ptx

KERNEL = """
.visible .entry toy_kernel(
	.param .u64 toy_kernel_param_0
)
{
	.reg .pred 	%p<4>;
	mov.u32 	%r1, 0;
	bra.uni 	$L__BB0_1;
$L__BB0_4:
	wgmma.wait_group.sync.aligned 0;
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1, 0, 0;
	wgmma.wait_group.sync.aligned 0;
	@!%p1 bra 	$L__BB0_5;
$L__BB0_1:
	add.s32 	%r1, %r1, 1;
	@%p2 bra 	$L__BB0_4;
	mov.u32 	%r2, 0;
$L__BB0_3:
	cp.async.wait_group 	2;
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1, 0, 0;
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1, 0, 0;
	wgmma.wait_group.sync.aligned 1;
	mul.hi.u32 	%r3, %r2, -766435501;
	@%p3 bra 	$L__BB0_3;
	bra.uni 	$L__BB0_4;
$L__BB0_5:
	ret;
}
"""


def test_loops_are_found_by_control_flow_not_text_order():
  body = ptx.entries(KERNEL)['toy_kernel']
  loops = {loop.header: loop for loop in ptx.loops(body)}
  assert set(loops) == {'$L__BB0_1', '$L__BB0_3'}
  inner, outer = loops['$L__BB0_3'], loops['$L__BB0_1']
  assert inner.innermost and not outer.innermost
  assert inner.blocks < outer.blocks  # nested, though placed after the outer latch
  assert (inner.count('wgmma.mma_async'), inner.mma_waits()) == (2, [1])
  assert (outer.count('wgmma.mma_async'), outer.mma_waits()) == (3, [0, 0, 1])
  assert ptx.innermost_mma_loops(body) == [inner]
  assert ptx.opcodes(inner.lines)['mul.hi.u32'] == 1

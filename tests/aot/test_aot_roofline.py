"""The roofline estimator (realformer_jax/aot/roofline.py) on hand-written HLO programs whose
bytes, FLOPs and trip counts are known. Pure text: no compiler, plugin or device needed."""
# ruff: noqa: E501  (HLO instructions are one line each, as XLA prints them)

import math

import pytest

from realformer_jax.aot import categories, hlo_text, roofline, targets

H100 = targets.parse('h100:8')
CHIP = H100.chip
BF16_RATE = CHIP.roofline_matmul_flops['bf16']
HBM_RATE = CHIP.roofline_hbm_bytes_per_s
LAUNCH = CHIP.launch_overhead_s

GEMM_4096 = """HloModule gemm, entry_computation_layout={(bf16[4096,4096]{1,0}, bf16[4096,4096]{1,0})->bf16[4096,4096]{1,0}}

%gemm_computation (p0: bf16[4096,4096], p1: bf16[4096,4096]) -> bf16[4096,4096] {
  %p0 = bf16[4096,4096]{1,0} parameter(0)
  %p1 = bf16[4096,4096]{1,0} parameter(1)
  ROOT %dot.1 = bf16[4096,4096]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[4096,4096], b: bf16[4096,4096]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %b = bf16[4096,4096]{1,0} parameter(1)
  ROOT %gemm_fusion = bf16[4096,4096]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_computation, metadata={op_name="jit(f)/dot_general"}, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
}
"""


def test_a_4096_cubed_bf16_matmul_is_its_flops_over_the_matmul_rate():
  est = roofline.estimate(GEMM_4096, H100)
  (kernel,) = est.kernels
  flops = 2 * 4096**3
  assert kernel.matmul_flops == flops
  assert kernel.bytes == 3 * 4096 * 4096 * 2  # two operands read, one result written
  assert kernel.bound == 'matmul' and kernel.category == categories.GEMM
  assert kernel.seconds == pytest.approx(flops / BF16_RATE + LAUNCH)
  # 805 TFLOP/s: the bf16 rate measured through jax on an H100 (issue 11).
  assert BF16_RATE == pytest.approx(805e12)
  assert est.seconds == pytest.approx(kernel.seconds) and est.launches == 1
  assert est.non_gemm_bytes == 0 and not est.warnings


def _loop_program(trip_count_config: str, bound: int = 12) -> str:
  """A loop whose body adds into slice i of a stacked f32[12,256,1024] buffer and reads slice
  i of another; the condition is `i < bound`."""
  return f"""HloModule loop

%read_slice (p0: f32[12,256,1024], p1: s32[]) -> f32[256,1024] {{
  %p0 = f32[12,256,1024]{{2,1,0}} parameter(0)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = f32[1,256,1024]{{2,1,0}} dynamic-slice(%p0, %p1, %zero, %zero), dynamic_slice_sizes={{1,256,1024}}
  %bc = f32[256,1024]{{1,0}} bitcast(%ds)
  ROOT %e = f32[256,1024]{{1,0}} exponential(%bc)
}}

%write_slice (q0: f32[12,256,1024], q1: f32[256,1024], q2: s32[]) -> f32[12,256,1024] {{
  %q0 = f32[12,256,1024]{{2,1,0}} parameter(0)
  %q1 = f32[256,1024]{{1,0}} parameter(1)
  %q2 = s32[] parameter(2)
  %zero = s32[] constant(0)
  %up = f32[1,256,1024]{{2,1,0}} bitcast(%q1)
  ROOT %dus = f32[12,256,1024]{{2,1,0}} dynamic-update-slice(%q0, %up, %q2, %zero, %zero)
}}

%body (state: (s32[], f32[12,256,1024], f32[12,256,1024])) -> (s32[], f32[12,256,1024], f32[12,256,1024]) {{
  %state = (s32[], f32[12,256,1024]{{2,1,0}}, f32[12,256,1024]{{2,1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %src = f32[12,256,1024]{{2,1,0}} get-tuple-element(%state), index=1
  %dst = f32[12,256,1024]{{2,1,0}} get-tuple-element(%state), index=2
  %x = f32[256,1024]{{1,0}} fusion(%src, %i), kind=kLoop, calls=%read_slice
  %stacked = f32[12,256,1024]{{2,1,0}} fusion(%dst, %x, %i), kind=kLoop, calls=%write_slice
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %out = (s32[], f32[12,256,1024]{{2,1,0}}, f32[12,256,1024]{{2,1,0}}) tuple(%next, %src, %stacked)
}}

%cond (c: (s32[], f32[12,256,1024], f32[12,256,1024])) -> pred[] {{
  %c = (s32[], f32[12,256,1024]{{2,1,0}}, f32[12,256,1024]{{2,1,0}}) parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %limit = s32[] constant({bound})
  ROOT %lt = pred[] compare(%ci, %limit), direction=LT
}}

ENTRY %main (src: f32[12,256,1024], dst: f32[12,256,1024]) -> f32[12,256,1024] {{
  %src = f32[12,256,1024]{{2,1,0}} parameter(0)
  %dst = f32[12,256,1024]{{2,1,0}} parameter(1)
  %start = s32[] constant(0)
  %init = (s32[], f32[12,256,1024]{{2,1,0}}, f32[12,256,1024]{{2,1,0}}) tuple(%start, %src, %dst)
  %loop = (s32[], f32[12,256,1024]{{2,1,0}}, f32[12,256,1024]{{2,1,0}}) while(%init), condition=%cond, body=%body{trip_count_config}
  ROOT %result = f32[12,256,1024]{{2,1,0}} get-tuple-element(%loop), index=2
}}
"""


SLICE = 256 * 1024 * 4  # one f32[256,1024] layer slice


def test_a_loop_of_12_trips_counts_its_body_12_times_and_a_stacked_buffer_as_one_slice():
  est = roofline.estimate(_loop_program(', backend_config={"known_trip_count":{"n":"12"}}'), H100)
  kernels = {k.name: k for k in est.kernels}
  read, write = kernels['x'], kernels['stacked']
  assert read.count == write.count == kernels['next'].count == 12
  assert kernels['lt'].count == 13  # the condition runs once more than the body
  # Reads one slice of the stacked input (and the 4-byte index), writes one slice.
  assert read.bytes == SLICE + 4 + SLICE
  # Writes its update in place: reads the update and the index, writes one slice.
  assert write.bytes == SLICE + 4 + SLICE
  assert write.category == categories.COPIES
  elements = 256 * 1024
  assert read.seconds == pytest.approx(
    max(read.bytes / HBM_RATE, elements / CHIP.transcendentals) + LAUNCH
  )
  assert est.compute_seconds == pytest.approx(sum(k.seconds * k.count for k in est.kernels))
  assert not est.warnings


def test_a_counted_loop_without_a_stated_trip_count_is_read_from_its_condition():
  est = roofline.estimate(_loop_program('', bound=7), H100)  # as XLA:TPU prints loops
  assert {k.name: k.count for k in est.kernels}['x'] == 7
  assert not est.warnings


def test_a_loop_of_unknown_trips_is_counted_once_with_a_warning():
  program = (
    _loop_program('')
    .replace('constant(0)\n  %init', 'parameter(2)\n  %init')
    .replace(
      'ENTRY %main (src: f32[12,256,1024], dst: f32[12,256,1024])',
      'ENTRY %main (src: f32[12,256,1024], dst: f32[12,256,1024], n: s32[])',
    )
    .replace('direction=LT', 'direction=NE')
  )
  est = roofline.estimate(program, H100)
  assert {k.name: k.count for k in est.kernels}['x'] == 1
  assert any('without a known trip count' in w for w in est.warnings)


SCATTER = """HloModule scatter

%add (x: bf16[], y: bf16[]) -> bf16[] {
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  ROOT %s = bf16[] add(%x, %y)
}

ENTRY %main (table: bf16[TABLE,768], ids: s32[ROWS,1], updates: bf16[ROWS,768]) -> bf16[TABLE,768] {
  %table = bf16[TABLE,768]{1,0} parameter(0)
  %ids = s32[ROWS,1]{1,0} parameter(1)
  %updates = bf16[ROWS,768]{1,0} parameter(2)
  ROOT %scatter-add = bf16[TABLE,768]{1,0} scatter(%table, %ids, %updates), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}
"""


def test_an_atomic_scatter_of_many_rows_into_a_tiny_table_is_a_warning_not_a_silent_cost():
  # Issue 11: the token-type gradient, 16,384 rows into a 2-row table, took 50 ms on an H100.
  est = roofline.estimate(SCATTER.replace('TABLE', '2').replace('ROWS', '16384'), H100)
  (kernel,) = est.kernels
  assert kernel.category == categories.SCATTER
  assert kernel.warning and '16,384 rows into a 2-row table' in kernel.warning
  assert est.warnings == (kernel.warning,)
  # A sparse update of a big table is an ordinary kernel.
  est = roofline.estimate(SCATTER.replace('TABLE', '30522').replace('ROWS', '16384'), H100)
  assert not est.warnings


def _custom_call(target: str, config: str = '{}') -> str:
  return f"""HloModule custom

ENTRY %main (q: bf16[2,512,12,64]) -> bf16[2,512,12,64] {{
  %q = bf16[2,512,12,64]{{3,2,1,0}} parameter(0)
  ROOT %call = bf16[2,512,12,64]{{3,2,1,0}} custom-call(%q, %q, %q), custom_call_target="{target}", backend_config={config}
}}
"""


def test_host_callbacks_and_custom_kernels_without_flops_are_listed_as_warnings():
  est = roofline.estimate(_custom_call('xla_ffi_python_gpu_callback'), H100)
  assert any('host callback' in w for w in est.warnings)
  pallas = _custom_call('__gpu$xla.gpu.triton', '"name = \\"mha_forward\\""')
  est = roofline.estimate(pallas, H100)
  assert len(est.warnings) == 1 and 'mha_forward' in est.warnings[0]
  assert est.kernels[0].category == categories.ATTENTION
  # With the kernel's FLOPs supplied the warning goes and the FLOPs count.
  flops = 4 * 2 * 12 * 512 * 512 * 64
  est = roofline.estimate(pallas, H100, custom_call_flops=lambda ins: flops)
  assert not est.warnings and est.matmul_flops == flops


def test_a_kernel_fed_16_bit_and_float32_operands_states_16_bit_matmuls():
  # The qk kernels read a float32 stack of bf16 values and v in bf16: their stated FLOPs run at
  # the bf16 rate, not tf32's half of it.
  flops = 4.0e12
  config = '{"ir": "serialized_metadata = "{\\22flops\\22: \\22%d\\22}""}' % flops
  hlo = f"""HloModule custom

ENTRY %main (s: f32[2,12,1,4096,12,64], v: bf16[1,4096,12,64]) -> bf16[1,4096,12,64] {{
  %s = f32[2,12,1,4096,12,64]{{5,4,3,2,1,0}} parameter(0)
  %v = bf16[1,4096,12,64]{{3,2,1,0}} parameter(1)
  ROOT %call = bf16[1,4096,12,64]{{3,2,1,0}} custom-call(%s, %v), custom_call_target="__gpu$xla.gpu.triton", backend_config={config}
}}
"""
  (kernel,) = roofline.estimate(hlo, H100).kernels
  assert kernel.matmul_flops == flops and kernel.bound == 'matmul'
  # A fused kernel that states its cost runs at the chip's fused-kernel efficiency.
  efficiency = H100.chip.fused_kernel_efficiency
  assert kernel.seconds == pytest.approx(flops / BF16_RATE / efficiency + LAUNCH)


def test_cudnn_flash_attention_counts_both_matmuls_forward_and_five_backward():
  config = (
    '{"cudnn_fmha_backend_config": {"intermediate_tensor_shape": {"element_type": '
    '"BF16", "dimensions": ["2", "12", "512", "512"]}}}'
  )
  forward = roofline.estimate(_custom_call('__cudnn$fmhaSoftmax', config), H100)
  backward = roofline.estimate(_custom_call('__cudnn$fmhaSoftmaxBackward', config), H100)
  per_matmul = 2 * 2 * 12 * 512 * 512 * 64
  assert forward.matmul_flops == 2 * per_matmul and backward.matmul_flops == 5 * per_matmul
  assert not forward.warnings


ALL_REDUCE = """HloModule collective

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (g: f32[1024,1024]) -> f32[1024,1024] {
  %g = f32[1024,1024]{1,0} parameter(0)
  ROOT %ar = f32[1024,1024]{1,0} all-reduce(%g), channel_id=1, replica_groups=GROUPS, to_apply=%sum
}
"""


@pytest.mark.parametrize(
  'groups, n',
  [
    ('{{0,1,2,3},{4,5,6,7}}', 4),
    ('[1,8]<=[8]', 8),
    ("mesh['data'=2,'fsdp'=4] {'fsdp'}", 4),
    ('{}', 8),
  ],
)
def test_a_ring_all_reduce_sends_2_n_minus_1_over_n_of_its_bytes(groups, n):
  est = roofline.estimate(ALL_REDUCE.replace('GROUPS', groups), H100)
  (kernel,) = est.kernels
  sent = 2 * (n - 1) / n * 1024 * 1024 * 4
  assert kernel.category == categories.COLLECTIVES
  assert kernel.seconds == pytest.approx(sent / CHIP.interconnect_bytes_per_s + LAUNCH)
  assert est.compute_seconds == 0 and est.collective_seconds == pytest.approx(kernel.seconds)
  assert est.overlapped_seconds == pytest.approx(kernel.seconds)


HASH = """HloModule hash

%bits () -> pred[4096,4096] {
  %p0 = u32[4096,4096]{1,0} iota(), iota_dimension=1
  %k = u32[] constant(13)
  %kb = u32[4096,4096]{1,0} broadcast(%k), dimensions={}
  %x1 = u32[4096,4096]{1,0} xor(%p0, %kb)
  %s1 = u32[4096,4096]{1,0} shift-right-logical(%x1, %kb)
  %s2 = u32[4096,4096]{1,0} shift-left(%x1, %kb)
  %o1 = u32[4096,4096]{1,0} or(%s1, %s2)
  %a1 = u32[4096,4096]{1,0} add(%o1, %x1)
  %x2 = u32[4096,4096]{1,0} xor(%a1, %o1)
  %s3 = u32[4096,4096]{1,0} shift-right-logical(%x2, %kb)
  %s4 = u32[4096,4096]{1,0} shift-left(%x2, %kb)
  %o2 = u32[4096,4096]{1,0} or(%s3, %s4)
  %a2 = u32[4096,4096]{1,0} add(%o2, %x2)
  %x3 = u32[4096,4096]{1,0} xor(%a2, %o2)
  %s5 = u32[4096,4096]{1,0} shift-right-logical(%x3, %kb)
  %s6 = u32[4096,4096]{1,0} shift-left(%x3, %kb)
  %o3 = u32[4096,4096]{1,0} or(%s5, %s6)
  %a3 = u32[4096,4096]{1,0} add(%o3, %x3)
  ROOT %keep = pred[4096,4096]{1,0} compare(%a3, %kb), direction=GT
}

ENTRY %main () -> pred[4096,4096] {
  ROOT %mask = pred[4096,4096]{1,0} fusion(), kind=kLoop, calls=%bits
}
"""


def test_an_integer_hash_is_judged_by_the_vector_units_not_only_its_bytes():
  # A dropout mask from a hash of each element's position: 1 byte written per element.
  (kernel,) = roofline.estimate(HASH, H100).kernels
  elements = 4096 * 4096
  int_ops = 16 * elements  # 15 xor / shift / or / add instructions and the compare
  assert kernel.bytes == elements
  assert kernel.category == categories.DROPOUT_BITS and kernel.bound == 'vector'
  assert kernel.seconds == pytest.approx(int_ops / CHIP.vector_int_ops + LAUNCH)
  assert kernel.seconds > 3 * kernel.bytes / HBM_RATE


def test_categories_follow_the_documented_order():
  facts = lambda **kw: categories.KernelFacts(
    **{
      'opcodes': frozenset(),
      'custom_call_target': None,
      'matmul_flops': 0.0,
      'is_collective': False,
      'arrays': (),
      'source_files': frozenset(),
      **kw,
    }
  )
  score = hlo_text.Array('f32', (8, 12, 512, 512))
  assert categories.categorize(facts(matmul_flops=1.0, arrays=(score,)), (512, 512)) == 'GEMM'
  assert (
    categories.categorize(facts(opcodes=frozenset({'exponential'}), arrays=(score,)), (512, 512))
    == categories.SCORES
  )
  assert (
    categories.categorize(
      facts(opcodes=frozenset({'dynamic-update-slice'}), arrays=(score,)), (512, 512)
    )
    == categories.COPIES
  )
  assert (
    categories.categorize(
      facts(
        opcodes=frozenset({'multiply', 'sqrt'}),
        source_files=frozenset({'/x/optax/_src/transform.py'}),
      ),
      None,
    )
    == categories.OPTIMIZER
  )
  assert categories.categorize(facts(opcodes=frozenset({'add'})), None) == categories.ELEMENTWISE


def test_estimate_tables_add_up_and_the_csv_has_one_row_per_kernel():
  est = roofline.estimate(
    _loop_program(', backend_config={"known_trip_count":{"n":"12"}}'), H100, score_dims=(256, 1024)
  )
  assert math.isclose(sum(est.by_category().values()), est.seconds)
  rows = est.csv().strip().splitlines()
  assert rows[0].startswith('kernel,computation,opcode') and len(rows) == 1 + len(est.kernels)
  assert est.top(1)[0].total_seconds == max(k.total_seconds for k in est.kernels)


def test_shapes_parse_with_tpu_tiled_layouts_and_tuples():
  arrays = hlo_text.parse_shape(
    '(bf16[12,4096,1024]{2,1,0:T(8,128)(2,1)S(1)}, s32[]{:T(128)}, /*index=2*/pred[3])'
  )
  assert [str(a) for a in arrays] == ['bf16[12,4096,1024]', 's32[]', 'pred[3]']
  assert arrays[0].bytes == 12 * 4096 * 1024 * 2 and arrays[1].bytes == 4

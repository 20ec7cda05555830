"""aot/sass.py reads `cuobjdump -sass` text: functions, loops by control flow, instructions per
score element by class; the estimate moves with what the SASS issues; the instruction term's
calibration (benchmarks/sass_calibration.py) is recomputed from the committed data."""

import dataclasses

import pytest

from benchmarks import qk_calibration, sass_calibration
from realformer_jax.aot import ptx, roofline, sass, targets
from tests.aot import test_aot_kernel_costs
from tests.repo_paths import REPO

# A kernel laid out as ptxas lays out a flash-attention loop (cuobjdump -sass format, encodings
# dropped): an element loop of 36 exps per trip (32 elements + 4 per-row rescalings) holding a
# nested loop (the qk kernels' layer loop) of one MMA and a scale / add, then EXIT and a
# subroutine only CALL reaches.
SASS_TEXT = """
	code for sm_90a
		Function : toy_attention
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   MOV R2, RZ ;
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0040*/                   FMUL R3, R3, R4 ;
        /*0050*/                   FADD R5, R5, R3 ;
        /*0060*/                   ISETP.GE.AND P1, PT, R2, 0x4, PT ;
        /*0070*/               @!P1 BRA 0x30 ;
        /*0080*/                   LDS R6, [R0] ;
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00a0*/                   MUFU.EX2 R7, R7 ;
        /*00b0*/                   LOP3.LUT R8, R8, R9, RZ, 0x3c, !PT ;
        /*00c0*/                   FFMA R10, R10, R11, R12 ;
        /*00d0*/                   IADD3 R2, R2, 0x1, RZ ;
        /*00e0*/                   ISETP.GE.AND P0, PT, R2, 0x10, PT ;
        /*00f0*/                @P0 BRA 0x110 ;
        /*0100*/                   BRA 0x30 ;
        /*0110*/                   CALL.REL.NOINC 0x140 ;
        /*0120*/                   STG.E [R12.64], R10 ;
        /*0130*/                   EXIT ;
        /*0140*/                   MUFU.RCP R13, R13 ;
        /*0150*/                   RET.REL.NODEC R20 0x0 ;
        /*0160*/                   BRA 0x160;
"""


def _toy(exps=36, alu=0):
  """SASS_TEXT with `exps` exponentials and `alu` more integer ops in the element loop."""
  extra = ['        /*00a0*/                   MUFU.EX2 R7, R7 ;'] * (exps - 1)
  extra += ['        /*00b0*/                   LOP3.LUT R8, R8, R9, RZ, 0x3c, !PT ;'] * alu
  lines = SASS_TEXT.splitlines()
  at = next(i for i, line in enumerate(lines) if 'MUFU.EX2' in line)
  return '\n'.join(lines[: at + 1] + extra + lines[at + 1 :])


def _cost(text):
  ((name, code),) = sass.functions(text).items()
  return sass.kernel_cost(name, code)


def test_sass_loops_and_per_element_counts():
  code = sass.functions(SASS_TEXT)['toy_attention']
  assert len(code) == 23 and code[7].opcode == 'BRA' and code[7].guarded
  loops = {int(loop.header, 16): loop for loop in sass.loops(code)}
  assert set(loops) == {0x30}  # one header: the element loop and the nested loop share it
  cost = _cost(_toy())
  (element,) = [loop for loop in cost.loops if loop.exps]
  assert (element.exps, element.elements) == (36, 32)  # 4 per-row rescalings are not elements
  assert cost.element_loops == 1
  total = sum(cost.instructions_per_element(0.0).values())
  assert total == pytest.approx(element.instructions / 32)
  assert sass.instruction_class('HGMMA.64x64x16.F32.BF16') == 'mma'
  assert sass.instruction_class('MUFU.EX2') == 'mufu'
  assert sass.instruction_class('LDSM.16.M88.4') == 'shared'


NESTED = """
	code for sm_90a
		Function : toy_qk
        /*0000*/                   MOV R2, RZ ;
        /*0010*/                   MUFU.EX2 R7, R7 ;
        /*0020*/                   FFMA R10, R10, R11, R12 ;
        /*0030*/                   MOV R3, RZ ;
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0050*/                   FMUL R3, R3, R4 ;
        /*0060*/                   FADD R5, R5, R3 ;
        /*0070*/                   ISETP.GE.AND P1, PT, R3, 0x4, PT ;
        /*0080*/               @!P1 BRA 0x40 ;
        /*0090*/                   ISETP.GE.AND P0, PT, R2, 0x10, PT ;
        /*00a0*/               @!P0 BRA 0x10 ;
        /*00b0*/                   EXIT ;
"""


def test_nested_loop_trips_follow_the_stated_flops():
  # The qk kernels' layer loop inside the key loop: its trips per element are what the FLOPs
  # the kernel states per element need of its MMAs (one m64n64k16 = 1,024 FLOPs a thread).
  cost = _cost(NESTED)
  assert cost.element_loops == 1
  assert cost.nested_mma_flops_per_element == 64 * 16 and cost.mma_flops_per_element == 0
  assert sum(cost.nested_per_element.values()) == 5  # HGMMA, FMUL, FADD, ISETP, BRA
  elements = 1e6
  one = cost.issued({'transcendentals': elements, 'matmul_flops': {'bf16': 1024 * elements}})
  six = cost.issued({'transcendentals': elements, 'matmul_flops': {'bf16': 6 * 1024 * elements}})
  assert six - one == pytest.approx(5 * 5 * elements)  # five more layer trips per element


def test_a_loop_exponentiating_three_times_an_element_is_counted_by_its_stated_tile():
  # realformer_attention_bwd's shape: a 64 x 64 tile over 128 threads (32 elements a thread a
  # trip) whose p is formed in three layouts, 96 MUFU.EX2 a trip. By the exponentials alone
  # (the power-of-two rule) it would be 64 elements a trip: half the instructions per element.
  unstated = sass.kernel_cost('toy_attention', sass.functions(_toy(96))['toy_attention'], 128)
  ((loop,),) = [[loop for loop in unstated.loops if loop.exps]]
  assert (unstated.threads, loop.exps, loop.elements) == (128, 96, 64)
  cost = unstated.with_tile(64 * 64)
  ((loop,),) = [[loop for loop in cost.loops if loop.exps]]
  assert (loop.elements, loop.exps_per_element) == (32, 3)
  assert cost.total_per_element == pytest.approx(loop.instructions / 32)
  assert cost.total_per_element == pytest.approx(2 * unstated.total_per_element)
  # one exponential an element with 4 rescalings: the tile and the rule agree
  single = sass.kernel_cost('toy_attention', sass.functions(_toy(36))['toy_attention'], 128)
  assert single.with_tile(64 * 64).per_element == single.per_element
  # a record keeps the derived elements: the calibration re-times it as counted
  back = sass.KernelCost.from_record('toy_attention', cost.record())
  assert back.per_element == pytest.approx(cost.per_element, abs=1e-3)
  assert [loop.elements for loop in back.loops] == [loop.elements for loop in cost.loops]
  # a stated tile no loop exponentiates that often (128 a thread, 96 MUFU.EX2) is refused
  with pytest.raises(ValueError, match='error: toy_attention states 16384 score elements'):
    unstated.with_tile(128 * 128)
  assert unstated.with_tile(0) is unstated  # unstated: the rule stands


def test_the_stated_tile_reaches_the_estimate_through_the_kernel_metadata():
  # A Pallas Triton call stating tile_elements: kernel_work divides the SASS by it.
  cost = sass.kernel_cost('k', sass.functions(_toy(96))['toy_attention'], 128)
  elements = 1e9
  stated = test_aot_kernel_costs._stated(flops=1e12, transcendentals=elements, l2_bytes=1e9)
  issued = {}
  for tile in (0, 4096):
    metadata = stated + (f', \\22tile_elements\\22: \\22{tile}\\22' if tile else '')
    hlo = test_aot_kernel_costs._triton_call(metadata)
    (kernel,) = roofline.estimate(hlo, targets.parse('h200:1'), kernel_sass={'k': cost}).kernels
    issued[tile] = kernel.work['issued']
  assert issued[4096] == pytest.approx(cost.with_tile(4096).total_per_element * elements)
  assert issued[4096] == pytest.approx(2 * issued[0])


def test_threads_come_from_the_ptx_entry():
  text = (
    '.visible .entry k(\n\t.param .u64 .ptr .align 16 k_param_0\n)\n.reqntid 128, 1, 1\n{\n'
    '\tret;\n}\n.visible .entry plain(\n)\n{\n\tret;\n}\n'
  )
  assert ptx.threads(text) == {'k': 128}


def _fused_work(issued):
  work = {
    'bytes': 1e6, 'l2_bytes': 1e9, 'atomics': 0.0, 'float_ops': 1e11, 'int_ops': 1e11,
    'transcendentals': 1e10, 'link_bytes': 0.0, 'programs': 4096.0,
    'matmul_flops': {'bf16': 1e12}, 'collective': False, 'fused': True,
  }  # fmt: skip
  if issued:
    work['issued'] = issued
  return work


def test_estimate_moves_with_what_the_sass_issues():
  # Post-LN's backward: masks drawn in both loops (more hashing) vs stored; an ex2 softmax
  # (fewer instructions per exp); the FLOP / L2 model sees none of them.
  chip = targets.parse('h200:1').chip
  stored, drawn, ex2 = _cost(_toy(32)), _cost(_toy(32, alu=1200)), _cost(_toy(32))
  ex2 = dataclasses.replace(ex2, per_element={**ex2.per_element, 'fp32': 0.0})
  seconds = {}
  for name, cost in {'stored': stored, 'drawn': drawn, 'ex2': ex2}.items():
    work = _fused_work(None)
    work['issued'] = cost.issued(work)
    seconds[name], bound = roofline.kernel_seconds(work, chip)
    assert bound == 'matmul+issue'
  assert drawn.total_per_element > stored.total_per_element > ex2.total_per_element
  assert seconds['drawn'] > seconds['stored'] > seconds['ex2']
  # without SASS the old terms stand, and do not tell the variants apart
  assert roofline.kernel_seconds(_fused_work(None), chip)[1] == 'matmul+vector'


# The calibration's kernels stated no tile when they were measured: each element loop's elements
# a thread a trip by their commits' tiles and warps (deviceless: an H100's row; BERT-Base,
# head size 64), against which the power-of-two rule that read their records is checked.
MEASURED_SHARES = {
  # 1a0cee4: plain forward 128 x 64, 4 warps; backward 64 x 64, 4; qk 128 x 64 and dS 64 x 64, 8
  ('1a0cee4', 'flash_attention_fwd'): 128 * 64 // 128,
  ('1a0cee4', 'flash_attention_bwd'): 64 * 64 // 128,
  ('1a0cee4', 'realformer_qk_attention_fwd'): 128 * 64 // 256,
  ('1a0cee4', 'realformer_qk_attention_ds'): 64 * 64 // 256,
  # e64cd4c: plain and qk forward 128 x 128, 8 warps; backward 64 x 64, 4; dS 64 x 64, 8
  ('e64cd4c', 'flash_attention_fwd'): 128 * 128 // 256,
  ('e64cd4c', 'flash_attention_bwd'): 64 * 64 // 128,
  ('e64cd4c', 'realformer_qk_attention_fwd'): 128 * 128 // 256,
  ('e64cd4c', 'realformer_qk_attention_ds'): 64 * 64 // 256,
}


def test_the_calibration_records_count_one_exponential_an_element():
  # Every fitted row's loops take one MUFU.EX2 an element (the rest per-row rescalings), so the
  # rule its records were read by gives the tile's elements and the table stands as fitted;
  # the RealFormer backward (three an element) has no per-kernel time and is not in it.
  records = sass_calibration.json.loads(sass_calibration.SASS_RECORDS.read_text())
  checked = set()
  for program, kernels in records.items():
    for name, record in kernels.items():
      for loop in sass.KernelCost.from_record(name, record).loops:
        if loop.exps:
          share = MEASURED_SHARES[(program[:7], name)]
          assert loop.elements == share and share <= loop.exps < 2 * share, (program, name)
          checked.add((program[:7], name))
  assert checked == set(MEASURED_SHARES)


def test_sass_calibration_recomputed_from_committed_data():
  records = sass_calibration.json.loads(sass_calibration.SASS_RECORDS.read_text())
  chip = targets.parse(qk_calibration.TARGET).chip
  result = sass_calibration.calibrate(qk_calibration.load_inputs(), records, chip)
  assert result['issue_efficiency'] == targets.ISSUE_EFFICIENCY
  for row in result['rows']:
    assert abs(row['loo'] / row['measured'] - 1) < 0.25, row['key']
  # Post-LN's backward issues the same per element at both commits (the 53.6 of FACTS.md)
  backward = [r['per_element'] for r in result['rows'] if r['key'][3] == 'flash_attention_bwd']
  assert backward == [pytest.approx(53.7, abs=0.2)] * 2
  performance = open(f'{REPO}/docs/performance.md').read()
  assert sass_calibration.render(result) in performance

"""model.remat_dropout_masks='auto': a rematerialised layer's attention dropout mask stored,
drawn by a pass per layer, or drawn in the backward's loops, the cheapest that fits the device.

Plain attention (Post-LN / Pre-LN) on the Triton kernels with every layer rematerialised:
'stored'     the forward writes its mask (one bit per score element) and the remat policy keeps
             every layer's until the backward reads it: no hash in the backward, the masks of
             all layers resident at once (BERT-Base, L = 65,536: 12 x [12, L, L] bits = 72 GiB);
'per_layer'  the forward stores none; before each layer's backward a pass (`draw_mask`) draws
             that layer's whole mask and the backward reads it: the hash once more, one layer's
             bits in memory at a time (6 GiB there);
'drawn'      no mask in memory: the backward kernel hashes it again in both of its loops.
Each is costed per score element of a layer, forward + backward, from the kernels' SASS for
sm_90a (deviceless, docs/performance.md: instructions per element of each tile loop, ex2
softmax) and the mask's HBM bytes, and 'auto' takes the cheapest whose memory fits
FIT_SHARE of the device beside the program's own peak (`program_bytes`). No fixed share of the
memory decides: at L = 65,536 BERT-Base stores on an H200 (~105 GiB usable: 72 + ~12 GiB) and
takes the per-layer pass on an H100 (~59 GiB usable), cheaper than drawing in both loops.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from realformer_jax.config import ModelConfig

# Share of the device's usable memory the program and the stored masks may fill together: the
# rest is the allocator's slack (an H200 program at 97 % of its limit compiled and then ran out
# of memory, 2026-11-26).
FIT_SHARE = 0.9

# SASS instructions per score element (per thread, each tile loop's body over the elements a
# thread owns), sm_90a, deviceless compile (ex2 softmax, log2 e folded), BERT-Base head size:
# the Post-LN forward storing its mask (43.8) / not (30.7), the backward reading it (37.9) /
# drawing it in both loops (75.3), the per-layer pass `attention_dropout_mask` (22.4; 128 x 128
# tiles, 4 warps). docs/performance.md, "Issue 64".
INSTRUCTIONS = {'stored': 43.8 + 37.9, 'per_layer': 30.7 + 22.4 + 37.9, 'drawn': 30.7 + 75.3}
# HBM bytes per score element: the mask written once (1/8) and read by the backward's two loops
# (a column strip and a row strip: 2/8); drawn: none.
HBM_BYTES = {'stored': 3 / 8, 'per_layer': 3 / 8, 'drawn': 0.0}
# One HBM byte in CUDA-core instruction issue: a Hopper SXM issues 132 SMs x 128 lanes x 1.98
# GHz = 3.3e13 thread instructions/s against 3.35 TB/s (H100; 4.8 TB/s on an H200: 7), the
# datasheet figures of realformer_jax/aot/targets.py. The cheaper of the larger.
INSTRUCTIONS_PER_HBM_BYTE = 10.0
ISSUE_RATE = 132 * 128 * 1.98e9  # thread instructions/s of that Hopper, for the log line

# The program's peak without the masks (`program_bytes`): float32 parameters, gradients and two
# Adam moments (16 bytes a parameter), and per token each rematerialised layer's kept input and
# attention output in the compute dtype, plus WORKING_SET times one layer's float32 [3 D + 2 F]
# row of live activations while it is recomputed. WORKING_SET is fitted to the one peak measured
# without masks at this size: BERT-Base Post-LN, L = 65,536, bf16, full remat, 12.3 GiB on an
# H200 (2026-11-26); at L = 32,768 it predicts 7.0 GiB against the 5.7 GiB measured there
# (2026-11-27): it errs high, which only stores less often.
STATE_BYTES_PER_PARAMETER = 16
WORKING_SET = 3.7


class MaskChoice(NamedTuple):
  masks: str  # 'stored' | 'per_layer' | 'drawn'
  reason: str  # for the log line


def masks_matter(config: ModelConfig) -> bool:
  """Whether remat_dropout_masks changes anything: plain attention (the carried-sum kernels
  always store their mask), every layer rematerialised, attention dropout on."""
  return (
    config.remat_policy != 'none'
    and config.attention_dropout_rate > 0
    and not config.use_residual_attention
  )


def dropout_masks_bytes(config: ModelConfig, seq_len: int) -> int:
  """Bytes of every layer's kept dropout mask for one sequence: one bit per score element."""
  return config.num_layers * config.num_heads * seq_len * seq_len // 8


def program_bytes(config: ModelConfig, seq_len: int) -> int:
  """The estimated peak of one sequence's train step without stored masks (constants above)."""
  d, f, layers = config.hidden_size, config.mlp_dim, config.num_layers
  parameters = (config.vocab_size + config.max_len + config.type_vocab_size) * d + layers * (
    4 * d * d + 2 * d * f
  )
  itemsize = 2 if config.dtype in ('bfloat16', 'float16') else 4
  per_token = layers * 2 * d * itemsize + WORKING_SET * 4 * (3 * d + 2 * f)
  return int(STATE_BYTES_PER_PARAMETER * parameters + seq_len * per_token)


def cost(masks: str) -> float:
  """A mask's estimated cost per score element of a layer, in instruction issues."""
  return INSTRUCTIONS[masks] + INSTRUCTIONS_PER_HBM_BYTE * HBM_BYTES[masks]


def choose_masks(config: ModelConfig, seq_len: int, memory_bytes: Optional[int]) -> MaskChoice:
  """'stored', 'per_layer' or 'drawn' for config.remat_dropout_masks (an explicit choice is
  kept): the cheapest by `cost` whose memory, with `program_bytes`, fits FIT_SHARE of
  `memory_bytes` (the device's usable memory); drawn where the device reports no limit."""
  if config.remat_dropout_masks != 'auto':
    return MaskChoice(config.remat_dropout_masks, 'set in the config')
  if memory_bytes is None:
    return MaskChoice('drawn', 'the device reports no memory limit')
  elements = config.num_layers * config.num_heads * seq_len * seq_len
  program = program_bytes(config, seq_len)
  every_layer = dropout_masks_bytes(config, seq_len)
  needs = {'stored': every_layer, 'per_layer': every_layer // config.num_layers, 'drawn': 0}
  fitting = [m for m in needs if program + needs[m] <= FIT_SHARE * memory_bytes]
  masks = min(fitting or ['drawn'], key=cost)
  costs = ', '.join(
    f'{m} ~{cost(m) * elements / ISSUE_RATE:.2f} s'
    + ('' if m in fitting else f' (needs {_gib(program + needs[m])}: does not fit)')
    for m in sorted(needs, key=cost)
  )
  return MaskChoice(
    masks,
    f"every layer's mask for one sequence: {config.num_layers} x [{config.num_heads}, "
    f'{seq_len}, {seq_len}] bits = {_gib(every_layer)}; the program ~{_gib(program)}; '
    f"{FIT_SHARE:.0%} of {_gib(memory_bytes)} usable. The attention kernels' CUDA-core work a "
    f'step, estimated from their SASS (kernels/dropout/remat_masks.py): {costs}',
  )


def _gib(n: float) -> str:
  return f'{n / 2**30:.1f} GiB'

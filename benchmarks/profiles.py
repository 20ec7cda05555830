"""What each benchmark profile measures: shapes, rounds, dtypes, and the targets it is judged
against (printed as PASS / MISS, never asserted)."""

from __future__ import annotations

import dataclasses
from typing import Union

from realformer_jax.bench import steps

LAYOUTS = ('post', 'realformer', 'pre')

SMALL = steps.Shape('small', hidden=256, layers=4, heads=4, vocab=8192, seq_len=128, batch=16)
BASE = steps.Shape('bert_base', hidden=768, layers=12, heads=12, vocab=30522, seq_len=128, batch=8)
TINY = steps.Shape(
  'tiny', hidden=32, layers=2, heads=2, vocab=128, seq_len=16, batch=2, predictions=3
)
# The accelerator shapes: BERT-Base and -Large at 32 x 512 (80 predictions), Base at 128 x 128.
BASE_512 = dataclasses.replace(BASE, name='bert_base_512', seq_len=512, batch=32, predictions=80)
LARGE_512 = dataclasses.replace(BASE_512, name='bert_large_512', hidden=1024, layers=24, heads=16)
BASE_128 = dataclasses.replace(BASE, name='bert_base_128', batch=128)


@dataclasses.dataclass(frozen=True)
class Profile:
  """How much to measure. `split_groups`: shapes whose HF comparison runs in its own group
  (post vs HF, then post vs realformer vs pre), so that at most three train states live at once
  (BERT-Base: HF's step alone peaks at ~8 GB)."""

  shapes: tuple
  split_groups: tuple  # names of shapes measured in two groups
  rounds: int
  warmup: int
  compile_shape: steps.Shape  # width of the compile-time models (layers vary)
  compile_layers: tuple
  compile_repeats: int  # scanned compiles are repeated; loop compiles run once
  memory_shape: steps.Shape
  memory_remats: tuple = ('none', 'full')
  dtype: str = 'float32'  # compute dtype of both models (parameters stay float32)
  peak_n: int = 2048  # the matmul peak: an n^3 matmul in `dtype`
  # ours: layers per scan iteration (None: fully unrolled; 'auto': model/layer_unroll.py)
  scan_unroll: Union[int, str, None] = None
  trace_steps: int = 0  # > 0: profile this many steps per candidate, device time by category
  targets: str = 'cpu'  # which TARGETS apply: 'cpu' | 'accelerator'


# Seconds: every code path at toy shapes (the tests' profile).
TINY_PROFILE = Profile(
  shapes=(TINY,),
  split_groups=(),
  rounds=2,
  warmup=1,
  compile_shape=TINY,
  compile_layers=(1, 2),
  compile_repeats=1,
  memory_shape=TINY,
)

PROFILES = {
  'full': Profile(
    shapes=(SMALL, BASE),
    split_groups=('bert_base',),
    rounds=10,
    warmup=2,
    compile_shape=SMALL,
    compile_layers=(12, 24, 48),
    compile_repeats=2,
    memory_shape=BASE,
  ),
  'quick': Profile(
    shapes=(SMALL,),
    split_groups=(),
    rounds=4,
    warmup=1,
    compile_shape=SMALL,
    compile_layers=(4, 16),
    compile_repeats=1,
    memory_shape=SMALL,
  ),
  'tiny': TINY_PROFILE,
  # One GPU / TPU chip. The layer scan as model.scan_unroll='auto' runs it (model/
  # layer_unroll.py): unrolled on a GPU (BERT-Large compiles in ~165 s vs ~30 s rolled,
  # measured on an H100: no longer than Hugging Face's, compiled beside it), rolled on a TPU;
  # --scan_unroll overrides.
  'accelerator': Profile(
    shapes=(BASE_512, LARGE_512, BASE_128),
    split_groups=(),
    rounds=10,
    warmup=2,
    compile_shape=BASE_512,
    compile_layers=(12, 24),
    compile_repeats=1,
    memory_shape=LARGE_512,
    dtype='bfloat16',
    peak_n=8192,
    scan_unroll='auto',
    trace_steps=2,
    targets='accelerator',
  ),
  # The accelerator profile's code path at toy shapes (its smoke test, on any backend).
  'accelerator_tiny': dataclasses.replace(
    TINY_PROFILE,
    memory_remats=('none',),
    dtype='bfloat16',
    peak_n=256,
    scan_unroll=1,
    trace_steps=1,
    targets='accelerator',
  ),
}

TARGETS = {
  'tokens_per_s_vs_hf': 1.3,  # ours (post) / HF, at every shape: at least
  'realformer_over_post': 1.05,  # step time, at every shape: at most
  'scan_compile_growth': 1.3,  # scanned compile time, deepest / shallowest: at most
  'mfu_bert_base': 0.75,  # model FLOPs utilisation at the BERT-Base shape: at least
}
# The accelerator profile's targets (one H100, BERT-Large 32 x 512, bf16, dropout 0.1).
ACCELERATOR_TARGETS = {
  'large_tokens_per_s_vs_hf': 1.5,  # post / HF: at least
  'large_mfu_post': 0.45,  # of the datasheet bf16 peak (aot/targets.mfu_peak_flops): at least
  'large_realformer_over_post': 1.10,  # step time: at most
  'large_pre_over_post': 1.0,  # step time: at most
}

SHAPES = {s.name: s for s in (SMALL, BASE, TINY, BASE_512, LARGE_512, BASE_128)}

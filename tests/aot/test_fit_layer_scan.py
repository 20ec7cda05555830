"""The fit line of `experiments.compile` says how the layers run (model.scan_unroll, 'auto'
resolved for the target) and how long the compile took here: its wording, on a stand-in step
(the real compile's line is checked in test_aot_compile.py, slow)."""

import types

from realformer_jax.aot import fit_report
from realformer_jax.config import ModelConfig

LARGE = ModelConfig(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096, max_len=512)


def _report(built: ModelConfig, compile_seconds: float, auto: bool = False):
  step = types.SimpleNamespace(
    resolved=types.SimpleNamespace(setup=types.SimpleNamespace(model_config=built)),
    spec=types.SimpleNamespace(model=built),
    compile_seconds=compile_seconds,
  )
  return fit_report.FitReport(step, None, 0, 'bf16', auto)


def test_the_fit_line_names_the_unrolled_scan_and_the_compile_time_on_a_gpu():
  line = _report(LARGE.replace(attention_platform='gpu'), 231.44).layer_scan()
  assert line.startswith("layer scan: scan_unroll='auto' -> 24 layer(s) per iteration, fully")
  assert 'compile ~229 s estimated on 2 CPU cores' in line
  assert line.endswith('; compiled here in 231.4 s')


def test_the_fit_line_of_a_rolled_scan_and_of_a_python_loop():
  line = _report(LARGE.replace(attention_platform='tpu'), 58.0, auto=True).layer_scan()
  assert "scan_unroll='auto' -> 1 layer(s) per iteration, rolled" in line
  assert line.endswith('compiled here in 58.0 s (every accumulation tried)')
  line = _report(LARGE.replace(scan_unroll=4), 1.0).layer_scan()
  assert 'scan_unroll=4 -> 4 layer(s) per iteration, set in the config' in line
  line = _report(LARGE.replace(scan_layers=False), 2.0).layer_scan()
  assert line == 'layers: a Python loop (model.scan_layers=False); compiled here in 2.0 s'

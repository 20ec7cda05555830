"""What `python -m experiments.compile` prints: memory fit, accumulation, model FLOPs and the
ESTIMATED step time and MFU of a config's train step on an accelerator target.

    lines = fit_report.run(config, 'h100:8', dump_dir=None)   # prints as it goes

Memory figures are XLA's buffer assignment for the target (what the compiled program needs,
exactly as a run on that machine would compile it); step time and MFU are estimates from the
kernel roofline (roofline.py), labelled as such on every line.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional

import ml_collections

from realformer_jax import flops as flops_lib
from realformer_jax.aot import roofline, targets, train_step
from realformer_jax.config import ConfigError

GiB = 2 ** 30
ESTIMATE_MODEL = ('a kernel roofline over the optimized program, realformer_jax/aot/'
                  'roofline.py: per kernel max(bytes / HBM rate, FLOPs / matmul rate, '
                  'element-wise ops / vector rate) + launch overhead, summed')


def _gib(n: float) -> str:
  return f'{n / GiB:.2f} GiB'


def run(config: ml_collections.ConfigDict, target_spec: str, dump_dir: Optional[str] = None,
        out: Callable[[str], None] = print) -> dict:
  """Compiles `config`'s train step for `target_spec` and prints the report; returns its
  figures. Raises ConfigError (one line) if the step cannot fit."""
  target = targets.parse(target_spec)
  out(f'Compiling the train step for {target.describe()} on this host (deviceless: XLA '
      'compiles for the target; nothing is run or measured)')
  step = train_step.compile_for_target(config, target, log=lambda line: out(f'  {line}'))
  spec = step.spec
  model, data, train = spec.model, spec.data, spec.train
  mesh = dict(step.resolved.setup.mesh.shape)
  accum = int(train.grad_accum_steps)
  per_device = train.global_batch_size // spec.data_parallel_size(target.num_devices)
  estimate = roofline.estimate(step.compiled, target, score_dims=(data.max_len, data.max_len))
  model_flops = flops_lib.mlm_step_flops(model, batch=train.global_batch_size,
                                         seq_len=data.max_len, predictions=data.max_predictions)
  peak_class = targets.dtype_class(_short_dtype(model.dtype), None, target.platform)
  peak = target.chip.matmul_flops[peak_class]
  mfu = model_flops / (estimate.seconds * target.num_devices * peak)
  m = step.memory

  out(f'model: {model.ln_placement}, {model.num_layers} layers x {model.hidden_size}, '
      f'{model.num_heads} heads, vocab {model.vocab_size}, {model.dtype} compute, '
      f"remat_policy='{model.remat_policy}'; global batch {train.global_batch_size} x "
      f'{data.max_len} tokens; mesh ' + ' '.join(f'{k}={v}' for k, v in mesh.items()))
  out(f'accumulation: {accum} microbatch(es) of {per_device // accum} sequence(s) per device'
      + (" (grad_accum_steps='auto', chosen for this target)" if
         str(config.train.grad_accum_steps) == 'auto' else ' (as configured)'))
  out('memory per device (XLA buffer assignment for the target):')
  out(f'  arguments    {_gib(m.arguments):>11}  (params {_gib(m.params)}, optimizer state '
      f'{_gib(m.optimizer_state)}, batch and rng {_gib(m.batch_and_rest)})')
  out(f'  outputs      {_gib(m.outputs):>11}  ({_gib(m.aliased)} of them reuse the donated '
      'state)')
  out(f'  temporaries  {_gib(m.temporaries):>11}')
  margin = step.budget_bytes - m.needed
  verdict = (f'fits, {_gib(margin)} to spare' if margin >= 0 else
             f'does NOT fit, {_gib(-margin)} short')
  out(f'  needs        {_gib(m.needed):>11}  of {_gib(step.budget_bytes)} ({step.budget_source})'
      f': {verdict}')
  out(f'model FLOPs per step: {model_flops:.4g} (realformer_jax/flops.py; '
      f'{model_flops / target.num_devices:.4g} per device)')
  out(f'ESTIMATED step time: {estimate.seconds * 1e3:.1f} ms (kernels '
      f'{estimate.compute_seconds * 1e3:.1f} ms + collectives '
      f'{estimate.collective_seconds * 1e3:.1f} ms, nothing overlapped; '
      f'{estimate.overlapped_seconds * 1e3:.1f} ms if the collectives hide behind compute), '
      f'{estimate.launches:,} kernel launches, {estimate.hbm_bytes / 1e9:.1f} GB of HBM traffic '
      'per device')
  out(f'ESTIMATED MFU: {mfu:.3f} of the {peak_class} datasheet peak '
      f'({peak / 1e12:.1f} TFLOP/s x {target.num_devices} devices)')
  out('ESTIMATED time per step by category: ' + ', '.join(
      f'{name} {seconds * 1e3:.1f} ms' for name, seconds in estimate.by_category().items()))
  out(f'  (estimates, not measurements: {ESTIMATE_MODEL})')
  if estimate.xla_flops is not None:
    optimal = (f'optimal_seconds {estimate.xla_optimal_seconds * 1e3:.2f} ms'
               if estimate.xla_optimal_seconds is not None else
               'no usable optimal_seconds (XLA returned a negative one)')
    out(f"XLA's own cost analysis, beside the roofline (it counts each loop body once, not per "
        f'trip): {optimal}, FLOPs {estimate.xla_flops:.4g}, bytes accessed '
        f'{estimate.xla_bytes_accessed or 0:.4g}')
  for warning in estimate.warnings:
    out(f'warning: {warning}')
  figures = {
      'target': target.spec, 'devices': target.num_devices, 'grad_accum_steps': accum,
      'remat_policy': model.remat_policy, 'mesh': mesh,
      'memory': {'arguments': m.arguments, 'outputs': m.outputs, 'aliased': m.aliased,
                 'temporaries': m.temporaries, 'params': m.params,
                 'optimizer_state': m.optimizer_state, 'needed': m.needed,
                 'budget': step.budget_bytes, 'fits': step.fits},
      'model_flops': model_flops,
      'estimate': {'seconds': estimate.seconds, 'compute_seconds': estimate.compute_seconds,
                   'collective_seconds': estimate.collective_seconds, 'mfu': mfu,
                   'peak': peak_class, 'launches': estimate.launches,
                   'hbm_bytes': estimate.hbm_bytes, 'non_gemm_bytes': estimate.non_gemm_bytes,
                   'by_category': estimate.by_category(),
                   'xla_optimal_seconds': estimate.xla_optimal_seconds,
                   'warnings': list(estimate.warnings)},
  }
  if dump_dir:
    _dump(dump_dir, step, estimate, figures, out)
  if not step.fits:
    raise ConfigError(
        f'the step needs {m.needed:,} bytes per device ({_gib(m.needed)}) with '
        f'train.grad_accum_steps={accum}, the target has {step.budget_bytes:,} '
        f'({step.budget_source}); try grad_accum_steps=\'auto\', FSDP (mesh.shape=(1,-1,1)) '
        'or more devices')
  return figures


def _dump(directory: str, step: train_step.TargetStep, estimate: roofline.Estimate,
          figures: dict, out: Callable[[str], None]) -> None:
  os.makedirs(directory, exist_ok=True)
  files = {'train_step.hlo.txt': step.compiled.as_text(), 'kernels.csv': estimate.csv(),
           'report.json': json.dumps(figures, indent=1, default=str) + '\n'}
  for name, text in files.items():
    with open(os.path.join(directory, name), 'w') as f:
      f.write(text)
  out(f'wrote {", ".join(files)} to {directory}')


def _short_dtype(dtype: str) -> str:
  return {'float32': 'f32', 'bfloat16': 'bf16', 'float16': 'f16'}.get(dtype, dtype)

"""What `python -m experiments.compile` prints: memory fit, accumulation, model FLOPs and the
ESTIMATED step time and MFU of a config's train step on an accelerator target.

    figures = fit_report.run(config, 'h100:8', dump_dir=None)   # prints as it goes

Memory figures are XLA's buffer assignment for the target (what the compiled program needs,
exactly as a run on that machine would compile it, but for GEMM autotuning, which needs a
device); step time and MFU are estimates from the kernel roofline (roofline.py), labelled as
such on every line.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Optional

import ml_collections

from realformer_jax.analysis import flops as flops_lib
from realformer_jax.aot import ring_overlap, roofline, targets, train_step
from realformer_jax.config import ConfigError
from realformer_jax.kernels.score_paths import ring_attention
from realformer_jax.model import layer_unroll
from realformer_jax.units import GiB

ESTIMATE_MODEL = (
  'a kernel roofline over the optimized program, realformer_jax/aot/'
  'roofline.py: per kernel max(bytes / HBM rate, FLOPs / matmul rate, '
  'element-wise ops / vector rate) + launch overhead, summed'
)


def _gib(n: float) -> str:
  return f'{n / GiB:.2f} GiB'


@dataclasses.dataclass(frozen=True)
class FitReport:
  step: train_step.TargetStep
  estimate: roofline.Estimate
  model_flops: int  # per step, all devices
  peak_class: str  # which datasheet matmul peak MFU is quoted against
  auto: bool  # the config asked for grad_accum_steps='auto'

  @classmethod
  def of(cls, step: train_step.TargetStep, auto: bool) -> 'FitReport':
    spec = step.spec
    data, train = spec.data, spec.train
    estimate = roofline.estimate(
      step.compiled, step.target, score_dims=(data.max_len, data.max_len)
    )
    model_flops = flops_lib.mlm_step_flops(
      spec.model,
      batch=train.global_batch_size,
      seq_len=data.max_len,
      predictions=data.max_predictions,
    )
    short = {'float32': 'f32', 'bfloat16': 'bf16', 'float16': 'f16'}[spec.model.dtype]
    return cls(
      step, estimate, model_flops, targets.dtype_class(short, None, step.target.platform), auto
    )

  @property
  def peak(self) -> float:
    return self.step.target.chip.matmul_flops[self.peak_class]

  @property
  def mfu(self) -> float:
    return self.model_flops / (self.estimate.seconds * self.step.target.num_devices * self.peak)

  def _carry(self) -> str:
    """ ", residual_carry='qk'" for residual attention: the carry the build chose or was told."""
    built = self.step.resolved.setup.model_config
    if built is None or not built.use_residual_attention:
      return ''
    asked = self.step.spec.model.residual_carry
    how = ' (auto: kernels/plumbing/select.py)' if asked == 'auto' else ''
    backward = (
      f", residual_scores_backward='{built.residual_scores_backward}'"
      if built.residual_carry == 'scores'
      else ''
    )
    return f", residual_carry='{built.residual_carry}'{backward}{how}"

  def layer_scan(self) -> str:
    """How the compiled program runs the layers (model.scan_unroll, 'auto' resolved for the
    target: model/layer_unroll.py) and how long this host took to compile it."""
    built = self.step.resolved.setup.model_config or self.step.spec.model
    tried = ' (every accumulation tried)' if self.auto else ''
    took = f'compiled here in {self.step.compile_seconds:.1f} s{tried}'
    if not built.scan_layers:
      return f'layers: a Python loop (model.scan_layers=False); {took}'
    choice = layer_unroll.choose(built)
    return (
      f'layer scan: scan_unroll={built.scan_unroll!r} -> {choice.layers_per_iteration} '
      f'layer(s) per iteration, {choice.reason}; {took}'
    )

  def lines(self) -> list[str]:
    step, est, target = self.step, self.estimate, self.step.target
    spec, m = step.spec, step.memory
    model, data, train = spec.model, spec.data, spec.train
    accum = train.grad_accum_steps
    per_device = train.global_batch_size // spec.data_parallel_size(target.num_devices)
    mesh = ' '.join(f'{k}={v}' for k, v in step.resolved.setup.mesh.shape.items())
    margin = step.budget_bytes - m.needed
    verdict = (
      f'fits, {_gib(margin)} to spare' if margin >= 0 else f'does NOT fit, {_gib(-margin)} short'
    )
    lines = [
      f'model: {model.ln_placement}, {model.num_layers} layers x {model.hidden_size}, '
      f'{model.num_heads} heads, vocab {model.vocab_size}, {model.dtype} compute, '
      f"remat_policy='{model.remat_policy}'{self._carry()}; global batch "
      f'{train.global_batch_size} x {data.max_len} tokens; mesh {mesh}',
      self.layer_scan(),
      f'accumulation: {accum} microbatch(es) of {per_device // accum} sequence(s) per device'
      + (" (grad_accum_steps='auto', chosen for this target)" if self.auto else ' (as configured)'),
      'memory per device (XLA buffer assignment for the target):',
      f'  arguments    {_gib(m.arguments):>11}  (params {_gib(m.params)}, optimizer state '
      f'{_gib(m.optimizer_state)}, batch and rng {_gib(m.batch_and_rest)})',
      f'  outputs      {_gib(m.outputs):>11}  ({_gib(m.aliased)} of them reuse the donated state)',
      f'  temporaries  {_gib(m.temporaries):>11}',
      f'  needs        {_gib(m.needed):>11}  of {_gib(step.budget_bytes)} '
      f'({step.budget_source}): {verdict}',
      f'model FLOPs per step: {self.model_flops:.4g} (realformer_jax/analysis/flops.py; '
      f'{self.model_flops / target.num_devices:.4g} per device)',
      f'ESTIMATED step time: {est.seconds * 1e3:.1f} ms (kernels '
      f'{est.compute_seconds * 1e3:.1f} ms + collectives {est.collective_seconds * 1e3:.1f} '
      f'ms, nothing overlapped; {est.overlapped_seconds * 1e3:.1f} ms if the collectives '
      f'hide behind compute), {est.launches:,} kernel launches, {est.hbm_bytes / 1e9:.1f} GB '
      'of HBM traffic per device',
      f'ESTIMATED MFU: {self.mfu:.3f} of the {self.peak_class} datasheet peak '
      f'({self.peak / 1e12:.1f} TFLOP/s x {target.num_devices} devices)',
      'ESTIMATED time per step by category: '
      + ', '.join(f'{name} {seconds * 1e3:.1f} ms' for name, seconds in est.by_category().items()),
      f'  (estimates, not measurements: {ESTIMATE_MODEL})',
    ]
    if est.xla_flops is not None:
      optimal = (
        f'optimal_seconds {est.xla_optimal_seconds * 1e3:.2f} ms'
        if est.xla_optimal_seconds is not None
        else 'no usable optimal_seconds (XLA returned a negative one)'
      )
      lines.append(
        f"XLA's own cost analysis, beside the roofline (it counts each loop body "
        f'once, not per trip): {optimal}, FLOPs {est.xla_flops:.4g}, bytes accessed '
        f'{est.xla_bytes_accessed or 0:.4g}'
      )
    if self.ring_block_op():
      lines.append(f'ring attention per-block op: {self.ring_block_op()}')
    lines += ring_overlap.report_lines(est)
    lines += [f'warning: {warning}' for warning in est.warnings]
    return lines

  def ring_block_op(self) -> Optional[str]:
    """What the ring attends each block with, as a run's log names it (None without a ring):
    the estimate depends on it, so every figure quoted from a ring names it."""
    setup = self.step.resolved.setup
    if self.step.spec.sequence_parallel_size(setup.mesh.size) == 1:
      return None
    return ring_attention.block_op(setup.model_config)

  def figures(self) -> dict:
    step, est, m = self.step, self.estimate, self.step.memory
    return {
      'target': step.target.spec,
      'devices': step.target.num_devices,
      'grad_accum_steps': step.spec.train.grad_accum_steps,
      'remat_policy': step.spec.model.remat_policy,
      'scan_unroll': layer_unroll.layers_per_iteration(
        step.resolved.setup.model_config or step.spec.model
      ),
      'compile_seconds': step.compile_seconds,
      'mesh': dict(step.resolved.setup.mesh.shape),
      'memory': {
        'arguments': m.arguments,
        'outputs': m.outputs,
        'aliased': m.aliased,
        'temporaries': m.temporaries,
        'params': m.params,
        'optimizer_state': m.optimizer_state,
        'needed': m.needed,
        'budget': step.budget_bytes,
        'fits': step.fits,
      },
      'model_flops': self.model_flops,
      'estimate': {
        'seconds': est.seconds,
        'compute_seconds': est.compute_seconds,
        'collective_seconds': est.collective_seconds,
        'mfu': self.mfu,
        'peak': self.peak_class,
        'launches': est.launches,
        'hbm_bytes': est.hbm_bytes,
        'non_gemm_bytes': est.non_gemm_bytes,
        'by_category': est.by_category(),
        'xla_optimal_seconds': est.xla_optimal_seconds,
        'ring': ring_overlap.figures(est),
        'ring_block_op': self.ring_block_op(),
        'warnings': list(est.warnings),
      },
    }


def run(
  config: ml_collections.ConfigDict,
  target_spec: str,
  dump_dir: Optional[str] = None,
  out: Callable[[str], None] = print,
) -> dict:
  """Compiles `config`'s train step for `target_spec` and prints the report; returns its
  figures. Raises ConfigError (one line) if the step cannot fit."""
  target = targets.parse(target_spec)
  out(
    f'Compiling the train step for {target.describe()} on this host (deviceless: XLA '
    'compiles for the target; nothing is run or measured)'
  )
  step = train_step.compile_for_target(config, target, log=lambda line: out(f'  {line}'))
  report = FitReport.of(step, auto=str(config.train.grad_accum_steps) == 'auto')
  for line in report.lines():
    out(line)
  figures = report.figures()
  if dump_dir:
    _dump(dump_dir, step, report.estimate, figures, out)
  if not step.fits:
    m = step.memory
    raise ConfigError(
      f'the step needs {m.needed:,} bytes per device ({_gib(m.needed)}) with '
      f'train.grad_accum_steps={step.spec.train.grad_accum_steps}, the target has '
      f"{step.budget_bytes:,} ({step.budget_source}); try grad_accum_steps='auto', FSDP "
      '(mesh.shape=(1,-1,1)) or more devices'
    )
  return figures


def _dump(
  directory: str,
  step: train_step.TargetStep,
  estimate: roofline.Estimate,
  figures: dict,
  out: Callable[[str], None],
) -> None:
  os.makedirs(directory, exist_ok=True)
  files = {
    'train_step.hlo.txt': step.compiled.as_text(),
    'kernels.csv': estimate.csv(),
    'report.json': json.dumps(figures, indent=1, default=str) + '\n',
  }
  for name, text in files.items():
    with open(os.path.join(directory, name), 'w') as f:
      f.write(text)
  out(f'wrote {", ".join(files)} to {directory}')

"""The init sweep's trainer and report (Plan.trainer and Plan.report 'init_sweep';
studies/plans/init_grad_sweep.py): a run builds the grad_norms plan's Post-LN model under one
change and measures, at init, each sublayer's per-layer gradient norm and the token cosine after
each layer; the report is one row per setting.

The plan's options: the grad_norms plan's, and labels (per setting, the report's row name).
"""

from __future__ import annotations

import os
from typing import Mapping

import jax
import numpy as np

from realformer_jax import MaskedLM, ModelConfig
from realformer_jax.analysis import diagnostics
from realformer_jax.model import params as params_lib
from realformer_jax.model.losses import mlm_loss_and_metrics
from realformer_jax.studies import grad_norms, study
from realformer_jax.studies.plan import Plan
from realformer_jax.studies.report import write_lines, write_results

# The fields a run states of its model.
STATED = ('num_layers', 'hidden_size', 'num_heads', 'mlp_dim', 'max_len', 'activation', 'init')
STATED += ('ln_placement', 'dropout_rate', 'attention_dropout_rate')


def measure(cfg: ModelConfig, batch: dict, seed: int) -> dict:
  """Per-layer gradient norms of each sublayer and token cosines of `cfg` at init (dropout in
  the backward pass where the model has any)."""
  model = MaskedLM(cfg)
  inputs = study.model_inputs(batch)
  params = params_lib.unbox(
    jax.jit(lambda k: model.init(k, *inputs))(jax.random.key(seed))['params']
  )
  train_mode = cfg.dropout_rate > 0

  def loss(p):
    logits = model.apply(
      {'params': p},
      *inputs,
      deterministic=not train_mode,
      step=0,
      rngs={'dropout': jax.random.key(seed + 1)},
    )
    return mlm_loss_and_metrics(logits, batch['masked_ids'], batch['masked_weights'])[0]

  grads = jax.jit(jax.grad(loss))(params)
  norms = {k: np.asarray(v) for k, v in diagnostics.per_layer_grad_norms(grads).items()}
  cosine = np.asarray(grad_norms.token_cosines(model, params, batch, 0))
  return {
    'attention': norms['attention'].tolist(),
    'mlp': norms['mlp'].tolist(),
    'token_cosine': cosine.tolist(),
  }


def train(plan: Plan, run, workdir: str, data_dir: str, report) -> dict:
  """Measures one setting at init (`workdir` is not written)."""
  scale, options, seed = plan.scale, plan.options, run.params['seed']
  grad_norms.start(options)
  fields = run.params.get('model', {})
  source = study.BatchSource(
    fields.get('max_len', scale.seq_len), options['data'], data_dir, scale.vocab
  )
  batch = source.measure_batch(options['measure_batch'], seed)
  cfg = grad_norms.model_config(scale, options, source.vocab_size, fields)
  result = measure(cfg, batch, seed)
  result['config'] = {k: getattr(cfg, k) for k in STATED}
  return result


def setting_runs(plan: Plan, results: Mapping[str, dict]) -> dict[str, dict]:
  """The finished runs by setting, in the plan's order."""
  names = {
    arm.variant: plan.run_name(arm.variant, arm.rate, arm.steps, 0) for arm in plan.all_arms()
  }
  return {setting: results[name] for setting, name in names.items() if name in results}


def analyse(plan: Plan, results: Mapping[str, dict]) -> dict:
  """Per setting: layers, first/last of each sublayer's gradient, the attention gradient at
  layer 1, the middle and the last layer, the token cosine after layer 10 and the last; the
  run time (the runs added up; runs split from the script's one file carry its total)."""
  settings = {}
  for name, r in setting_runs(plan, results).items():
    a, m, c = r['attention'], r['mlp'], r['token_cosine']
    settings[name] = {
      'layers': len(a),
      'attention_first_over_last': a[0] / a[-1],
      'mlp_first_over_last': m[0] / m[-1],
      'attention': [a[0], a[len(a) // 2], a[-1]],
      'token_cosine': [c[min(9, len(c) - 1)], c[-1]],
    }
  runs = setting_runs(plan, results).values()
  timed = [r['seconds'] for r in runs if r.get('seconds') is not None]
  return {
    'settings': settings,
    'seconds': sum(timed) if len(timed) == len(runs) else max(r['sweep_seconds'] for r in runs),
  }


def write(plan: Plan, results: Mapping[str, dict], analysis: dict, command: str) -> None:
  """results.json (the options and the analysis) and results.md in plan.out."""
  os.makedirs(plan.out, exist_ok=True)
  write_results(
    plan.out,
    {'options': dict(plan.options), 'summary': analysis},
    lambda path: analysis['settings'] and write_markdown(path, plan, analysis, command),
  )


def write_markdown(path: str, plan: Plan, analysis: dict, command: str) -> None:
  scale, labels = plan.scale, plan.options['labels']
  lines = [
    '# Post-LN gradients at initialisation: one change at a time',
    '',
    f'Regenerate: `{command}`. '
    f'Base: {scale.layers} layers, hidden {scale.hidden}, FFN {scale.mlp}, init '
    f'{plan.options["init"]}, no dropout, the fixed held-out batch of the grad_norms plan. '
    'Gradient norm = L2 norm of all parameters of a sublayer. '
    'first/last = layer 1 / last layer (< 1: shrinks toward the input). Token cosine = '
    'mean cosine between two tokens of a sequence after the layer (1: rank collapse). '
    f'Run time {analysis["seconds"]:.0f} s.',
    '',
    '| setting | layers | attn first/last | ffn first/last | attn grad: layer 1, mid, '
    'last | token cosine: layer 10, last |',
    '|---|---:|---:|---:|---|---|',
  ]
  for name, row in analysis['settings'].items():
    lines.append(
      f'| {labels[name]} | {row["layers"]} | {row["attention_first_over_last"]:.3g} | '
      f'{row["mlp_first_over_last"]:.3g} | '
      + ', '.join(f'{x:.3g}' for x in row['attention'])
      + ' | '
      + ', '.join(f'{x:.3f}' for x in row['token_cosine'])
      + ' |'
    )
  write_lines(path, [*lines, ''])

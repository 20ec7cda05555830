"""The gradient-norm study's trainer and report (Plan.trainer and Plan.report 'grad_norms';
studies/plans/grad_norms.py): a run builds one variant, measures it on a fixed batch at init,
trains it a few hundred AdamW steps and measures it again; the report tables and plots the
per-layer gradient norms of every variant side by side.

The plan's options: measure_batch, weight_decay, clip, init (of every variant but DS-Init),
data ('auto', 'embedded' or 'synthetic') and quick (XLA's optimisations off).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

import jax
import numpy as np
import optax

from realformer_jax import MaskedLM, ModelConfig
from realformer_jax.analysis import diagnostics
from realformer_jax.model import params as params_lib
from realformer_jax.model.losses import mlm_loss_and_metrics
from realformer_jax.studies import study
from realformer_jax.studies.plan import Plan
from realformer_jax.studies.report import write_lines, write_results
from realformer_jax.studies.scale import Scale

SUBLAYERS = ('attention', 'mlp')
COSINE_SEQUENCES = 16  # capture_intermediates keeps every attention map: a few sequences
MEASURE_SEED_OFFSET = 10_000  # the measurement batch's seed: apart from the training stream's
LOSS_TAIL = 20  # the last training steps whose mean loss the summary shows


# The encoder's fields a scale sets: ModelConfig field -> Scale field.
SCALE_FIELDS = {
  'hidden_size': 'hidden',
  'num_layers': 'layers',
  'num_heads': 'heads',
  'mlp_dim': 'mlp',
  'max_len': 'seq_len',
  'dropout_rate': 'dropout',
  'attention_dropout_rate': 'dropout',
  'position_embedding': 'position_embedding',
}


def model_config(scale: Scale, options: Mapping, vocab_size: int, fields: Mapping) -> ModelConfig:
  """The measured encoder: `scale`'s shape, dropout and positions, then init and `fields`."""
  base = {field: getattr(scale, key) for field, key in SCALE_FIELDS.items()}
  return ModelConfig(**{**base, 'vocab_size': vocab_size, 'init': options['init'], **fields})


def start(options: Mapping) -> None:
  """What every run of a plan with these options does first."""
  if options['quick']:
    # Compile time dominates a smoke run; XLA's optimisations only pay off for long runs.
    jax.config.update('jax_disable_most_optimizations', True)


def token_cosines(model: MaskedLM, params, batch: dict, step) -> jax.Array:
  """Mean cosine between the tokens of a sequence after each layer (rank collapse), over the
  first COSINE_SEQUENCES sequences of `batch`."""
  few = jax.tree.map(lambda a: a[:COSINE_SEQUENCES], batch)
  outputs = diagnostics.layer_outputs(
    model, {'params': params}, *study.model_inputs(few), step=step
  )
  return jax.vmap(lambda h: diagnostics.token_cosine(h, few['input_mask']))(outputs)


# ---------------------------------------------------------------------------------------------
# The trainer.
# ---------------------------------------------------------------------------------------------


def make_steps(cfg: ModelConfig, tx: optax.GradientTransformation):
  model = MaskedLM(cfg)

  def loss_fn(variables, batch, step):
    logits = model.apply(variables, *study.model_inputs(batch), step=step)
    return mlm_loss_and_metrics(logits, batch['masked_ids'], batch['masked_weights'])[0]

  @jax.jit
  def train_step(params, opt_state, batch, step):
    loss, grads = jax.value_and_grad(lambda p: loss_fn({'params': p}, batch, step))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def measure(params, perturbations, batch, step):
    """Per-layer gradient norms of each sublayer and the DS-Init ratios on one batch."""
    param_grads, probe_grads = diagnostics.param_and_probe_grads(
      lambda v: loss_fn(v, batch, step), params, perturbations
    )
    return {
      'grad_norms': diagnostics.per_layer_grad_norms(param_grads),
      # |dL/dx| at each layer's input: the activation gradient the vanishing-gradient
      # argument is about (parameter gradients also scale with the activations).
      'input_grad_norms': diagnostics.probe_grad_norms(probe_grads)['attention_input'],
      'beta': diagnostics.beta_ratios(probe_grads),
      'token_cosine': token_cosines(model, params, batch, step),
      'loss': loss_fn({'params': params}, batch, step),
    }

  return model, train_step, measure


def optimizer(scale: Scale, options: Mapping) -> optax.GradientTransformation:
  """AdamW with BERT's schedule (linear warm-up, then linear decay to 0) and a global-norm clip."""
  warmup = max(1, int(scale.warmup_frac * scale.steps))
  lr = optax.join_schedules(
    [
      optax.linear_schedule(0.0, scale.learning_rate, warmup),
      optax.linear_schedule(scale.learning_rate, 0.0, max(1, scale.steps - warmup)),
    ],
    [warmup],
  )
  return optax.chain(
    optax.clip_by_global_norm(options['clip']),
    optax.adamw(lr, weight_decay=options['weight_decay']),
  )


def train(plan: Plan, run, workdir: str, data_dir: str, report) -> dict:
  """Measures one variant at init, trains it `scale.steps` steps, measures it again (no
  checkpoints: `workdir` is not written)."""
  scale, options, seed = plan.scale, plan.options, run.params['seed']
  start(options)
  source = study.BatchSource(scale.seq_len, options['data'], data_dir, scale.vocab)
  measure_batch = source.measure_batch(options['measure_batch'], seed + MEASURE_SEED_OFFSET)
  cfg = model_config(scale, options, source.vocab_size, run.params.get('model', {}))
  tx = optimizer(scale, options)
  model, train_step, measure = make_steps(cfg, tx)
  params = params_lib.unbox(
    jax.jit(lambda k: model.init(k, *study.model_inputs(measure_batch)))(jax.random.key(seed))[
      'params'
    ]
  )
  perturbations = diagnostics.zero_perturbations(model, params, *study.model_inputs(measure_batch))
  opt_state = tx.init(params)
  at_init = jax.device_get(measure(params, perturbations, measure_batch, 0))

  losses = []
  batches = source.batches(scale.batch, seed + 1)  # the same order for every variant
  for step in range(scale.steps):
    params, opt_state, loss = train_step(params, opt_state, next(batches), step)
    losses.append(loss)  # kept on device: no host sync inside the loop
    report((step + 1) / (scale.steps + 1), f'step {step + 1}/{scale.steps}')
  losses = [float(x) for x in jax.device_get(losses)]
  trained = jax.device_get(measure(params, perturbations, measure_batch, scale.steps))
  to_list = lambda tree: jax.tree.map(lambda a: np.asarray(a).tolist(), tree)
  return {
    'config': {
      k: getattr(cfg, k)
      for k in ('ln_placement', 'residual_branch', 'init', 'use_residual_attention')
    },
    'init': to_list(at_init),
    'trained': to_list(trained),
    'train_loss': losses,
    'data': source.kind,
    'vocab_size': source.vocab_size,
    'device': f'{jax.devices()[0].platform} x{jax.device_count()} ({os.cpu_count()} cores)',
  }


# ---------------------------------------------------------------------------------------------
# The report.
# ---------------------------------------------------------------------------------------------


def variant_runs(plan: Plan, results: Mapping[str, dict]) -> dict[str, dict]:
  """The finished runs by variant, in the plan's order."""
  names = {
    arm.variant: plan.run_name(arm.variant, arm.rate, arm.steps, 0) for arm in plan.all_arms()
  }
  return {variant: results[name] for variant, name in names.items() if name in results}


def first_over_last(values) -> float | None:
  """Layer 1's value over the last layer's (None where the last is 0: ReZero at init)."""
  return values[0] / values[-1] if values[-1] > 0 else None


def analyse(plan: Plan, results: Mapping[str, dict]) -> dict:
  """Per variant: the loss at init and over the last steps, layer 1 / last layer of each
  gradient at init and at the end, the DS-Init ratios at init; what the runs ran on."""
  runs = variant_runs(plan, results)
  variants = {}
  for name, r in runs.items():
    ratios = {}
    for key in ('attention', 'mlp', 'dx'):
      pick = lambda when: r[when]['input_grad_norms'] if key == 'dx' else r[when]['grad_norms'][key]
      ratios[key] = [first_over_last(pick('init')), first_over_last(pick('trained'))]
    tail = r['train_loss'][-LOSS_TAIL:] or [float('nan')]
    variants[name] = {
      'loss_init': r['init']['loss'],
      'loss_tail': float(np.mean(tail)),
      'first_over_last': ratios,
      **{
        beta: [float(np.mean(r['init']['beta'][s][beta])) for s in SUBLAYERS]
        for beta in ('beta_ln', 'beta_rc')
      },
    }
  first = next(iter(runs.values()), {})
  return {
    'data': first.get('data'),
    'vocab_size': first.get('vocab_size'),
    'device': first.get('device'),
    # The runs' own times added up (what the one process of the script measured as a whole
    # also held its data preparation).
    'wall_seconds': sum(r['seconds'] for r in runs.values()),
    'variants': variants,
  }


def write(plan: Plan, results: Mapping[str, dict], analysis: dict, command: str) -> None:
  """results.json (the recipe and the analysis), results.md and grad_norms.png in plan.out."""
  runs = variant_runs(plan, results)
  plot_path = os.path.join(plan.out, 'grad_norms.png')
  os.makedirs(plan.out, exist_ok=True)
  write_results(
    plan.out,
    {'options': dict(plan.options), 'summary': analysis, 'runs': list(runs)},
    lambda path: runs and write_markdown(path, plan, runs, analysis, command),
    lambda: [plot_path] if runs and write_plot(plot_path, plan, runs) else [],
  )


def _grad_table(runs: dict, when: str) -> list[str]:
  names = list(runs)
  head = '| layer | ' + ' | '.join(f'{n} attn | {n} ffn | {n} dx' for n in names) + ' |'
  rule = '|---:|' + '---:|' * (3 * len(names))
  rows = [head, rule]
  num_layers = len(next(iter(runs.values()))[when]['grad_norms']['attention'])
  for layer in range(num_layers):
    cells = []
    for n in names:
      g, dx = runs[n][when]['grad_norms'], runs[n][when]['input_grad_norms']
      cells += [f'{g["attention"][layer]:.2e}', f'{g["mlp"][layer]:.2e}', f'{dx[layer]:.2e}']
    rows.append(f'| {layer + 1} | ' + ' | '.join(cells) + ' |')
  return rows


def _summary_table(analysis: dict) -> list[str]:
  rows = [
    '| variant | loss: init / last 20 steps | attn first/last: init / end | '
    'ffn first/last: init / end | dx first/last: init / end | '
    'beta_LN attn, ffn @init | beta_RC attn, ffn @init |',
    '|---|---:|---:|---:|---:|---:|---:|',
  ]
  ratio = lambda value: 'n/a' if value is None else f'{value:.3g}'
  for n, v in analysis['variants'].items():
    both = lambda key: ' / '.join(ratio(x) for x in v['first_over_last'][key])
    beta = lambda key: ', '.join(f'{x:.3f}' for x in v[key])
    rows.append(
      f'| {n} | {v["loss_init"]:.3f} / {v["loss_tail"]:.3f} | '
      f'{both("attention")} | {both("mlp")} | {both("dx")} | '
      f'{beta("beta_ln")} | {beta("beta_rc")} |'
    )
  return rows


def _cosine_table(runs: dict) -> list[str]:
  num_layers = len(next(iter(runs.values()))['init']['token_cosine'])
  layers = sorted({1, *range(4, num_layers + 1, max(1, num_layers // 8)), num_layers})
  rows = [
    '| variant | ' + ' | '.join(f'L{l}' for l in layers) + ' |',
    '|---|' + '---:|' * len(layers),
  ]
  for n, r in runs.items():
    for when, label in (('init', 'init'), ('trained', 'end')):
      cos = r[when]['token_cosine']
      rows.append(f'| {n} ({label}) | ' + ' | '.join(f'{cos[l - 1]:.3f}' for l in layers) + ' |')
  return rows


def write_markdown(path: str, plan: Plan, runs: dict, analysis: dict, command: str) -> None:
  scale, options = plan.scale, plan.options
  lines = [
    '# Per-layer gradient norms',
    '',
    f'Regenerate: `{command}`. '
    f'{scale.layers} layers, hidden {scale.hidden}, {scale.heads} heads, FFN {scale.mlp}, '
    f'sequence {scale.seq_len}, batch {scale.batch}, {scale.steps} AdamW steps (peak lr '
    f'{scale.learning_rate}, warm-up {scale.warmup_frac:.0%} then linear decay, weight decay '
    f'{options["weight_decay"]}, clip {options["clip"]}), no dropout, init {options["init"]} '
    f'(DS-Init for post+ds_init), data: {analysis["data"]} (vocab {analysis["vocab_size"]}). '
    f'Gradient norms are L2 norms of all parameters of a sublayer (attention: Q, K, V, '
    f'output projection + biases; ffn: both matrices + biases) on one fixed batch of '
    f'{options["measure_batch"]} sequences '
    f'({"held out: eval split" if analysis["data"] == "embedded" else "synthetic"}). '
    'Layer 1 is next to the embeddings. '
    f'Wall time {analysis["wall_seconds"]:.0f} s (the runs added up) on {analysis["device"]}.',
    '',
    '## Summary',
    '',
    "attn / ffn = L2 norm of the gradient of the sublayer's parameters; dx = |dL/dx| at the "
    "layer's input (the activation gradient). first/last = layer 1 divided by the last "
    "layer (< 1: the gradient shrinks toward the input; n/a: the last layer's is 0, as "
    "for ReZero's branches at init). beta = DS-Init ratios averaged over layers, on the "
    'same batch (realformer_jax/analysis/diagnostics.py; beta_LN = 1 where the trunk has no norm).',
    '',
    *_summary_table(analysis),
    '',
    '## Token similarity',
    '',
    'Mean cosine between the representations of two tokens of the same sequence after '
    f'layer L (first {COSINE_SEQUENCES} sequences of the same batch): near 1, the tokens have '
    'collapsed onto one direction (rank collapse) and attention can no longer tell them apart.',
    '',
    *_cosine_table(runs),
    '',
    '## At initialisation',
    '',
    *_grad_table(runs, 'init'),
    '',
    f'## After {scale.steps} steps',
    '',
    *_grad_table(runs, 'trained'),
    '',
  ]
  write_lines(path, lines)


def write_plot(path: str, plan: Plan, runs: dict) -> bool:
  plt = study.pyplot()
  if plt is None:
    print('matplotlib is not installed: no plot (pip install matplotlib)', file=sys.stderr)
    return False
  fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
  for row, (when, title) in enumerate(
    (('init', 'at init'), ('trained', f'after {plan.scale.steps} steps'))
  ):
    for col, sublayer in enumerate(SUBLAYERS):
      ax = axes[row, col]
      for name, r in runs.items():
        values = np.asarray(r[when]['grad_norms'][sublayer])
        if not np.any(values > 0):  # ReZero's branches at init: nothing to draw on a log axis
          ax.plot([], [], label=f'{name}: all 0')
          continue
        ax.semilogy(np.arange(1, len(values) + 1), values, label=name)
      ax.set_title(f'{"attention" if sublayer == "attention" else "FFN"} {title}')
      ax.set_ylabel('gradient norm')
      ax.grid(True, which='both', alpha=0.3)
  for ax in axes[1]:
    ax.set_xlabel('layer (1 = next to the embeddings)')
  axes[0, 0].legend(fontsize=8)
  study.save_figure(fig, path)
  return True

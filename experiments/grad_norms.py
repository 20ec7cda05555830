"""Per-layer gradient norms of a deep, narrow encoder at init and after a few hundred AdamW
steps, for Post-LN, Pre-LN, RealFormer, Post-LN + DS-Init and ReZero (docs/variants.md).

    python -m experiments.grad_norms                        # 48 layers, ~10 min on 2 CPU cores
    python -m experiments.grad_norms --quick --out /tmp/gn  # 4 layers, 3 steps: a smoke test

Writes <out>/grad_norms.md (tables), <out>/grad_norms.png (plot, if matplotlib is installed) and
<out>/grad_norms.json (every number). Data: the embedded corpus (--data=auto or embedded), or a
synthetic MLM stream with the same batch contract (study.BatchSource).

Every variant uses the same width, data order, measurement batch and optimiser. Dense kernels
use Xavier init (--init) as in the DS-Init paper's baseline: under BERT's 0.02 init a width-64
branch is ~100x smaller than the trunk, every layer is nearly the identity, and Post-LN's
vanishing gradient does not show at this width. DS-Init replaces the init of its variant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np
import optax

from realformer_jax import MaskedLM, ModelConfig
from realformer_jax.analysis import diagnostics
from realformer_jax.model import params as params_lib
from realformer_jax.model.losses import mlm_loss_and_metrics
from realformer_jax.studies import study
from realformer_jax.studies.report import write_lines

VARIANTS = {  # name: ModelConfig overrides on top of the shared base
  'post': dict(ln_placement='post'),
  'pre': dict(ln_placement='pre'),
  'realformer': dict(ln_placement='realformer'),
  'post+ds_init': dict(ln_placement='post', init='ds_init'),
  'rezero': dict(ln_placement='none', residual_branch='rezero'),
}
SUBLAYERS = ('attention', 'mlp')
COSINE_SEQUENCES = 16  # capture_intermediates keeps every attention map: a few sequences


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
    description=__doc__.split('\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument('--out', default='results/grad_norms', help='output folder')
  p.add_argument(
    '--quick',
    action='store_true',
    help='smoke test: 4 layers, 3 steps, tiny batches, synthetic data',
  )
  p.add_argument('--variants', default=','.join(VARIANTS), help='comma-separated subset')
  p.add_argument('--layers', type=int, default=48)
  p.add_argument('--hidden', type=int, default=64)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--mlp', type=int, default=256)
  p.add_argument('--seq_len', type=int, default=64)
  p.add_argument('--batch', type=int, default=8)
  p.add_argument(
    '--measure_batch',
    type=int,
    default=64,
    help='sequences in the fixed batch the tables are measured on',
  )
  p.add_argument('--steps', type=int, default=200)
  p.add_argument('--lr', type=float, default=5e-4, help='peak AdamW learning rate')
  p.add_argument('--warmup', type=float, default=0.1, help='warm-up fraction of --steps')
  p.add_argument('--weight_decay', type=float, default=0.01)
  p.add_argument('--clip', type=float, default=1.0, help='global-norm clip (BERT: 1.0)')
  p.add_argument('--init', default='xavier', help='ModelConfig.init of every variant but DS-Init')
  p.add_argument('--data', default='auto', choices=('auto', 'embedded', 'synthetic'))
  p.add_argument('--data_dir', default='', help='TFDS data dir for the embedded corpus')
  p.add_argument('--vocab', type=int, default=8000, help='vocabulary of synthetic data')
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args(argv)
  if args.quick:
    # Compile time dominates a smoke test; XLA's optimisations only pay off for long runs.
    jax.config.update('jax_disable_most_optimizations', True)
    args.layers, args.steps, args.batch, args.measure_batch = 4, 3, 4, 4
    args.hidden, args.mlp, args.seq_len, args.vocab = 32, 64, 32, 256
    if args.data == 'auto':
      args.data = 'synthetic'
  return args


# ---------------------------------------------------------------------------------------------
# Model, optimiser, jitted steps.
# ---------------------------------------------------------------------------------------------


def model_config(args: argparse.Namespace, vocab_size: int, overrides: dict) -> ModelConfig:
  base = dict(
    vocab_size=vocab_size,
    hidden_size=args.hidden,
    num_layers=args.layers,
    num_heads=args.heads,
    mlp_dim=args.mlp,
    max_len=args.seq_len,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    init=args.init,
  )
  return ModelConfig(**{**base, **overrides})


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

  def token_cosines(params, batch, step):
    """Mean cosine between the tokens of a sequence after each layer (rank collapse)."""
    few = jax.tree.map(lambda a: a[:COSINE_SEQUENCES], batch)
    outputs = diagnostics.layer_outputs(
      model, {'params': params}, *study.model_inputs(few), step=step
    )
    return jax.vmap(lambda h: diagnostics.token_cosine(h, few['input_mask']))(outputs)

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
      'token_cosine': token_cosines(params, batch, step),
      'loss': loss_fn({'params': params}, batch, step),
    }

  return model, train_step, measure


def run_variant(
  name: str, cfg: ModelConfig, args, source: study.BatchSource, measure_batch
) -> dict:
  warmup = max(1, int(args.warmup * args.steps))
  # BERT's schedule: linear warm-up, then linear decay to 0.
  lr = optax.join_schedules(
    [
      optax.linear_schedule(0.0, args.lr, warmup),
      optax.linear_schedule(args.lr, 0.0, max(1, args.steps - warmup)),
    ],
    [warmup],
  )
  tx = optax.chain(
    optax.clip_by_global_norm(args.clip), optax.adamw(lr, weight_decay=args.weight_decay)
  )
  model, train_step, measure = make_steps(cfg, tx)
  start = time.time()
  params = params_lib.unbox(
    jax.jit(lambda k: model.init(k, *study.model_inputs(measure_batch)))(jax.random.key(args.seed))[
      'params'
    ]
  )
  perturbations = diagnostics.zero_perturbations(model, params, *study.model_inputs(measure_batch))
  opt_state = tx.init(params)
  at_init = jax.device_get(measure(params, perturbations, measure_batch, 0))

  losses = []
  batches = source.batches(args.batch, args.seed + 1)  # the same order for every variant
  for step in range(args.steps):
    batch = next(batches)
    params, opt_state, loss = train_step(params, opt_state, batch, step)
    losses.append(loss)  # kept on device: no host sync inside the loop
  losses = [float(x) for x in jax.device_get(losses)]
  trained = jax.device_get(measure(params, perturbations, measure_batch, args.steps))
  seconds = time.time() - start
  tail = losses[-min(20, len(losses)) :] if losses else [float('nan')]
  print(
    f'{name:>14}: loss {at_init["loss"]:.3f} -> {np.mean(tail):.3f} '
    f'(measure batch {trained["loss"]:.3f}), {seconds:.0f}s',
    flush=True,
  )
  to_list = lambda tree: jax.tree.map(lambda a: np.asarray(a).tolist(), tree)
  return {
    'config': {
      k: getattr(cfg, k)
      for k in ('ln_placement', 'residual_branch', 'init', 'use_residual_attention')
    },
    'init': to_list(at_init),
    'trained': to_list(trained),
    'train_loss': losses,
    'seconds': seconds,
  }


# ---------------------------------------------------------------------------------------------
# Reporting.
# ---------------------------------------------------------------------------------------------


def _grad_table(results: dict, when: str) -> list[str]:
  names = list(results)
  head = '| layer | ' + ' | '.join(f'{n} attn | {n} ffn | {n} dx' for n in names) + ' |'
  rule = '|---:|' + '---:|' * (3 * len(names))
  rows = [head, rule]
  num_layers = len(next(iter(results.values()))[when]['grad_norms']['attention'])
  for layer in range(num_layers):
    cells = []
    for n in names:
      g, dx = results[n][when]['grad_norms'], results[n][when]['input_grad_norms']
      cells += [f'{g["attention"][layer]:.2e}', f'{g["mlp"][layer]:.2e}', f'{dx[layer]:.2e}']
    rows.append(f'| {layer + 1} | ' + ' | '.join(cells) + ' |')
  return rows


def _summary_table(results: dict) -> list[str]:
  rows = [
    '| variant | loss: init / last 20 steps | attn first/last: init / end | '
    'ffn first/last: init / end | dx first/last: init / end | '
    'beta_LN attn, ffn @init | beta_RC attn, ffn @init |',
    '|---|---:|---:|---:|---:|---:|---:|',
  ]

  for n, r in results.items():

    def ratio(key, when):
      values = r[when]['input_grad_norms'] if key == 'dx' else r[when]['grad_norms'][key]
      first, last = values[0], values[-1]
      return f'{first / last:.3g}' if last > 0 else 'n/a'  # ReZero at init: gates are 0

    both = lambda key: f'{ratio(key, "init")} / {ratio(key, "trained")}'
    beta = lambda key: ', '.join(f'{np.mean(r["init"]["beta"][s][key]):.3f}' for s in SUBLAYERS)
    tail = r['train_loss'][-20:] or [float('nan')]
    rows.append(
      f'| {n} | {r["init"]["loss"]:.3f} / {np.mean(tail):.3f} | '
      f'{both("attention")} | {both("mlp")} | {both("dx")} | '
      f'{beta("beta_ln")} | {beta("beta_rc")} |'
    )
  return rows


def _cosine_table(results: dict) -> list[str]:
  num_layers = len(next(iter(results.values()))['init']['token_cosine'])
  layers = sorted({1, *range(4, num_layers + 1, max(1, num_layers // 8)), num_layers})
  rows = [
    '| variant | ' + ' | '.join(f'L{l}' for l in layers) + ' |',
    '|---|' + '---:|' * len(layers),
  ]
  for n, r in results.items():
    for when, label in (('init', 'init'), ('trained', 'end')):
      cos = r[when]['token_cosine']
      rows.append(f'| {n} ({label}) | ' + ' | '.join(f'{cos[l - 1]:.3f}' for l in layers) + ' |')
  return rows


def write_markdown(path: str, results: dict, args, meta: dict) -> None:
  lines = [
    '# Per-layer gradient norms',
    '',
    f'{args.layers} layers, hidden {args.hidden}, {args.heads} heads, FFN {args.mlp}, '
    f'sequence {args.seq_len}, batch {args.batch}, {args.steps} AdamW steps (peak lr '
    f'{args.lr}, warm-up {args.warmup:.0%} then linear decay, weight decay '
    f'{args.weight_decay}, clip {args.clip}), no dropout, init {args.init} '
    f'(DS-Init for post+ds_init), data: {meta["data"]} (vocab {meta["vocab_size"]}). '
    f'Gradient norms are L2 norms of all parameters of a sublayer (attention: Q, K, V, '
    f'output projection + biases; ffn: both matrices + biases) on one fixed batch of '
    f'{args.measure_batch} sequences '
    f'({"held out: eval split" if meta["data"] == "embedded" else "synthetic"}). '
    'Layer 1 is next to the embeddings. '
    f'Wall time {meta["wall_seconds"]:.0f} s on {meta["device"]}.',
    '',
    '## Summary',
    '',
    "attn / ffn = L2 norm of the gradient of the sublayer's parameters; dx = |dL/dx| at the "
    "layer's input (the activation gradient). first/last = layer 1 divided by the last "
    "layer (< 1: the gradient shrinks toward the input; n/a: the last layer's is 0, as "
    "for ReZero's branches at init). beta = DS-Init ratios averaged over layers, on the "
    'same batch (realformer_jax/analysis/diagnostics.py; beta_LN = 1 where the trunk has no norm).',
    '',
    *_summary_table(results),
    '',
    '## Token similarity',
    '',
    'Mean cosine between the representations of two tokens of the same sequence after '
    'layer L (first 16 sequences of the same batch): near 1, the tokens have collapsed '
    'onto one direction (rank collapse) and attention can no longer tell them apart.',
    '',
    *_cosine_table(results),
    '',
    '## At initialisation',
    '',
    *_grad_table(results, 'init'),
    '',
    f'## After {args.steps} steps',
    '',
    *_grad_table(results, 'trained'),
    '',
  ]
  write_lines(path, lines)


def write_plot(path: str, results: dict, args) -> bool:
  plt = study.pyplot()
  if plt is None:
    print('matplotlib is not installed: no plot (pip install matplotlib)', file=sys.stderr)
    return False
  fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
  for row, (when, title) in enumerate(
    (('init', 'at init'), ('trained', f'after {args.steps} steps'))
  ):
    for col, sublayer in enumerate(SUBLAYERS):
      ax = axes[row, col]
      for name, r in results.items():
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


def main(argv=None) -> dict:
  args = parse_args(argv)
  names = [n.strip() for n in args.variants.split(',') if n.strip()]
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    raise SystemExit(f'--variants: unknown {unknown}; choose from {list(VARIANTS)}')
  os.makedirs(args.out, exist_ok=True)
  start = time.time()
  source = study.BatchSource(args.seq_len, args.data, args.data_dir, args.vocab)
  measure_batch = source.measure_batch(args.measure_batch, args.seed + 10_000)
  print(
    f'data: {source.kind} (vocab {source.vocab_size}); {args.layers} layers, '
    f'{args.steps} steps per variant',
    flush=True,
  )
  results = {}
  for name in names:
    cfg = model_config(args, source.vocab_size, VARIANTS[name])
    results[name] = run_variant(name, cfg, args, source, measure_batch)
  meta = {
    'data': source.kind,
    'vocab_size': source.vocab_size,
    'wall_seconds': time.time() - start,
    'device': f'{jax.devices()[0].platform} x{jax.device_count()} ({os.cpu_count()} cores)',
    'args': vars(args),
  }
  write_markdown(os.path.join(args.out, 'grad_norms.md'), results, args, meta)
  plotted = write_plot(os.path.join(args.out, 'grad_norms.png'), results, args)
  with open(os.path.join(args.out, 'grad_norms.json'), 'w') as f:
    json.dump({'meta': meta, 'results': results}, f)
  print(
    f'wrote {args.out}/grad_norms.md{", .png" if plotted else ""}, .json '
    f'in {meta["wall_seconds"]:.0f}s',
    flush=True,
  )
  return {'meta': meta, 'results': results}


if __name__ == '__main__':
  main()

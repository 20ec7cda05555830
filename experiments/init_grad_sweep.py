"""Does Post-LN's gradient shrink toward the first layers at init? The same measurement as
experiments/grad_norms.py (per-layer sublayer gradient norms on a fixed held-out batch), at
init only, for Post-LN under one change at a time: sequence length, width, depth, activation,
initialisation, dropout in the backward pass.

    python -m experiments.init_grad_sweep                       # ~2 min on 2 CPU cores
    python -m experiments.init_grad_sweep --quick --out /tmp/s  # smoke test

Writes <out>/init_sweep.md and <out>/init_sweep.json. A first/last ratio < 1 means the first
layer's gradient is smaller than the last one's (Post-LN's vanishing pattern; docs/variants.md,
Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture"); > 1 means it
grows toward the input.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from experiments import grad_norms
from realformer_jax import MaskedLM, ModelConfig
from realformer_jax.analysis import diagnostics
from realformer_jax.model import params as params_lib
from realformer_jax.model.losses import mlm_loss_and_metrics
from realformer_jax.studies import study
from realformer_jax.studies.report import write_lines

# The fields the report states of each model (and of the shared base).
STATED = ('num_layers', 'hidden_size', 'num_heads', 'mlp_dim', 'max_len', 'activation', 'init')
STATED += ('ln_placement', 'dropout_rate', 'attention_dropout_rate')
SETTINGS = {  # name: (overrides of grad_norms.py's post variant, sequence length)
  'post (grad_norms.py setting)': ({}, 64),
  'sequence 128': ({'max_len': 128}, 128),
  'width 256': ({'hidden_size': 256, 'mlp_dim': 1024}, 64),
  '18 layers': ({'num_layers': 18}, 64),
  'width 512, 18 layers, seq 128': (
    {'hidden_size': 512, 'num_heads': 8, 'mlp_dim': 2048, 'num_layers': 18, 'max_len': 128},
    128,
  ),
  'ReLU FFN': ({'activation': 'relu'}, 64),
  'dropout 0.1 (training-mode gradient)': (
    {'dropout_rate': 0.1, 'attention_dropout_rate': 0.1},
    64,
  ),
  'BERT init (std 0.02)': ({'init': 'bert'}, 64),
  'pre (for contrast)': ({'ln_placement': 'pre'}, 64),
}
COSINE_SEQUENCES = 16


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--out', default='results/init_sweep')
  p.add_argument('--quick', action='store_true', help='4 layers, tiny widths, 2 settings')
  p.add_argument('--measure_batch', type=int, default=64)
  p.add_argument('--data', default='auto', choices=('auto', 'embedded', 'synthetic'))
  p.add_argument('--data_dir', default='')
  p.add_argument('--seed', type=int, default=0)
  return p.parse_args(argv)


def measure(cfg: ModelConfig, batch: dict, seed: int) -> dict:
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
  few = jax.tree.map(lambda a: a[:COSINE_SEQUENCES], batch)
  outputs = diagnostics.layer_outputs(model, {'params': params}, *study.model_inputs(few), step=0)
  cosine = np.asarray(jax.vmap(lambda h: diagnostics.token_cosine(h, few['input_mask']))(outputs))
  return {
    'attention': norms['attention'].tolist(),
    'mlp': norms['mlp'].tolist(),
    'token_cosine': cosine.tolist(),
  }


def main(argv=None) -> dict:
  args = parse_args(argv)
  settings = dict(SETTINGS)
  # grad_norms.py's Post-LN model, from its own defaults (48 layers of width 64, Xavier init,
  # no dropout) or its --quick sizes, which also turn XLA's optimisations off.
  setting = grad_norms.parse_args(['--quick'] if args.quick else [])
  post = grad_norms.VARIANTS['post']
  base_config = grad_norms.model_config(setting, setting.vocab, post)
  base = {k: getattr(base_config, k) for k in STATED}
  if args.quick:
    settings = {'post': ({}, 32), 'ReLU FFN': ({'activation': 'relu'}, 32)}
    args.measure_batch = 4
    if args.data == 'auto':
      args.data = 'synthetic'
  start = time.time()
  sources: dict[int, tuple] = {}
  results = {}
  for name, (overrides, seq_len) in settings.items():
    if seq_len not in sources:  # grad_norms.py's batch source at this length
      source = study.BatchSource(
        seq_len, args.data, args.data_dir, vocab=256 if args.quick else 8000
      )
      sources[seq_len] = (source, source.measure_batch(args.measure_batch, args.seed))
    source, batch = sources[seq_len]
    cfg = grad_norms.model_config(setting, source.vocab_size, {**post, **overrides})
    r = measure(cfg, batch, args.seed)
    r['config'] = {k: getattr(cfg, k) for k in STATED}
    results[name] = r
    print(
      f'{name:40s} attn first/last {r["attention"][0] / r["attention"][-1]:6.3g}  '
      f'ffn first/last {r["mlp"][0] / r["mlp"][-1]:6.3g}  '
      f'token cosine after last layer {r["token_cosine"][-1]:.3f}',
      flush=True,
    )
  seconds = time.time() - start
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, 'init_sweep.json'), 'w') as f:
    json.dump({'results': results, 'seconds': seconds, 'base': base}, f, indent=1)
  write_markdown(os.path.join(args.out, 'init_sweep.md'), results, base, seconds)
  print(f'wrote {args.out}/init_sweep.md ({seconds:.0f}s)')
  return results


def write_markdown(path: str, results: dict, base: dict, seconds: float) -> None:
  lines = [
    '# Post-LN gradients at initialisation: one change at a time',
    '',
    f'Base: {base["num_layers"]} layers, hidden {base["hidden_size"]}, FFN '
    f'{base["mlp_dim"]}, init {base["init"]}, no dropout, the fixed held-out batch of '
    'experiments/grad_norms.py. Gradient norm = L2 norm of all parameters of a sublayer. '
    'first/last = layer 1 / last layer (< 1: shrinks toward the input). Token cosine = '
    'mean cosine between two tokens of a sequence after the layer (1: rank collapse). '
    f'Run time {seconds:.0f} s.',
    '',
    '| setting | layers | attn first/last | ffn first/last | attn grad: layer 1, mid, '
    'last | token cosine: layer 10, last |',
    '|---|---:|---:|---:|---|---|',
  ]
  for name, r in results.items():
    a, m, c = r['attention'], r['mlp'], r['token_cosine']
    lines.append(
      f'| {name} | {len(a)} | {a[0] / a[-1]:.3g} | {m[0] / m[-1]:.3g} | '
      f'{a[0]:.3g}, {a[len(a) // 2]:.3g}, {a[-1]:.3g} | '
      f'{c[min(9, len(c) - 1)]:.3f}, {c[-1]:.3f} |'
    )
  write_lines(path, [*lines, ''])


if __name__ == '__main__':
  main()

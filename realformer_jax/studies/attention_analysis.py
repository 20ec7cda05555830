"""The attention analysis's trainer and report (Plan.trainer and Plan.report 'attention';
studies/plans/attention_analysis.py): a run analyses one finished layouts run's checkpoint (the
plan's options['pretraining'] at r*) on its held-out split, per layer: attention entropy (mean,
spread, a sample) and the Jensen-Shannon divergence to the next layer; the report gives them per
layout over seeds, the paired differences per layer and the plan's comparisons (5a-5c) with
Holm-adjusted p-values and verdicts.

The plan's options: pretraining (the layouts Plan), max_batches (held-out batches per model, -1:
all).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

from realformer_jax import MaskedLM, data
from realformer_jax import train as train_lib
from realformer_jax.studies import stats, study
from realformer_jax.studies.layouts_runs import pretrained_run
from realformer_jax.studies.plan import Arm, Plan
from realformer_jax.studies.report import LAYOUT_COLORS, write_lines, write_results

# What a run keeps of one model's analysis in the report's per_model (not its sample).
MODEL_KEYS = ('workdir', 'tokens', 'heads', 'length', 'entropy_mean', 'entropy_std')
MODEL_KEYS += ('entropy_head_std', 'jsd_mean')


# Entropies kept per (model, layer) for the violin plots, to the digits a plot shows: six seeds
# pool 6,000 a violin, and a 6-layer model's record is 0.15 MB (4,000 at full precision made it
# 0.6 MB: ~50 MB of committed records over the depth study's three depths, now ~13 MB).
SAMPLE_PER_LAYER = 1000
SAMPLE_DECIMALS = 3


def batch_statistics(model: MaskedLM, params, batch):
  """Entropy [N, B, H, L] and adjacent-layer JSD [N-1, B, H, L] of one batch's maps."""
  _, state = model.apply({'params': params}, *study.model_inputs(batch), mutable=['intermediates'])
  p = state['intermediates']['encoder']['layers']['attention']['attention_probs'][0]
  return entropy_and_jsd(p)  # p: [N, B, H, L, L]


def entropy_and_jsd(p):
  """Entropy [N, ...] of each distribution over the last axis of `p` [N, ..., L], and the
  Jensen-Shannon divergence [N-1, ...] between layer l's and l + 1's, in nats.

  Probabilities below float32's smallest normal count as 0 (they carry < 1e-36 nats): a peaked
  softmax leaves subnormal ones, and the mixture's 0.5 * (a + b) of one beside a 0 rounds to 0
  (XLA's CPU flushes subnormals), whose log made the JSD inf at the top of the 24-layer
  RealFormers. KL(x || m) is written as x log(2x) - x log(x + y), whose arguments stay normal."""
  p = p.astype(jnp.float32)
  p = jnp.where(p >= jnp.finfo(jnp.float32).tiny, p, 0.0)
  entropy = -jnp.sum(xlogy(p, p), axis=-1)
  a, b = p[:-1], p[1:]
  kl = lambda x, y: jnp.sum(xlogy(x, 2 * x) - xlogy(x, x + y), axis=-1)
  return entropy, 0.5 * kl(a, b) + 0.5 * kl(b, a)


def analyse_workdir(workdir: str, max_batches: int = -1, seed: int = 0) -> dict:
  """Per-layer entropy mean / std / sample and per-pair JSD mean of one trained model."""
  run = train_lib.load_workdir(workdir)
  model = MaskedLM(run.model_config)
  stats_fn = jax.jit(lambda params, batch: batch_statistics(model, params, batch))
  config = run.config
  num_layers = run.model_config.num_layers
  sums = np.zeros(num_layers)
  squares = np.zeros(num_layers)
  count = 0
  jsd_sums = np.zeros(max(num_layers - 1, 0))
  head_std_sums = np.zeros(num_layers)  # std across heads, per token, summed over tokens
  samples = [[] for _ in range(num_layers)]
  rng = np.random.default_rng(seed)
  batches = data.make_eval_iterator(config.data, config.train.global_batch_size)
  for index, batch in enumerate(batches):
    if 0 <= max_batches <= index:
      break
    entropy, jsd = jax.device_get(
      stats_fn(run.params, {k: jnp.asarray(v) for k, v in batch.items()})
    )
    real = batch['input_mask'].astype(bool)  # [B, L] real query tokens
    if not real.any():
      continue
    e = entropy[:, real.nonzero()[0], :, real.nonzero()[1]]  # [tokens, N, H]
    e = np.moveaxis(e, 0, -1)  # [N, H, tokens]
    sums += e.sum(axis=(1, 2))
    squares += np.square(e).sum(axis=(1, 2))
    head_std_sums += e.std(axis=1).sum(axis=-1)
    tokens = e.shape[-1]
    count += tokens
    if num_layers > 1:
      j = jsd[:, real.nonzero()[0], :, real.nonzero()[1]]
      jsd_sums += np.moveaxis(j, 0, -1).sum(axis=(1, 2))
    for layer in range(num_layers):
      samples[layer].append(e[layer].reshape(-1))
  heads = run.model_config.num_heads
  mean = sums / (count * heads)
  std = np.sqrt(np.maximum(squares / (count * heads) - mean**2, 0.0))
  sample = [
    np.round(
      rng.choice(np.concatenate(s), min(SAMPLE_PER_LAYER, sum(map(len, s))), replace=False),
      SAMPLE_DECIMALS,
    ).tolist()
    for s in samples
  ]
  return {
    'workdir': workdir,
    'tokens': count,
    'heads': heads,
    'length': int(config.data.max_len),
    'entropy_mean': mean.tolist(),
    'entropy_std': std.tolist(),
    'entropy_head_std': (head_std_sums / count).tolist(),
    'jsd_mean': (jsd_sums / (count * heads)).tolist(),
    'entropy_sample': sample,
  }


def summarise(per_seed: list[dict], key: str) -> list[dict]:
  """Per layer (or pair): mean and interval over seeds of one per-model statistic."""
  values = np.asarray([r[key] for r in per_seed])  # [seeds, layers]
  return [stats.mean_ci(values[:, i]).as_dict() for i in range(values.shape[1])]


def paired_differences(per_layout: dict, layouts: list[str], seeds: list[int]) -> dict:
  """Second layout minus first, per layer (pair), paired by seed."""
  if len(layouts) < 2 or len(seeds) < 2:
    return {}
  a = [per_layout[layouts[0]][s] for s in seeds]
  b = [per_layout[layouts[1]][s] for s in seeds]
  out = {}
  for key in ('entropy_mean', 'entropy_std', 'jsd_mean'):
    va, vb = np.asarray([r[key] for r in a]), np.asarray([r[key] for r in b])
    out[key] = []
    for i in range(va.shape[1]):
      diff = stats.paired_diff_ci(list(vb[:, i]), list(va[:, i]))
      out[key].append(
        {
          **diff.as_dict(),
          'verdict': stats.interval_verdict(diff),
          layouts[0]: list(va[:, i]),
          layouts[1]: list(vb[:, i]),
        }
      )
  return out


def middle_pairs(num_layers: int) -> list[int]:
  """Indices of the adjacent-layer pairs in the middle third of the stack (at least one)."""
  pairs = num_layers - 1
  start, stop = pairs // 3, pairs - pairs // 3
  return list(range(start, max(stop, start + 1)))


def claim_statistics(model: dict) -> dict:
  return {
    'top_entropy': model['entropy_mean'][-1],
    'top_entropy_std': model['entropy_std'][-1],
    'middle_jsd': float(
      np.mean([model['jsd_mean'][i] for i in middle_pairs(len(model['entropy_mean']))])
    )
    if len(model['entropy_mean']) > 1
    else math.nan,
  }


def claims(plan: Plan, per_layout: dict, seeds: list[int], analysed: int = -1) -> list[dict]:
  """The plan's comparisons (the paper's statements 5a-5c) with verdicts by the plan module's
  rule: paired by seed over `seeds`, Holm-adjusted together; while only `analysed` of a
  comparison's seeds have both layouts analysed, 'pending (k of n seeds)' with the interim
  figures."""
  rows = []
  for c in plan.comparisons:
    a, b = c.a.variant, c.b.variant
    row = {'key': c.key, 'statement': c.label, 'expected_sign': c.expected, 'seeds': seeds}
    if len(seeds) >= 2:
      va = [claim_statistics(per_layout[a][s])[c.metric] for s in seeds]
      vb = [claim_statistics(per_layout[b][s])[c.metric] for s in seeds]
      diff = stats.paired_diff_ci(va, vb)
      se = diff.half_width / stats.t_quantile(0.975, len(seeds) - 1)
      row.update(
        {'difference': diff.as_dict(), a: va, b: vb},
        p_value=stats.t_p_value(diff.mean, se, len(seeds) - 1),
      )
    rows.append(row)
  tested = [r for r in rows if 'p_value' in r]
  for row, p in zip(tested, stats.holm([r['p_value'] for r in tested])):
    row['holm_p_value'] = p
  declared = len(plan.comparisons[0].seeds) if plan.comparisons else 0
  for row in rows:
    if 0 <= analysed < declared:
      row['verdict'] = f'pending ({analysed} of {declared} seeds)'
    elif 'holm_p_value' not in row:
      row['verdict'] = 'not testable at this scale'
    else:
      row['verdict'] = stats.p_verdict(
        row['difference']['mean'], row['holm_p_value'], row['expected_sign']
      )
  return rows


def _format_interval(d: dict) -> str:
  """'mean ± half-width' of a stored interval (Summary.as_dict), to 3 digits."""
  return stats.format_ci(stats.Summary(d['mean'], d['ci95_half_width'], d['n'], ()), 3)


def _markdown(
  path: str,
  summary: dict,
  layouts: list[str],
  command: str,
  seeds: list[int],
  diffs: dict,
  claim_rows: list[dict],
  notes: list[str],
  length: int,
) -> None:
  lines = [
    '# Attention entropy and adjacent-layer JSD',
    '',
    f'Regenerate: `{command}`. The held-out batches each run was evaluated on (its '
    '`data.eval_batches`, the same masked text for every model), every real query token '
    'of every head; per trained model, then mean ± 95% Student-t interval over seeds '
    f'{seeds}. Entropy in nats (uniform attention over all {length} keys: ln {length} = '
    f'{math.log(length):.3f}); JSD in nats (0 for identical distributions, at most '
    'ln 2 = 0.693).',
    '',
  ]
  lines += [f'- {note}' for note in notes] + ([''] if notes else [])
  lines += [
    "## The paper's statements (RealFormer - Post-LN, paired by seed, Holm-corrected)",
    '',
    '| | statement | RealFormer - Post-LN | p | Holm p | verdict | per seed '
    '(Post-LN / RealFormer) |',
    '|---|---|---|---|---|---|---|',
  ]
  for row in claim_rows:
    if 'difference' in row:
      per_seed = ', '.join(f'{p:.3f} / {r:.3f}' for p, r in zip(row['post'], row['realformer']))
      lines.append(
        f'| {row["key"]} | {row["statement"]} | {_format_interval(row["difference"])} | '
        f'{row["p_value"]:.3g} | {row["holm_p_value"]:.3g} | {row["verdict"]} | '
        f'{per_seed} |'
      )
    else:
      lines.append(f'| {row["key"]} | {row["statement"]} | n/a | | | {row["verdict"]} | |')
  lines += [
    '',
    '## Entropy per layer: mean (std across heads and tokens)',
    '',
    '| layer | ' + ' | '.join(f'{l} mean | {l} std' for l in layouts) + ' |',
    '|---' * (1 + 2 * len(layouts)) + '|',
  ]
  num_layers = len(summary[layouts[0]]['entropy_mean'])
  for layer in range(num_layers):
    cells = []
    for layout in layouts:
      cells += [
        _format_interval(summary[layout]['entropy_mean'][layer]),
        _format_interval(summary[layout]['entropy_std'][layer]),
      ]
    lines.append(f'| {layer + 1} | ' + ' | '.join(cells) + ' |')
  lines += [
    '',
    '## Jensen-Shannon divergence, same head, layer l vs l + 1',
    '',
    '| layers | ' + ' | '.join(layouts) + ' |',
    '|---' * (1 + len(layouts)) + '|',
  ]
  for pair in range(num_layers - 1):
    lines.append(
      f'| {pair + 1}-{pair + 2} | '
      + ' | '.join(_format_interval(summary[l]['jsd_mean'][pair]) for l in layouts)
      + ' |'
    )
  if diffs:
    first, second = layouts[0], layouts[1]
    lines += [
      '',
      f'## {second} - {first} per layer, paired by seed (per-seed values {first} / {second})',
      '',
      'Descriptive (one interval per layer, not corrected for '
      'their number): lower / higher when the 95% interval excludes 0.',
      '',
      '| statistic | layer(s) | difference | verdict | per seed |',
      '|---|---|---|---|---|',
    ]
    names = {
      'entropy_mean': 'entropy mean',
      'entropy_std': 'entropy std',
      'jsd_mean': 'JSD to the next layer',
    }
    for key, rows in diffs.items():
      for i, d in enumerate(rows):
        where = f'{i + 1}-{i + 2}' if key == 'jsd_mean' else f'{i + 1}'
        per_seed = ', '.join(f'{x:.3f} / {y:.3f}' for x, y in zip(d[first], d[second]))
        cell = _format_interval(d)
        lines.append(f'| {names[key]} | {where} | {cell} | {d["verdict"]} | {per_seed} |')
  lines += ['', '![entropy per layer](entropy.png)', '']
  lines += ['![JSD per layer pair](jsd.png)', ''] if num_layers > 1 else []
  write_lines(path, lines)


def write_plots(
  out: str, per_layout: dict, summary: dict, layouts: list[str], length: int
) -> list[str]:
  plt = study.pyplot()
  if plt is None:
    return []
  num_layers = len(summary[layouts[0]]['entropy_mean'])
  fig, ax = plt.subplots(figsize=(max(7, 1.1 * num_layers), 4.8))
  width = 0.8 / len(layouts)
  for i, layout in enumerate(layouts):
    models = list(per_layout[layout].values())
    positions = np.arange(num_layers) + (i - (len(layouts) - 1) / 2) * width
    # Pool the seeds' samples per layer: the distribution over tokens and heads (runs stored
    # before this plan kept no sample: their means only).
    if all(r.get('entropy_sample') for r in models):
      pooled = [sum((r['entropy_sample'][l] for r in models), []) for l in range(num_layers)]
      parts = ax.violinplot(pooled, positions=positions, widths=width * 0.95, showmedians=True)
      for body in parts['bodies']:
        body.set_facecolor(LAYOUT_COLORS.get(layout, 'gray'))
        body.set_alpha(0.45)
    for r in models:  # each seed's mean entropy per layer
      ax.scatter(
        positions,
        r['entropy_mean'],
        color=LAYOUT_COLORS.get(layout, 'gray'),
        s=10,
        marker='x',
        zorder=3,
      )
    ax.plot(
      [],
      [],
      color=LAYOUT_COLORS.get(layout, 'gray'),
      label=f"{layout}: tokens x heads, {len(models)} seeds pooled (violin); x: each seed's mean",
      linewidth=6,
      alpha=0.5,
    )
  ax.axhline(
    math.log(length),
    color='gray',
    linestyle='--',
    label=f'uniform attention over {length} keys: ln {length}',
  )
  ax.set_ylim(0, math.log(length) * 1.08)
  ax.set_xticks(np.arange(num_layers), [str(l + 1) for l in range(num_layers)])
  ax.set_xlabel('layer')
  ax.set_ylabel('attention entropy (nats)')
  ax.set_title('per-token, per-head attention entropy on held-out text')
  ax.legend(fontsize=8, loc='lower left')
  paths = [study.save_figure(fig, os.path.join(out, 'entropy.png'))]
  if num_layers < 2:  # one layer: no adjacent pair to compare
    return paths

  fig, ax = plt.subplots(figsize=(max(7, 0.8 * num_layers), 4.8))
  pairs = np.arange(1, num_layers)
  for layout in layouts:
    rows = summary[layout]['jsd_mean']
    mean = np.asarray([r['mean'] for r in rows])
    half = np.asarray(
      [0 if math.isnan(r['ci95_half_width']) else r['ci95_half_width'] for r in rows]
    )
    color = LAYOUT_COLORS.get(layout, 'gray')
    ax.plot(pairs, mean, marker='o', color=color, label=f'{layout}: mean over seeds')
    # JSD >= 0: the band is clipped to the quantity's range.
    ax.fill_between(
      pairs,
      np.maximum(mean - half, 0.0),
      mean + half,
      color=color,
      alpha=0.2,
      label=f'{layout}: 95% interval over seeds (clipped at 0)',
    )
    for r in per_layout[layout].values():
      ax.scatter(pairs, r['jsd_mean'], color=color, s=10, marker='x')
  middle = middle_pairs(num_layers)
  ax.axvspan(
    pairs[middle[0]] - 0.4,
    pairs[middle[-1]] + 0.4,
    color='gray',
    alpha=0.08,
    label='middle third (statement 5c)',
  )
  ax.scatter([], [], color='gray', s=10, marker='x', label='each seed')
  ax.set_ylim(bottom=0)
  ax.set_xticks(pairs, [f'{p}-{p + 1}' for p in pairs])
  ax.set_xlabel('adjacent layers')
  ax.set_ylabel('mean JSD, same head and token (nats)')
  ax.set_title('Jensen-Shannon divergence between adjacent layers', fontsize=10)
  ax.legend(fontsize=7)
  paths.append(study.save_figure(fig, os.path.join(out, 'jsd.png')))
  return paths


def _arm_of(plan: Plan, run) -> Arm:
  """The arm a run belongs to (its tag names which pretraining runs it analyses)."""
  layout, seed = run.params['variant'], run.params['seed']
  for arm in plan.all_arms():
    if arm.variant == layout and plan.run_name(layout, 0.0, 0, seed, arm.tag) == run.name:
      return arm
  raise ValueError(f'{plan.name}: no arm for the run {run.name}')


def train(plan: Plan, run, workdir: str, data_dir: str, report) -> dict:
  """Analyses the pretraining run of this run's tag, layout and seed (its own eval data:
  `data_dir` and `workdir` are not used); a run that diverged is a result without statistics."""
  layout, seed = run.params['variant'], run.params['seed']
  pretrained, record = pretrained_run(plan, layout, seed, _arm_of(plan, run).tag)
  result = {
    'pretraining': {
      'run': record['run'],
      'rate': record['params']['learning_rate'],
      'learned': bool(record.get('learned')),
      'diverged_at_step': record.get('diverged_at_step'),
    }
  }
  if record.get('diverged_at_step') is None:
    report(0.0, f'analysing {pretrained}')
    result.update(analyse_workdir(pretrained, plan.options['max_batches'], seed))
  return result


def tags(plan: Plan) -> list[str]:
  """The plan's tags in declared order ([''] for one untagged analysis)."""
  return list(dict.fromkeys(arm.tag for arm in plan.all_arms()))


def of_tag(plan: Plan, tag: str) -> Plan:
  """The plan's analysis of one tag: its arms and comparisons, its report in a subfolder named
  by the tag (a plan of one tag is itself)."""
  if tags(plan) == [tag]:
    return plan
  return dataclasses.replace(
    plan,
    arms=(tuple(arm for arm in plan.all_arms() if arm.tag == tag),),
    comparisons=tuple(c for c in plan.comparisons if c.a.tag == tag),
    rules=tuple(rule for rule in plan.rules if getattr(rule, 'tag', None) == tag),
    out=os.path.join(plan.out, tag.rstrip('-')),
  )


def analyse(plan: Plan, results: dict) -> dict:
  """Per layout: each statistic per layer over the seeds whose two layouts were analysed; the
  paired differences and the comparisons over the seeds whose two pretrainings learned. A plan
  of several tags: {'tags': {tag: that analysis}}."""
  if len(tags(plan)) > 1:
    return {'tags': {tag: analyse(of_tag(plan, tag), results) for tag in tags(plan)}}
  arms = plan.all_arms()
  tag = arms[0].tag
  layouts, seeds = [a.variant for a in arms], list(arms[0].seeds)
  per_layout, learned, notes, rates = {l: {} for l in layouts}, {}, [], set()
  for layout in layouts:
    for seed in seeds:
      name = plan.run_name(layout, 0.0, 0, seed, tag)
      if name not in results:
        notes.append(f'{name}: not analysed yet, left out')
        continue
      pretraining = results[name]['pretraining']
      rates.add(pretraining['rate'])
      if pretraining['diverged_at_step'] is not None:
        notes.append(
          f'{pretraining["run"]}: diverged at step {pretraining["diverged_at_step"]}, skipped'
        )
        continue
      learned[(layout, seed)] = pretraining['learned']
      per_layout[layout][seed] = results[name]
  both = [s for s in seeds if all(s in per_layout[l] for l in layouts)]
  # Seeds whose two runs are done, diverged pretrainings included (they end as notes, not pending).
  analysed = [s for s in seeds if all(plan.run_name(l, 0.0, 0, s, tag) in results for l in layouts)]
  paired = [s for s in both if all(learned[(l, s)] for l in layouts)]
  untrained = [s for s in both if s not in paired]
  if untrained:
    notes.append(
      f'seeds {untrained}: a run did not learn masked-LM; left out of the paired statements'
    )
  summary = (
    {
      l: {
        key: summarise([per_layout[l][s] for s in both], key)
        for key in ('entropy_mean', 'entropy_std', 'entropy_head_std', 'jsd_mean')
      }
      for l in layouts
    }
    if both
    else {}
  )
  return {
    'rate': rates.pop() if len(rates) == 1 else sorted(rates),
    'seeds': both,
    'paired_seeds': paired,
    'notes': notes,
    'claims': claims(plan, per_layout, paired, len(analysed)),
    'summary': summary,
    'paired_differences': paired_differences(per_layout, layouts, paired),
    'per_model': {
      l: {str(s): {k: r[k] for k in MODEL_KEYS} for s, r in per_layout[l].items() if s in both}
      for l in layouts
    },
  }


def write(plan: Plan, results: dict, analysis: dict, command: str) -> None:
  """results.json (the analysis), results.md and the plots (once a seed has both layouts); a
  plan of several tags: each tag's in its subfolder (of_tag), and an index of their statements."""
  if 'tags' in analysis:
    for tag, part in analysis['tags'].items():
      write(of_tag(plan, tag), results, part, command)
    write_results(
      plan.out,
      {'pretraining': plan.options['pretraining'].name, 'summary': analysis},
      lambda path: write_index(path, plan, analysis, command),
      lambda: [],
    )
    return
  tag = plan.all_arms()[0].tag
  layouts = [a.variant for a in plan.all_arms()]
  both = analysis['seeds']
  os.makedirs(plan.out, exist_ok=True)
  per_layout = {l: {s: results[plan.run_name(l, 0.0, 0, s, tag)] for s in both} for l in layouts}
  write_results(
    plan.out,
    {'pretraining': plan.options['pretraining'].name, 'summary': analysis},
    lambda path: both and write_markdown(path, plan, analysis, command),
    lambda: (
      write_plots(plan.out, per_layout, analysis['summary'], layouts, _length(analysis))
      if both
      else []
    ),
  )


def write_index(path: str, plan: Plan, analysis: dict, command: str) -> None:
  """The statements of every tag in one table, each tag's report linked."""
  lines = [
    f'# {plan.title}, by tag',
    '',
    f'Regenerate: `{command}`. Each tag is its own analysis (its folder: results.md, plots), '
    "its three statements one Holm family. RealFormer - Post-LN, paired by seed; a tag's runs "
    'are analysed once all its pretraining runs have finished.',
    '',
    '| tag | key | statement | RealFormer - Post-LN | Holm p | verdict | seeds |',
    '|---|---|---|---|---|---|---|',
  ]
  for tag, part in analysis['tags'].items():
    folder = tag.rstrip('-')
    where = f'[{folder}]({folder}/results.md)' if part['seeds'] else folder  # its report, once
    for row in part['claims']:
      if 'difference' in row:
        cells = f'{_format_interval(row["difference"])} | {row["holm_p_value"]:.3g}'
      else:
        cells = 'n/a |'
      lines.append(
        f'| {where} | {row["key"]} | {row["statement"]} | {cells} | '
        f'{row["verdict"]} | {len(row["seeds"])} |'
      )
  write_lines(path, lines + [''])


def _length(analysis: dict) -> int:
  """The models' sequence length (every model's is the same)."""
  return int(next(iter(next(iter(analysis['per_model'].values())).values()))['length'])


def write_markdown(path: str, plan: Plan, analysis: dict, command: str) -> None:
  _markdown(
    path,
    analysis['summary'],
    [a.variant for a in plan.all_arms()],
    command,
    analysis['seeds'],
    analysis['paired_differences'],
    analysis['claims'],
    analysis['notes'],
    _length(analysis),
  )

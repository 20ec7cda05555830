"""A declared plan's report from its analysis (studies/analysis.py): results.md, results.json and
the plots, the same sections for every plan.

    write(plan, results, analysis, command)   # into plan.out
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from realformer_jax.studies import analysis as analysis_lib
from realformer_jax.studies import report as report_lib
from realformer_jax.studies import study
from realformer_jax.studies.plan import Plan
from realformer_jax.studies.report import LAYOUT_COLORS, LAYOUT_NAMES, difference_cell, seed_cell

FAMILY_COLORS = ('tab:purple', 'tab:orange', 'tab:brown', 'tab:olive')


def analyse(plan: Plan, results: Mapping[str, dict]) -> dict:
  """The plan's rules, arms and comparisons with verdicts (studies/analysis.py)."""
  return analysis_lib.analyse(plan, results)


def write(plan: Plan, results: Mapping[str, dict], analysis: dict, command: str) -> None:
  """results.json (the plan, the analysis, a summary of every run the plan lists),
  results.md and the plots, in plan.out."""
  results = analysis_lib.plan_results(plan, results)
  os.makedirs(plan.out, exist_ok=True)
  record = {
    'plan': plan_record(plan),
    'store': plan.store or plan.out,
    'analysis': analysis,
    'runs': {name: _summary(run) for name, run in sorted(results.items())},
  }
  report_lib.write_results(
    plan.out,
    record,
    lambda path: report_lib.write_lines(path, markdown(plan, results, analysis, command)),
    lambda: plots(plan, results, analysis),
  )


def plan_record(plan: Plan) -> dict:
  """The plan as JSON: its recipe and what it declares (rules, arms, comparisons)."""
  declared = lambda x: _variant_as(
    plan.variant_key, {k: v for k, v in dataclasses.asdict(x).items() if v not in ('', {})}
  )
  return {
    'name': plan.name,
    'title': plan.title,
    'scale': dataclasses.asdict(plan.scale),
    'rules': [{'name': r.name, 'kind': type(r).__name__} for r in plan.rules],
    'arms': [declared(a) for a in plan.all_arms()],
    'comparisons': [declared(c) for c in plan.comparisons],
    'parameters': parameters(plan.scale),
    'alpha': plan.alpha,
    'blowup_margin': plan.blowup_margin,
    'effects': dict(plan.effects),
  }


def _variant_as(key: str, value):
  """`value` with every 'variant' key (Arm, Side) named `key`: the masked-LM plans' records
  say 'layout', as they did before plans had other variants."""
  if isinstance(value, dict):
    return {(key if k == 'variant' else k): _variant_as(key, v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(_variant_as(key, v) for v in value)
  return value


# What results.json keeps of each run (its curves and per-sequence sums are in its own file,
# <store>/runs/<name>.json).
RUN_SUMMARY = ('params', 'final', 'learned', 'diverged_at_step', 'seconds', 'workdir')


def _summary(run: Mapping) -> dict:
  out = {k: run[k] for k in RUN_SUMMARY if k in run}
  origin = run.get('origin') or {}
  out['checkpoint'] = origin.get('checkpoint')
  out['machine'] = (origin.get('machine') or {}).get('cpu')
  return out


@functools.cache
def parameters(scale: study.Scale, model: tuple[tuple[str, Any], ...] = ()) -> int:
  """The model's parameter count at `scale` with an arm's `model` fields as (name, value) pairs
  (hashable: cached); every layout has the same."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from realformer_jax import MaskedLM, train  # pylint: disable=import-outside-toplevel
  from realformer_jax.model.params import count_params  # pylint: disable=import-outside-toplevel

  model = train.validate_config(study.mlm_config(scale, seed=0, model=dict(model))).model
  ids = jnp.zeros((1, 8), jnp.int32)
  abstract = jax.eval_shape(lambda: MaskedLM(model).init(jax.random.key(0), ids))
  return count_params(abstract['params'])


# ------------------------------------------------------------------------------------------
# Markdown.


def _percent(values: Sequence[float]) -> str:
  return seed_cell(values, scale=100) if values else 'n/a'


def _count(flags: Sequence[bool]) -> str:
  return f'{sum(flags)}/{len(flags)}' if flags else 'n/a'


def seeds_label(seeds: Sequence[int]) -> str:
  """'0, 2-7': a seed list as ranges."""
  parts: list[list[int]] = []
  for seed in sorted(seeds):
    if parts and seed == parts[-1][1] + 1:
      parts[-1][1] = seed
    else:
      parts.append([seed, seed])
  return ', '.join(f'{a}' if a == b else f'{a}-{b}' for a, b in parts) or 'none'


def _rate_label(rate: float, rule: str = '') -> str:
  return f'{rate:g}' + (f' ({rule})' if rule else '')


def markdown(plan: Plan, results: Mapping[str, dict], analysis: dict, command: str) -> list[str]:
  lines = [f'# {plan.title}', ''] + _setup(plan, results, analysis, command)
  lines += _rules(plan, analysis)
  lines += _arms(analysis)
  lines += ['', recipe_line(analysis['recipe_check'])]
  lines += _comparisons(plan, analysis)
  if analysis.get('conclusions'):
    lines += ['', '## Conclusions', '']
    lines += [f'- **{key}**: {value}' for key, value in analysis['conclusions'].items()]
  lines += ['']
  if 'rates' in plan.plots and _by_steps(analysis):
    lines += ['![final accuracy per rate](rates.png)', '']
  if 'curves' in plan.plots and _curve_panels(plan, results, analysis):
    lines += ['![learning curves per arm](curves.png)', '']
  if 'comparisons' in plan.plots and any(r['comparison'] for r in analysis['comparisons']):
    lines += ['![comparisons with intervals](comparisons.png)', '']
  return lines


def _setup(plan: Plan, results, analysis: dict, command: str) -> list[str]:
  s = plan.scale
  predictions = next((r['scored']['metrics'] for r in results.values() if r.get('scored')), {})
  scored = (
    'the whole held-out split'
    if s.eval_batches == -1
    else f'the first {s.eval_batches} held-out batches of {s.batch}'
  )
  tokenizer = f', the committed tokenizer {s.tokenizer}' if s.tokenizer else ''
  lines = [
    f'Regenerate: `{command} --runs=none` (the report from the finished runs; without '
    '`--runs=none` it trains what is missing, resumably). The plan, declared before its runs: '
    f'`realformer_jax/studies/plans/{plan.name}.py`.',
    '',
    f'Recipe: {s.layers} layers x {s.hidden} hidden, {s.heads} heads, FFN {s.mlp}, '
    f'{s.position_embedding} positions, sequence {s.seq_len}, batch {s.batch}, AdamW with '
    f"{100 * s.warmup_frac:.0f}% warmup and linear decay to 0 at each run's budget, dropout "
    f'{s.dropout}, a {s.vocab:,}-piece tokenizer{tokenizer}; {parameters(s):,} parameters'
    f'{_other_models(plan)}. '
    f'Scored on {scored} ({predictions.get("predictions", math.nan):,.0f} predictions, '
    f'{predictions.get("mask_predictions", math.nan):,.0f} of them at [MASK]).',
    '',
    'Two metrics, named as such everywhere: **[MASK] accuracy** counts the [MASK] slots only '
    '(80% of the selected positions); **all-position accuracy** counts every selected '
    "position (the [MASK] slots, the 10% kept and the 10% replaced at random): BERT's and the "
    "RealFormer paper's masked-LM accuracy. The paper's figures compare with the latter only.",
  ]
  floors = analysis['floors']
  if floors:
    lines += [
      '',
      f'Floors (context-free predictors from the train split, on this eval set): most frequent '
      f'token {100 * floors["mask_accuracy"]:.2f}% at [MASK] and '
      f'{100 * floors["mlm_accuracy"]:.2f}% at all positions; copy-aware (copy the visible '
      f'token, else the most frequent) {100 * floors["copy_accuracy"]:.2f}% at all positions; '
      f'copy-aware unigram loss {floors["copy_unigram_loss"]:.3f} nats. A run learned when its '
      "eval loss is below that loss and its [MASK] accuracy above the most frequent token's.",
    ]
  return lines


def _other_models(plan: Plan) -> str:
  """' (L6: num_layers 6, 434,448 parameters; ...)' for the arms that set model fields (a
  depth plan's), which the recipe line's scale alone would misstate; '' when none does."""
  models = {}
  for arm in plan.all_arms():
    if arm.model:
      models.setdefault(tuple(sorted(arm.model.items())), arm.tag.rstrip('-') or arm.variant)
  described = [
    f'{name}: {", ".join(f"{k} {v}" for k, v in fields)}, '
    f'{parameters(plan.scale, fields):,} parameters'
    for fields, name in models.items()
  ]
  return f' ({"; ".join(described)})' if described else ''


def _rules(plan: Plan, analysis: dict) -> list[str]:
  lines = []
  for name, info in analysis['rules'].items():
    kind = info.get('kind')
    if kind == 'best_rate':
      lines += _best_rate(name, info)
    elif kind == 'gain':
      lines += ['', gain_line(name, info)]
    else:
      value = info['value']
      lines += ['', f'Rule `{name}`: ' + ('not decided yet' if value is None else f'{value}') + '.']
  return lines


def _best_rate(name: str, info: dict) -> list[str]:
  metric = 'all-position accuracy' if info['metric'] == 'accuracy' else '[MASK] accuracy'
  lines = [
    '',
    f'## Rule `{name}`: the best rate of {LAYOUT_NAMES[info["layout"]]} at {info["steps"]:,} '
    f'steps, seeds {seeds_label(info["seeds"])} ({metric})',
    '',
    '| peak rate | final accuracy (%): mean ± 95% (per seed) | learned |',
    '|---|---|---|',
  ]
  for rate, values in info['per_rate'].items():
    finished = [v for v in values if v is not None]
    cell = (
      _percent(finished)
      if len(finished) == len(values)
      else f'{len(finished)} of {len(values)} finished'
    )
    lines.append(f'| {rate} | {cell} | {_count(info["learned"][rate])} |')
  value = info['value']
  if value is None:
    lines += ['', f'`{name}` is not decided yet: runs of its grid are unfinished.']
    return lines
  edge = '' if info['bracketed'] else ' **not bracketed**: the best rate is at an edge of the grid'
  extended = ' (the grid was extended by one rung, as declared)' if info['extended'] else ''
  trainable = info.get('largest_trainable_rate')
  lines += [
    '',
    f'`{name}` = **{value:g}**{extended}{";" if edge else "."}{edge}{"." if edge else ""}'
    + (f' Largest rate where every seed learned: {trainable:g}.' if trainable else ''),
  ]
  return lines


def gain_line(name: str, info: dict) -> str:
  """A Gain rule's state: decided, or the gain of the runs finished so far."""
  a, b = info['steps']
  rule = f'(rule `{name}`: a gain >= {100 * info["threshold"]:.1f} point from {a:,} to {b:,} steps)'
  if info.get('gain') is None:
    return f'Flattening: not known yet {rule}; no run of those budgets finished.'
  if info['value'] is None:
    return (
      f'Flattening: {100 * info["gain"]:+.2f} points over the {info["finished_runs"]} of '
      f'{info["planned_runs"]} runs finished {rule}; the rule waits for the missing runs.'
    )
  line = (
    f'Flattening: doubling the budget to {b:,} steps gained {100 * info["gain"]:+.2f} points '
    f'{rule} -> ' + ('the longer budget is required.' if info['value'] else 'no longer budget.')
  )
  if info.get('gain_after') is not None:
    runs = 'all its runs' if info['after_complete'] else 'the runs finished so far'
    line += (
      f' Doubling again to {info["after"][1]:,} steps gained {100 * info["gain_after"]:+.2f} '
      f'points ({runs}; descriptive).'
    )
  return line


def _arm_name(row: dict) -> str:
  name = LAYOUT_NAMES[row['layout']]
  return f'{name} ({row["tag"].rstrip("-")})' if row['tag'] else name


def _arms(analysis: dict) -> list[str]:
  lines = [
    '',
    '## Runs per arm',
    '',
    'Final evaluation, mean ± 95% Student-t half-width (per-seed values). Failed: diverged '
    '(non-finite, blow-up) or did not learn.',
    '',
    '| arm | steps | peak rate | seeds finished | [MASK] accuracy (%) | all-position accuracy '
    '(%) | eval loss | learned | failed (non-finite, blow-up) | kept / random accuracy (%) |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for row in analysis['arms']:
    if not row['seeds']:
      continue
    kept = [v for v in row['kept_accuracy'] if math.isfinite(v)]
    rand = [v for v in row['random_accuracy'] if math.isfinite(v)]
    kept_random = (
      f'{100 * np.mean(kept):.1f} / {100 * np.mean(rand):.1f}' if kept and rand else 'n/a'
    )
    lines.append(
      f'| {_arm_name(row)} | {row["steps"]:,} | {_rate_label(row["rate"], row["rate_rule"])} | '
      f'{seeds_label(row["seeds"])} of {seeds_label(row["planned_seeds"])} | '
      f'{_percent(row["mask_accuracy"])} | {_percent(row["accuracy"])} | '
      f'{seed_cell(row["loss"], 3)} | {_count(row["learned"])} | {_count(row["failed"])} '
      f'({sum(row["non_finite"])}, {sum(row["blew_up"])}) | {kept_random} |'
    )
  return lines


def recipe_line(check: dict) -> str:
  """The recipe check (analysis.recipe_check) in words."""
  runs = sum(v['runs'] for v in check['per'].values())
  line = (
    f'Recipe check: the step-1 training loss per seed and layout spreads by at most '
    f'{check["max_spread"]:.1e} over {runs} runs (tolerance {check["tolerance"]:.0e}: same '
    'weights, first batch and dropout).'
  )
  for key, by_machine in sorted(check['beyond'].items()):
    spread = check['per'][key]['spread']
    where = '; '.join(f'{m}: {", ".join(names)}' for m, names in sorted(by_machine.items()))
    line += f' **{key} spreads by {spread:.1e}, beyond it**, by machine: {where}.'
  within = sorted(set(check['mixed']) - set(check['beyond']))
  if within:
    spreads = ', '.join(f'{key} by {check["per"][key]["spread"]:.1e}' for key in within)
    line += f' Within it but trained on more than one machine: {spreads}.'
  machines = check.get('machines') or {}
  if machines:
    line += (
      ' Runs per machine: ' + '; '.join(f'{m}: {n}' for m, n in sorted(machines.items())) + '.'
    )
  return line


def _comparisons(plan: Plan, analysis: dict) -> list[str]:
  rows = analysis['comparisons']
  paired = [r for r in rows if r['test'] == 'paired']
  failures = [r for r in rows if r['test'] == 'failures']
  lines = []
  if paired:
    lines += [
      '',
      '## Comparisons, paired by seed (percentage points)',
      '',
      'Difference a - b, mean ± 95% interval over seeds and the eval set (bootstrap over '
      'held-out sequences). Primary comparisons are tested alone at '
      f'{plan.alpha:g}; the members of a family are Holm-adjusted together ("Holm p", and '
      "the level Holm's step-down tested each at). Detectable: the smallest difference this "
      'design finds with 80% power, two-sided, at that level / unadjusted.',
      '',
      '| | comparison | metric | a / b | expects | difference | p | family: Holm p | level '
      '| detectable | seeds | verdict |',
      '|---|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    for row in paired:
      c = row['comparison']
      p = 'n/a' if c is None else f'{c["p_value"]:.3g}'
      holm = f'{row["family"]}: {row["holm_p_value"]:.3g}' if row['family'] else 'primary'
      level = f'{row["holm_level"]:.3g}' if row['family'] else f'{plan.alpha:g}'
      detect = (
        f'{100 * row["detectable_at_level"]:.2f} / {100 * row["detectable"]:.2f}'
        if 'detectable_at_level' in row
        else 'n/a'
      )
      sides = _sides_label(row)
      metric = '[MASK]' if row['metric'] == 'mask_accuracy' else 'all positions'
      lines.append(
        f'| {row["key"]} | {row["label"]} | {metric} | {sides} | '
        f'{"> 0" if row["expected_sign"] > 0 else "< 0"} | {difference_cell(c)} | {p} | {holm} | '
        f'{level} | {detect} | {seeds_label(row.get("seeds", []))} | {row["verdict"]} |'
      )
    lines += _same_comparisons(paired) + _first_draw(paired)
  if failures:
    lines += [
      '',
      "## Failure tests (Boschloo's exact test, two-sided)",
      '',
      '| | comparison | a / b | failed a / b | p | family: Holm p | verdict |',
      '|---|---|---|---|---|---|---|',
    ]
    for row in failures:
      f = row.get('failures')
      counts = f'{f["failed_a"]}/{f["n_a"]} / {f["failed_b"]}/{f["n_b"]}' if f else 'n/a'
      p = f'{f["p_value"]:.3g}' if f else 'n/a'
      holm = f'{row["family"]}: {row["holm_p_value"]:.3g}' if row['family'] else 'primary'
      sides = f'{_side_label(row["a"])} / {_side_label(row["b"])}'
      lines.append(
        f'| {row["key"]} | {row["label"]} | {sides} | {counts} | {p} | {holm} | {row["verdict"]} |'
      )
  powered = [r for r in paired if r.get('power')]
  if powered and plan.effects:
    names = list(plan.effects)
    lines += [
      '',
      'Power for the named effects ('
      + ', '.join(f'{n} {100 * plan.effects[n]:+.2f}' for n in names)
      + ' points), at the tested level / unadjusted:',
      '',
      '| | comparison | ' + ' | '.join(names) + ' |',
      '|---|---|' + '---|' * len(names),
    ]
    for row in powered:
      cells = [row['power'][n] for n in names]
      lines.append(
        f'| {row["key"]} | {row["label"]} ({_side_label(row["b"])}) | '
        + ' | '.join(f'{100 * c["at_level"]:.0f}% / {100 * c["unadjusted"]:.0f}%' for c in cells)
        + ' |'
      )
  return lines


def _same_comparisons(paired: list[dict]) -> list[str]:
  """A line for each set of comparisons that the rules made one (the same runs, metric and
  seeds: two rules chose the same rate), so the table's repeated rows are not read as two
  pieces of evidence."""
  groups: dict[tuple, list[str]] = {}
  for row in paired:
    if any(row[side]['rate'] is None for side in ('a', 'b', 'a2', 'b2') if side in row):
      continue
    key = (_sides_label(row), row['metric'], tuple(row.get('seeds', [])))
    groups.setdefault(key, []).append(row['key'])
  same = [keys for keys in groups.values() if len(keys) > 1]
  return [
    line
    for keys in same
    for line in (
      '',
      f'{" and ".join(keys)} compare the same runs on the same metric and seeds (their rates '
      "were chosen equal): one difference, judged at each one's level.",
    )
  ]


def _sides_label(row: dict) -> str:
  """'a / b', or for a trend '(a / b) - (a2 / b2)'."""
  pair = lambda x, y: f'{_side_label(row[x])} / {_side_label(row[y])}'
  return f'({pair("a", "b")}) - ({pair("a2", "b2")})' if 'a2' in row else pair('a', 'b')


def _first_draw(paired: list[dict]) -> list[str]:
  """The held-out set scored under one mask draw beside the many-draw figure the table tests
  (study.score_workdir), with each one's eval-set standard error."""
  rows = [r for r in paired if r.get('first_draw')]
  if not rows:
    return []
  lines = [
    '',
    'Held-out resolution: the same runs scored under the first mask draw alone (the training '
    "evaluations' draw) and under every draw the table uses; eval SE: the held-out set's "
    "standard error (bootstrap over sequences), seed SE the seeds'.",
    '',
    '| | one draw | eval SE | all draws | eval SE | seed SE |',
    '|---|---|---|---|---|---|',
  ]
  for row in rows:
    one, all_draws = row['first_draw'], row['comparison']
    lines.append(
      f'| {row["key"]} | {difference_cell(one)} | {100 * one["eval_se"]:.2f} | '
      f'{difference_cell(all_draws)} | {100 * all_draws["eval_se"]:.2f} | '
      f'{100 * all_draws["seed_se"]:.2f} |'
    )
  return lines


def _side_label(side: dict) -> str:
  rate = 'undecided' if side['rate'] is None else f'{side["rate"]:g}'
  tag = f' {side["tag"].rstrip("-")}' if side['tag'] else ''
  return f'{LAYOUT_NAMES[side["layout"]]}{tag} {rate} x {side["steps"]:,}'


# ------------------------------------------------------------------------------------------
# Plots.


def plots(plan: Plan, results: Mapping[str, dict], analysis: dict) -> list[str]:
  plt = study.pyplot()
  if plt is None:
    return []
  paths = [
    draw(plt, plan, results, analysis)
    for name, draw in (('rates', rate_plot), ('curves', curve_plot))
    if name in plan.plots
  ]
  rows = [r for r in analysis['comparisons'] if r['comparison']]
  if rows and 'comparisons' in plan.plots:
    families = sorted({r['family'] for r in rows if r['family']})
    color = lambda r: 'black' if not r['family'] else FAMILY_COLORS[families.index(r['family']) % 4]
    metric = lambda r: '[MASK]' if r['metric'] == 'mask_accuracy' else 'all positions'
    paths.append(
      study.plot_comparisons(
        os.path.join(plan.out, 'comparisons.png'),
        [r['comparison'] for r in rows],
        [f'{r["key"]}: {r["label"]} ({metric(r)}; {_side_label(r["b"])})' for r in rows],
        [color(r) for r in rows],
        xlabel='difference a - b (percentage points)',
        title='mean and 95% interval (seeds + eval-set bootstrap); x: each seed; black: primary',
      )
    )
  return [p for p in paths if p]


def _by_steps(analysis: dict) -> dict[int, list[dict]]:
  """Arms with a finished run, by budget, for the budgets that hold two rates or more."""
  steps: dict[int, list[dict]] = {}
  for row in analysis['arms']:
    if row['seeds'] and not row['tag']:
      steps.setdefault(row['steps'], []).append(row)
  return {s: rows for s, rows in sorted(steps.items()) if len({r['rate'] for r in rows}) > 1}


def rate_plot(plt, plan: Plan, results, analysis: dict) -> Optional[str]:
  """Per budget with several rates: final [MASK] accuracy per seed (dots) and its mean per
  layout over the rates, and the fraction of runs that learned; the rules' choices marked."""
  groups = _by_steps(analysis)
  if not groups:
    return None
  floors = analysis['floors']
  fig, axes = plt.subplots(2, len(groups), figsize=(5.2 * len(groups), 7.2), squeeze=False)
  chosen = {
    (info['steps'], info['layout']): info['value']
    for info in analysis['rules'].values()
    if info.get('kind') == 'best_rate' and info['value'] is not None
  }
  for column, (steps, rows) in enumerate(groups.items()):
    top, bottom = axes[0][column], axes[1][column]
    for layout in sorted({r['layout'] for r in rows}):
      mine = sorted(
        {r['rate']: r for r in rows if r['layout'] == layout}.values(), key=lambda r: r['rate']
      )
      color = LAYOUT_COLORS[layout]
      for r in mine:
        values = [100 * v for v in r['mask_accuracy'] if math.isfinite(v)]
        top.scatter([r['rate']] * len(values), values, color=color, s=16, alpha=0.6)
      means = [100 * np.nanmean(r['mask_accuracy']) if r['seeds'] else np.nan for r in mine]
      top.plot([r['rate'] for r in mine], means, color=color, label=f'{LAYOUT_NAMES[layout]}: mean')
      bottom.plot(
        [r['rate'] for r in mine],
        [np.mean(r['learned']) for r in mine],
        'o-',
        color=color,
        label=LAYOUT_NAMES[layout],
      )
      if (steps, layout) in chosen:
        top.axvline(chosen[(steps, layout)], color=color, ls='--', lw=0.8)
    study.draw_floors(top, floors, 'mask_accuracy')
    for ax in (top, bottom):
      ax.set_xscale('log')
      rates = sorted({r['rate'] for r in rows})
      ax.set_xticks(rates, [f'{r:g}' for r in rates], fontsize=7, rotation=30)
      ax.minorticks_off()
      ax.set_xlabel('peak learning rate')
    top.set_title(f"{steps:,} steps (dashed: a rule's chosen rate)", fontsize=9)
    top.set_ylabel('final accuracy at [MASK] (%)')
    top.set_ylim(bottom=0)
    top.legend(fontsize=7)
    bottom.set_ylabel('fraction of finished runs that learned')
    bottom.set_ylim(-0.05, 1.05)
  return study.save_figure(fig, os.path.join(plan.out, 'rates.png'), dpi=90)


def _curve_panels(plan: Plan, results: Mapping[str, dict], analysis: dict) -> dict:
  """The learning-curve plot's columns: (budget, rate, tag) -> the rows of the plan's declared
  arms with a finished run (a rule's grid is the rates plot's; an arm whose rate a rule has not
  decided yet has no column)."""
  panels: dict[tuple, list[dict]] = {}
  declared = {(a.variant, plan.rate(a.rate, results), a.steps, a.tag) for a in plan.all_arms()}
  for row in analysis['arms']:
    if row['seeds'] and (row['layout'], row['rate'], row['steps'], row['tag']) in declared:
      panels.setdefault((row['steps'], row['rate'], row['tag']), []).append(row)
  return panels


def curve_plot(plt, plan: Plan, results: Mapping[str, dict], analysis: dict) -> Optional[str]:
  """One column per (budget, rate) of the plan's arms: eval [MASK] accuracy (top) and training
  loss (bottom) during training, a thin line per seed and the mean thick."""
  panels = _curve_panels(plan, results, analysis)
  if not panels:
    return None
  keys = sorted(panels)
  fig, axes = plt.subplots(
    2, len(keys), figsize=(3.8 * len(keys), 7.0), squeeze=False, sharey='row'
  )
  blowup = math.log(plan.scale.vocab) + plan.blowup_margin
  for column, key in enumerate(keys):
    top, bottom = axes[0][column], axes[1][column]
    for row in panels[key]:
      names = [
        plan.run_name(row['layout'], row['rate'], row['steps'], s, row['tag']) for s in row['seeds']
      ]
      color = LAYOUT_COLORS[row['layout']]
      study.plot_seed_curves(
        top, results, names, color, lambda n, row=row: f'{_arm_name(row)}: mean of {n}', alpha=0.25
      )
      for i, name in enumerate(names):
        curve = study.resumed_curve(results[name].get('train_loss') or [])
        if curve:
          steps, losses = zip(*curve)
          bottom.plot(
            steps, losses, color=color, lw=0.7, alpha=0.6, label=_arm_name(row) if i == 0 else None
          )
    study.draw_floors(top, analysis['floors'], 'mask_accuracy')
    bottom.axhline(blowup, color='black', ls='--', lw=0.7, label='blow-up line')
    steps, rate, tag = key
    top.set_title(
      f'{steps:,} steps, rate {rate:g}{" " + tag.rstrip("-") if tag else ""}', fontsize=9
    )
    top.legend(fontsize=6)
    bottom.legend(fontsize=6)
    bottom.set_xlabel('training step')
  axes[0][0].set_ylim(bottom=0)
  axes[0][0].set_ylabel('eval accuracy at [MASK] (%)')
  axes[1][0].set_ylabel('training loss (nats)')
  return study.save_figure(fig, os.path.join(plan.out, 'curves.png'), dpi=80)

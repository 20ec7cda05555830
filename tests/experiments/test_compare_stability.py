"""experiments/compare_stability (P2 at 2,400 steps): the declared plan (which runs, in which
order, which are reused from compare_budgets' store, when the extension rung joins), the rules
per run (non-finite, finite blow-up, plateau), Boschloo's exact test against a closed form and
SciPy, the verdicts from fabricated results (no training), and the command at toy size."""

import json
import math
import os

import jit_cache
import pytest
from data_fixtures import bible_config

from experiments import compare_budgets, compare_stability
from studies import runs

CPU = compare_stability.PLANS['cpu']
STORE = 'docs/results/compare_layouts/budgets'
FLOORS = {'copy_unigram_loss': 5.29, 'mask_accuracy': 0.0687}


def _fake(*, learned=True, diverged_at=None, losses=None, final_loss=None, seed=0):
  """A finished run's result: learned, stuck on the unigram plateau, or non-finite."""
  if losses is None:
    losses = [7.6, 5.0, 3.4] if learned else [7.6, 5.8, 5.8]
  run = {
    'diverged_at_step': diverged_at,
    'train_loss': [[1 + 1200 * i, v] for i, v in enumerate(losses)],
    'floors': FLOORS,
    'params': {'seed': seed},
  }
  if diverged_at is None:
    loss = final_loss if final_loss is not None else losses[-1]
    run['final'] = {'loss': loss, 'mask_accuracy': 0.30 if learned else 0.0687}
  return run


def _names(results):
  return [run.name for run in compare_stability.plan_runs(results, CPU)]


def test_the_plan_runs_the_ladder_first_and_reuses_the_committed_runs():
  names = _names({})
  assert names[:4] == [
    'b2400-lr0.008-realformer-s0',
    'b2400-lr0.008-post-s0',
    'b2400-lr0.008-realformer-s1',
    'b2400-lr0.008-post-s1',
  ]
  rates = [name.split('-')[1] for name in names]
  assert rates == sorted(rates, key=['lr0.008', 'lr0.016', 'lr0.004', 'lr0.002'].index)
  assert len(names) == 4 * 2 * 4  # rates x layouts x seeds
  # compare_budgets' recipe and names: its committed 2,400-step runs at 2e-3 and Post-LN's at
  # 4e-3 are this plan's, so 23 runs are new (RealFormer 2e-3 seed 1 also fills the budgets
  # study's gap).
  committed = {f[: -len('.json')] for f in os.listdir(os.path.join(STORE, 'runs'))}
  reused = {
    n for n in names if '-lr0.002-' in n or n in ('b2400-lr0.004-post-s0', 'b2400-lr0.004-post-s1')
  }
  reused -= {'b2400-lr0.002-realformer-s1'}  # the budgets study's gap: a new run of this plan
  assert len(reused) == 9 and reused <= committed and len(set(names) - reused) == 23
  assert compare_budgets.PLANS['cpu'].scale == CPU.scale


def test_the_extension_rung_joins_only_if_post_ln_learned_everywhere():
  results = {name: _fake() for name in _names({})}
  assert compare_stability.ladder(results, CPU) == (0.008, 0.016, 0.004, 0.032)
  assert sum('lr0.032' in name for name in _names(results)) == 8
  results['b2400-lr0.016-post-s2'] = _fake(learned=False)
  assert compare_stability.ladder(results, CPU) == CPU.rates
  del results['b2400-lr0.016-post-s2']  # undecided until every Post-LN ladder run finished
  assert not compare_stability.extension_decided(results, CPU)
  assert compare_stability.ladder(results, CPU) == CPU.rates


def test_the_rules_per_run():
  outcome = lambda run: compare_stability.outcome(run, CPU)
  assert CPU.blowup_loss == pytest.approx(math.log(2000) + 1.0)
  learned = outcome(_fake())
  assert learned['learned'] and not learned['failed'] and not learned['diverged']
  plateau = outcome(_fake(learned=False))  # the unigram plateau: fails without diverging
  assert plateau['failed'] and not plateau['diverged']
  nan = outcome(_fake(diverged_at=700, losses=[7.6, 6.0]))
  assert nan['diverged'] and nan['failed'] and nan['non_finite_at_step'] == 700
  # A finite explosion: it ends above ln(vocab) + 1 nat (train or eval), with finite losses.
  blown = outcome(_fake(losses=[7.6, 5.0, 11.0]))
  assert blown['diverged'] and blown['blew_up'] and blown['failed'] and not blown['learned']
  assert outcome(_fake(losses=[7.6, 5.0, 5.8], final_loss=9.0))['blew_up']
  # A spike it recovered from is reported, not a divergence.
  spike = outcome(_fake(losses=[7.6, 12.0, 3.4]))
  assert spike['spiked'] and not spike['diverged'] and spike['learned']
  assert compare_stability.outcome(None, CPU) is None


def test_boschloo_exact_against_a_closed_form():
  # 4 of 4 against 0 of 4: only the observed table is as extreme, P = pi^4 (1 - pi)^4, largest
  # at pi = 1/2: 1/256 one-sided, 1/128 two-sided, below 0.05 / 4 (the extended family).
  assert compare_stability.boschloo_exact(0, 4, 4, 4) == pytest.approx(1 / 128, rel=1e-9)
  assert compare_stability.boschloo_exact(0, 4, 4, 4) < 0.05 / 4
  assert compare_stability.boschloo_exact(2, 4, 2, 4) == 1.0
  assert compare_stability.boschloo_exact(0, 4, 0, 4) == 1.0
  with pytest.raises(ValueError, match='5 of 4'):
    compare_stability.boschloo_exact(5, 4, 0, 4)


@pytest.mark.slow  # SciPy's optimiser takes seconds a table
def test_boschloo_exact_matches_scipy():
  scipy_stats = pytest.importorskip('scipy.stats')
  for x1, n1, x2, n2 in ((0, 4, 3, 4), (1, 4, 4, 4), (0, 3, 3, 5)):
    expected = scipy_stats.boschloo_exact([[x1, x2], [n1 - x1, n2 - x2]]).pvalue
    assert compare_stability.boschloo_exact(x1, n1, x2, n2) == pytest.approx(expected, abs=1e-6)


def _complete(post_fails_at, both_fail_at):
  results = {}
  for name in _names({}):
    rate = float(name.split('-')[1][2:])
    fails = rate in both_fail_at or (rate in post_fails_at and '-post-' in name)
    results[name] = _fake(learned=not fails)
  return results


def test_verdicts_from_fabricated_results():
  results = _complete(post_fails_at={0.008}, both_fail_at={0.016})
  analysis = compare_stability.analyse(results, CPU)
  assert analysis['extension_decided'] and analysis['rates'] == list(CPU.rates)
  rows = {row['rate']: row for row in analysis['rows']}
  assert rows[0.008]['failure']['p_value'] == pytest.approx(1 / 128)
  assert rows[0.008]['holm_p_value'] == pytest.approx(3 / 128)  # the smallest of three
  assert rows[0.008]['failure_verdict'] == 'holds'
  assert rows[0.016]['failure_verdict'] == 'no difference: every run failed'
  assert rows[0.004]['failure_verdict'] == 'no difference: every run learned'
  assert analysis['p2_verdict'] == 'holds'
  # RealFormer failing where Post-LN trains: the mirror verdict.
  mirror = _complete(post_fails_at=set(), both_fail_at=set())
  for seed in CPU.seeds:
    mirror[f'b2400-lr0.016-realformer-s{seed}'] = _fake(learned=False)
  mirror.update({n: _fake() for n in _names(mirror) if n not in mirror})  # the extension rung
  assert compare_stability.analyse(mirror, CPU)['p2_verdict'] == 'does not hold'
  # Post-LN learned everywhere: the extension joins the plan; until it ran, P2 is pending.
  analysis = compare_stability.analyse(_complete(set(), set()), CPU)
  assert analysis['rates'][-1] == CPU.extension
  assert analysis['p2_verdict'] == 'pending (3 of 4 rates complete)'
  assert analysis['rows'][-1]['failure_verdict'] == 'pending (0 of 4 seeds)'


def test_a_cell_with_missing_seeds_is_pending_never_a_verdict():
  results = _complete(post_fails_at={0.008}, both_fail_at=set())
  del results['b2400-lr0.008-realformer-s3']
  analysis = compare_stability.analyse(results, CPU)
  row = next(r for r in analysis['rows'] if r['rate'] == 0.008)
  assert row['failure_verdict'] == 'pending (3 of 4 seeds)'
  assert row['accuracy']['verdict'] == 'pending (3 of 4 seeds)'
  assert analysis['p2_verdict'].startswith('pending (2 of 3 rates complete')


def test_the_reused_runs_share_the_recipe():
  """Every committed 2,400-step run with the same seed and layout (any rate) starts from the
  same step-1 loss: the same weights, first batch and dropout, so the store's runs pair."""
  names = [run.name for run in compare_stability.plan_runs({}, CPU)]
  store = runs.load_results(STORE, [runs.Run(n, {}) for n in names])
  check = compare_stability.recipe_check(store, CPU)
  assert len(check['per']) >= 6
  # Within one machine the recipe holds to the tolerance; a seed and layout beyond it is one
  # whose runs were trained on different machines (docs/experiments.md, "Seed 1 came from
  # another machine"), and every such mix is named, within the tolerance or not.
  for key in check['per']:
    layout, seed = key.rsplit('-s', 1)
    machines = {}
    for name, run in store.items():
      if name.startswith(f'b{CPU.steps}-') and name.endswith(f'-{layout}-s{seed}'):
        machines.setdefault(compare_budgets.machine_of(run), []).append(run['train_loss'][0][1])
    within = max(max(first) - min(first) for first in machines.values())
    assert within < compare_budgets.RECIPE_TOLERANCE, (key, machines)
    assert (key in check['beyond']) == (check['per'][key]['spread'] > check['tolerance'])
    if key in check['beyond']:
      assert len(machines) > 1 and sorted(check['beyond'][key]) == sorted(machines)
    assert (key in check['mixed']) == (len(machines) > 1)


@pytest.mark.slow  # traces the 12-layer model: ~1 s idle, several on a loaded machine
def test_the_committed_scale_facts_are_the_models():
  committed = json.load(open('docs/results/compare_layouts/stability/results.json'))
  assert committed['analysis']['scale'] == compare_stability.scale_facts(CPU)
  assert committed['analysis']['scale']['parameters'] == 734_352  # 12 x 64, vocab 2,000


@pytest.mark.slow
def test_compare_stability_quick(tmp_path):
  # The ladder's one toy rate (4 runs; the reference rung is left out: minutes on 2 cores).
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  argv = ['--quick', '--out', out, '--workdirs', workdirs, '--data_dir', bible_config().data_dir]
  with jit_cache.in_process():  # the seeds' runs compile the same programs
    report = compare_stability.main(argv + ['--runs', 'b4-lr0.03-*'])
  analysis = report['analysis']
  assert sorted(report['results']) == [
    f'b4-lr0.03-{layout}-s{seed}' for layout in ('post', 'realformer') for seed in (0, 1)
  ]
  row = analysis['rows'][0]
  assert row['rate'] == 0.03 and row['complete'] and row['failure'] is not None
  assert analysis['reference']['paired_seeds'] == []  # not selected: no run, no verdict
  if analysis['extension_decided'] and len(analysis['rates']) == 1:  # 4 steps: nothing learns
    assert not analysis['p2_verdict'].startswith('pending')
  table = open(os.path.join(out, 'results.md')).read()
  assert '## P2 verdict:' in table and '| 0.03 | Post-LN | [0, 1] |' in table
  assert json.load(open(os.path.join(out, 'results.json')))['analysis']['scale']['vocab'] == 500
  for plot in ('curves.png', 'ladder.png'):
    assert os.path.getsize(os.path.join(out, plot)) > 1000
  # Report only: --runs=none trains nothing and rewrites the same verdict.
  again = compare_stability.main(argv + ['--runs', 'none'])
  assert again['analysis']['p2_verdict'] == analysis['p2_verdict']
  assert sorted(again['results']) == sorted(report['results'])

"""The README's experiment commands start and report (at toy size, under --quick):
`experiments.study --plan=layouts` (the toy plan's Post-LN and RealFormer runs at r*: tables,
verdicts, plots; a rerun trains nothing), attention_analysis and finetune_compare on those
workdirs (RealFormer and the from-scratch control), position_probe (two variants); and the one
definition of a run that learned."""

import json
import math
import os

import jit_cache
import pytest
from data_fixtures import bible_config, quick_study_argv

from experiments import attention_analysis, finetune_compare
from realformer_jax import train
from realformer_jax.commands import study as study_command
from realformer_jax.studies import study
from realformer_jax.studies.plans import layouts as layouts_plan
from realformer_jax.studies.plans import position_probe as position_probe_plan


@pytest.fixture(scope='module')
def layouts(tmp_path_factory):
  """The layouts study --quick, Post-LN and RealFormer at the toy plan's only grid rate."""
  root = tmp_path_factory.mktemp('layouts')
  out, workdirs = str(root / 'out'), str(root / 'runs')
  argv = ['--plan=layouts'] + quick_study_argv(
    out, workdirs, '--runs', 'lr0.003-post-*,lr0.003-realformer-*'
  )
  with jit_cache.in_process():  # the seeds' runs compile the same programs
    return argv, out, workdirs, study_command.main(argv)


@pytest.mark.slow
def test_layouts_study_quick(layouts, capsys):
  argv, out, _, report = layouts
  assert sorted(report['results']) == [
    'lr0.003-post-s0',
    'lr0.003-post-s1',
    'lr0.003-realformer-s0',
    'lr0.003-realformer-s1',
  ]
  for run in report['results'].values():
    assert run['diverged_at_step'] is None and run['learned'] in (True, False)
    metrics = run['scored']['metrics']
    assert math.isfinite(metrics['loss']) and 0 <= metrics['mask_accuracy'] <= 1
    assert metrics['mask_accuracy'] == pytest.approx(run['final']['mask_accuracy'], abs=1e-6)
    assert len(run['scored']['sequence_sums']['mask_count']) == run['scored']['sequences']
  analysis = report['analysis']
  assert analysis['rules']['r*']['value'] == 0.003  # one toy rate: Post-LN's best
  rows = {row['key']: row for row in analysis['comparisons']}
  assert rows['P1']['comparison']['n'] == 2 and rows['P1']['family'] == ''
  assert rows['P1']['verdict'] in (
    'holds',
    'does not hold',
    'inconclusive',
    'not testable at this scale',
  )
  assert rows['S1']['verdict'] == 'pending (0 of 2 seeds)'  # no Pre-LN run in this selection
  assert rows['S1']['holm_p_value'] == 1.0  # a member without a result counts p = 1
  table = open(os.path.join(out, 'results.md')).read()
  assert '`r*` = **0.003**' in table and '| P1 | RealFormer - Post-LN at r* |' in table
  assert 'copy-aware' in table and 'all-position accuracy' in table
  saved = json.load(open(os.path.join(out, 'results.json')))
  assert (
    'sequence_sums' not in saved['runs']['lr0.003-post-s0']
    and saved['runs']['lr0.003-post-s0']['final']
  )
  assert layouts_plan.decisions(out)[:2] == (0.003, [0, 1])
  for plot in ('curves.png', 'comparisons.png'):
    assert os.path.getsize(os.path.join(out, plot)) > 1000
  assert not os.path.exists(os.path.join(out, 'rates.png'))  # one rate run: no rate plot
  assert 'rates.png' not in table

  capsys.readouterr()
  study_command.main(argv)  # every selected run is finished: nothing is trained again
  assert 'starting' not in capsys.readouterr().out


@pytest.mark.slow
def test_attention_analysis_on_the_layout_runs(layouts, tmp_path):
  _, out, workdirs, _ = layouts
  report = attention_analysis.main(
    [
      '--runs_dir',
      workdirs,
      '--layouts_results',
      out,
      '--seeds',
      '0,1',
      '--max_batches',
      '1',
      '--out',
      str(tmp_path),
    ]
  )
  layers = layouts_plan.PLANS['toy'].scale.layers
  for layout in ('post', 'realformer'):
    assert len(report['summary'][layout]['entropy_mean']) == layers
    assert len(report['summary'][layout]['jsd_mean']) == layers - 1
  # Toy runs do not learn masked-LM: the paper's statements are not testable on them.
  assert {row['verdict'] for row in report['claims']} <= {
    'not testable at this scale',
    'holds',
    'does not hold',
    'inconclusive',
  }
  assert os.path.getsize(tmp_path / 'entropy.png') > 1000
  assert "The paper's statements" in (tmp_path / 'attention.md').read_text()


@pytest.mark.slow
def test_finetune_compare_quick(layouts, tmp_path, capsys):
  _, out, workdirs, _ = layouts
  argv = [
    '--quick',
    '--layouts_results',
    out,
    '--pretrained',
    workdirs,
    '--seeds',
    '0,1',
    '--runs',
    'realformer-*,scratch-*',
    '--out',
    str(tmp_path / 'out'),
    '--workdirs',
    str(tmp_path / 'runs'),
  ]
  with jit_cache.in_process():  # every start and seed fine-tunes the same programs
    summary = finetune_compare.main(argv)
  assert sorted(summary['starts']) == ['realformer', 'scratch']
  for start in ('realformer', 'scratch'):
    accuracy = summary['starts'][start]['accuracy']
    assert accuracy['n'] == 2 and 0.0 <= accuracy['mean'] <= 1.0
    # 64 verses, batch 8, 2 epochs: the schedule ends at step 16, evaluated every 8 steps.
    assert summary['starts'][start]['last_step'] == [16, 16]
    assert all(0 < b <= 16 for b in summary['starts'][start]['best_step'])
  diff = summary['differences']['realformer - scratch']
  assert diff['verdict'] in ('holds', 'does not hold', 'inconclusive', 'not testable at this scale')
  # The scratch control has the pretrained model's architecture, randomly initialised.
  config = json.load(open(tmp_path / 'runs' / 'scratch-s0' / 'config.json'))
  assert config['model']['num_layers'] == layouts_plan.PLANS['toy'].scale.layers
  assert config['finetune']['init'] == ''
  assert os.path.getsize(tmp_path / 'out' / 'test_accuracy.png') > 1000
  capsys.readouterr()
  finetune_compare.main(argv)
  assert '4/4 runs already done' in capsys.readouterr().out


@pytest.mark.slow
def test_position_probe_quick(tmp_path):
  out, workdirs = str(tmp_path / 'out'), str(tmp_path / 'runs')
  argv = quick_study_argv(out, workdirs, '--runs', 'learned-s0,none-s0')
  summary = study_command.main(['--plan=position_probe', *argv])['analysis']
  assert sorted(summary['variants']) == ['learned', 'none']
  learned = summary['variants']['learned']
  assert len(learned['table_cosine'][0]) == len(position_probe_plan.DISTANCES)
  assert summary['variants']['none']['table_cosine'] == [None]  # no table to measure
  length = position_probe_plan.PLANS['toy'].scale.seq_len
  assert all(0 < v <= 1 for v in learned['neighbour_attention'][0])
  assert abs(learned['neighbour_attention'][0][0] - 2 / length) < 0.05  # ~uniform untrained
  assert (tmp_path / 'out' / 'results.md').exists()


def test_learned_is_the_copy_aware_unigram_loss_and_the_mask_floor():
  floors = {'copy_unigram_loss': 5.27, 'mask_accuracy': 0.073}
  run = lambda loss, mask: {'final': {'loss': loss, 'mask_accuracy': mask}, 'floors': floors}
  assert study.learned(run(4.5, 0.20))
  assert not study.learned(run(5.30, 0.20))  # above the context-free loss
  assert not study.learned(run(5.20, 0.073))  # no better than the most frequent token at [MASK]
  assert not study.learned({'final': None, 'floors': floors, 'diverged_at_step': 12})


@pytest.mark.slow
def test_a_diverged_run_is_a_result_with_its_step(tmp_path, monkeypatch):
  """study.train_run records where training diverged from the error's `step` (not its wording;
  the loop's side: test_train_loop's non-finite test), and the run did not learn."""

  def diverge(config, workdir, on_log):
    raise train.DivergenceError('the message may say anything', 3)

  monkeypatch.setattr(train, 'train_and_evaluate', diverge)
  config = study.mlm_config(layouts_plan.PLANS['toy'].scale, seed=0)
  result = study.train_run(config, str(tmp_path), lambda fraction, message: None)
  assert result['diverged_at_step'] == 3
  assert 'final' not in result and not result['learned']

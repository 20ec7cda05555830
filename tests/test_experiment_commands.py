"""The README's experiment commands start and report (at toy size): experiments/compare_layouts.py
(--quick, the main group only: Post-LN and RealFormer at two seeds, so intervals and paired
differences exist), experiments/attention_analysis.py on those workdirs, and
experiments/finetune_compare.py (--quick: two 4-step pretrainings, then fine-tuning on
bible_sections at two seeds). The two grids are run again to check that finished runs are
skipped, not trained again."""

import json
import math
import os

from data_fixtures import bible_config
from experiments import attention_analysis, compare_layouts, finetune_compare


def test_compare_layouts_quick(tmp_path, capsys):
  out = str(tmp_path / 'out')
  argv = ['--quick', '--out', out, '--workdirs', str(tmp_path / 'runs'),
          '--data_dir', bible_config().data_dir, '--runs', 'main-post-s[01],main-realformer-s[01]']
  report = compare_layouts.main(argv)
  assert sorted(report['results']) == ['main-post-s0', 'main-post-s1', 'main-realformer-s0',
                                       'main-realformer-s1']
  for result in report['results'].values():
    assert result['diverged_at_step'] is None
    assert math.isfinite(result['final_eval_loss']) and 0 <= result['final_eval_accuracy'] <= 1
  table = open(os.path.join(out, 'results.md')).read()
  assert 'realformer' in table and '±' in table
  saved = json.load(open(os.path.join(out, 'results.json')))
  assert len(saved['runs']) == 4 and saved['scale']['steps'] == compare_layouts.SCALES['toy'].steps
  assert os.path.getsize(os.path.join(out, 'curves.png')) > 1000

  capsys.readouterr()
  compare_layouts.main(argv)
  assert '4/4 runs already done' in capsys.readouterr().out

  attention_out = str(tmp_path / 'attention')
  summary = attention_analysis.main(['--runs_dir', str(tmp_path / 'runs'), '--seeds', '0,1',
                                     '--max_batches', '1', '--out', attention_out])
  layers = compare_layouts.SCALES['toy'].layers
  for layout in ('post', 'realformer'):
    entropy = summary[layout]['entropy_mean']
    assert len(entropy) == layers  # per layer, over the two seeds
    jsd = summary[layout]['jsd_mean']
    assert len(jsd) == layers - 1
  assert os.path.getsize(os.path.join(attention_out, 'entropy.png')) > 1000
  table = open(os.path.join(attention_out, 'attention.md')).read()
  assert 'realformer - post, paired by seed' in table
  saved = json.load(open(os.path.join(attention_out, 'attention.json')))
  for key, count in (('entropy_mean', layers), ('entropy_std', layers), ('jsd_mean', layers - 1)):
    rows = saved['paired_differences'][key]
    assert len(rows) == count and all(r['n'] == 2 for r in rows)
    assert all(r['verdict'] in ('higher', 'lower', 'inconclusive') for r in rows)


def test_finetune_compare_quick(tmp_path, capsys):
  out = str(tmp_path / 'out')
  argv = ['--quick', '--out', out, '--workdirs', str(tmp_path / 'runs'),
          '--data_dir', bible_config().data_dir, '--seeds', '0,1']
  summary = finetune_compare.main(argv)
  for layout in finetune_compare.LAYOUTS:
    accuracy = summary['metrics']['accuracy'][layout]
    assert accuracy['n'] == 2 and 0.0 <= accuracy['mean'] <= 1.0
  assert os.path.exists(os.path.join(out, 'results.md'))
  saved = json.load(open(os.path.join(out, 'results.json')))
  assert sorted(saved['pretrain']) == sorted(finetune_compare.LAYOUTS)
  assert saved['metrics']['accuracy']['verdict'] in ('higher', 'lower', 'inconclusive')

  capsys.readouterr()
  finetune_compare.main(argv)
  assert '6/6 runs already done' in capsys.readouterr().out


def test_a_run_stuck_at_the_unigram_plateau_counts_as_not_trained():
  base = {'baseline_accuracy': 0.0684, 'failed_to_train': False}
  assert compare_layouts.did_not_train({**base, 'final_eval_accuracy': 0.0684})
  assert compare_layouts.did_not_train({**base, 'final_eval_accuracy': 0.0700})
  assert not compare_layouts.did_not_train({**base, 'final_eval_accuracy': 0.0800})
  assert compare_layouts.did_not_train({**base, 'failed_to_train': True,
                                        'final_eval_accuracy': 0.2})
  assert not compare_layouts.did_not_train({'diverged_at_step': 12})  # diverged: no final

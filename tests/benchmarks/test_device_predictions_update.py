"""Re-predicting some rows of a committed predictions file (issue 64: the BERT-Large steps with
the layer scan unrolled, on an H200 and an H100): the file keeps what it predicted before as a
change line, another GPU's rows stand beside its own, each judged PASS / MISS ESTIMATED."""

import copy
import os
import subprocess
import sys

import repo_paths

from benchmarks import device_predictions


def _row(model, seconds, unroll=1, part='steps', key='bert_large_512'):
  row = {'part': part, 'key': key, 'model': model, 'estimate_s': seconds, 'memory_gib': 16.0}
  row.update(warnings=[], mfu=0.35, scan_unroll=unroll)
  return row


BASE = {
  'date': '2026-12-07',
  'commit': '4c69e2f0000',
  'target': 'h200:1',
  'constants': {
    'FUSED_KERNEL_EFFICIENCY': 0.78,
    'HOPPER_L2_FRACTION': 0.44,
    'ISSUE_EFFICIENCY': 0.66,
    'hash_int_ops_per_decision': {'compiled': 12.4},
    'mfu_peak_flops': 989.4e12,
  },
  'rows': [_row('post', 0.0922), _row('realformer', 0.1315), _row('hf', 0.0988)],
  'budget_s': 420.0,
}


def test_an_update_replaces_its_target_rows_and_adds_another_gpus_beside_them():
  base = copy.deepcopy(BASE)
  new = [_row('post', 0.0797, 24), _row('realformer', 0.1188, 24)]
  device_predictions.update(base, 'h200:1', new, '2026-12-07', 'abcdef0123')
  device_predictions.update(base, 'h100:1', [_row('post', 0.0831, 24)], '2026-12-07', 'abcdef0')
  assert [r['estimate_s'] for r in base['rows']] == [0.0797, 0.1188, 0.0988]  # hf kept
  assert base['targets']['large_post_s'] == 0.0797
  assert base['other_targets']['h100:1']['targets']['large_post_s'] == 0.0831
  assert base['changes'] == [
    '2026-12-07, commit `abcdef0`, h200:1: bert_large_512 post (scan unrolled x24) 92.2 ms -> '
    '79.7 ms, bert_large_512 realformer (scan unrolled x24) 131.5 ms -> 118.8 ms',
    '2026-12-07, commit `abcdef0`, h100:1: bert_large_512 post (scan unrolled x24) (new) 83.1 ms',
  ]
  base['plan'] = []  # the suite's plan: not this test's
  text = device_predictions.render(base)
  assert '| steps | bert_large_512 | post (scan unrolled x24) | 79.7 ms | 0.350 | 16.0 |' in text
  assert '| steps | bert_large_512 | hf | 98.8 ms | 0.350 | 16.0 |' in text
  assert '- PASS (ESTIMATED) BERT-Large 32 x 512 Post-LN step <= 85.0 ms: 79.7 ms' in text
  assert '- MISS (ESTIMATED) BERT-Large 32 x 512 RealFormer step <= 115.0 ms: 118.8 ms' in text
  other = text.split('Also ESTIMATED for one h100:1')[1]
  assert '- PASS (ESTIMATED) BERT-Large 32 x 512 Post-LN step <= 85.0 ms: 83.1 ms' in other


def test_parts_other_than_steps_and_long_end_with_one_error_line():
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=repo_paths.REPO)
  done = subprocess.run(
    [sys.executable, '-m', 'benchmarks.device_predictions', '--parts=stepz'],
    cwd=repo_paths.REPO, env=env, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert done.returncode == 2
  assert done.stdout.strip() == 'error: --parts=stepz: must name some of steps,long'

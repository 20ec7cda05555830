"""Run by tests/kernels/test_qk_carry.py in a subprocess with 8 forced CPU devices: the sharded
train setup of tests/kernels_sharded_check.py (RealFormer, attention dropout 0.5, a 2 x 2 x 2 mesh)
with model.residual_carry='qk', on the einsum path and on the Triton kernels (interpret mode, per
shard), against the carried sum. The reference recomputes going down (as the qk stack does, so both
draw the same per-layer dropout keys). Prints one JSON line."""

from tests.kernels_sharded_check import grad_difference, print_report, sharded_runs

RECOMPUTED = {'residual_carry': 'scores', 'residual_scores_backward': 'recomputed'}


def main():
  results = sharded_runs(
    {
      'scores': ('xla', RECOMPUTED),
      'qk_xla': ('xla', {'residual_carry': 'qk'}),
      'qk_pallas': ('pallas_triton', {'residual_carry': 'qk'}),
    },
    'qk_pallas',
  )
  reference = results['scores']
  print_report(
    results,
    grad_difference_xla=grad_difference(results['qk_xla'][1], reference[1]),
    grad_difference_pallas=grad_difference(results['qk_pallas'][1], reference[1]),
    loss_scores=reference[0],
    loss_qk_xla=results['qk_xla'][0],
    loss_qk_pallas=results['qk_pallas'][0],
  )


if __name__ == '__main__':
  main()

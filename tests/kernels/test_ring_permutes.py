"""One forward ring per layer and step: with residual_carry='qk' the layers qk_stack re-runs
going down take the ring's output and statistics saved going up (qk_carry.SavedAttention,
ring_attention_replay) instead of passing every key block round the ring again. Counted in the
lowered train step of a tiny model on a sequence axis of 8 forced CPU devices
(tests/ring_permutes_check.py): the qk carry's program holds as many collective-permutes as
Post-LN's (one forward ring, one backward ring), and 3 fewer (the travelling keys, values and
padding bias of a forward ring) than when the re-run runs the forward ring again. The
equalities with one device are test_ring_attention.py's and test_sequence_parallel.py's."""

import pytest

from tests import scale_out_support as support

pytestmark = pytest.mark.sequence_parallel


def _permutes(*args: str) -> int:
  return support.run_check('ring_permutes_check', 8, args=args)['collective_permutes']


@pytest.mark.slow  # three subprocesses, each lowering a tiny train step (~10 s CPU)
def test_the_qk_ring_runs_its_forward_once_per_layer():
  saved, rerun, post = (
    _permutes('realformer_qk', '8'),
    _permutes('realformer_qk', '8', 'rerun'),
    _permutes('post', '8'),
  )
  assert saved == post, (saved, post)
  assert rerun - saved == 3, (rerun, saved)  # keys, values, bias: one forward ring's passes

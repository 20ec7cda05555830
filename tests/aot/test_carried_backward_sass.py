"""RealFormer's carried-sum backward compiled for an H100 (tests/carried_compile_check.py, a
subprocess each): read back, dQ comes from `realformer_attention_dq` and no kernel of the layer
holds a global atomic, in its jaxpr or in its SASS for sm_90a; the atomic path, kept where the
estimate prefers it (kernels/backends/triton/attention.reads_dq_back), still adds dQ by RED."""

import pytest

from tests import scale_out_support as support


@pytest.mark.slow  # a deviceless compile and ptxas per path (~30 s each on 2 loaded cores)
@pytest.mark.parametrize('path', ['read_back', 'atomic'])
def test_the_carried_backward_adds_atomically_only_on_the_atomic_path(path):
  report = support.run_check('carried_compile_check', optimised=True, args=[path])
  read_back = path == 'read_back'
  dq_kernel = 'realformer_attention_dq' if read_back else 'attention_store_dq'
  assert report['kernels'] == sorted(
    ['realformer_attention_fwd', 'realformer_attention_bwd', dq_kernel]
  )
  assert (report['atomic_rmw'] == 0) == read_back
  backward = report['stated']['realformer_attention_bwd']
  assert (backward['atomics'] == '0') == read_back
  assert (report['global_atomics']['realformer_attention_bwd'] == 0) == read_back
  for name in ('realformer_attention_fwd', dq_kernel):
    assert report['global_atomics'][name] == 0, name
  # The backward's loop: a 64 x 64 tile over 128 threads, 32 elements a thread a trip, whatever
  # the exponentials per element (p formed in three layouts: 96 MUFU.EX2 a trip, aot/sass.py)
  (loop,) = report['loops']['realformer_attention_bwd']
  assert backward['tile_elements'] == str(64 * 64)
  assert loop['elements'] == 32 and loop['exps'] >= 32
  # The dQ kernel: one loop over key blocks, no exponential (aot/sass.py charges it nothing).
  if read_back:
    (loop,) = report['loops']['realformer_attention_dq']
    assert loop['exps'] == 0 and loop['instructions'] > 0

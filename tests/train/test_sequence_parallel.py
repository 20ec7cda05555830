"""Sequence (context) parallelism equals one device: for each family (post, pre, RealFormer
carrying the sum, RealFormer residual_carry='qk') the real train setup on sequence axes of 2, 4
and 8 devices, alone and with data or FSDP parallelism, gives the one-device run's MLM outputs
and gradients of a forward with hidden and attention dropout over padded rows, and the same 5
training steps (losses and parameters). float32, matmul precision 'highest', <= 1e-5 of the
largest value (measured ~3e-7). 8 forced CPU devices, in a subprocess
(tests/sequence_parallel_check.py)."""

import pytest

from tests import scale_out_support as support

pytestmark = pytest.mark.sequence_parallel

MESHES = ('1,1,1,2', '1,1,1,4', '1,1,1,8', '2,1,1,4', '1,2,1,4')  # data,fsdp,tensor,sequence
TOLERANCE = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize('family', ['post', 'pre', 'realformer', 'realformer_qk'])
def test_sequence_axis_gives_the_one_device_run(family):
  report = support.run_check('sequence_parallel_check', 8, args=(family, *MESHES))
  assert report['devices'] == 8
  assert report['reference_path'] in ('EinsumPath', 'QKPath'), report
  for mesh in MESHES:
    result = report[mesh]
    assert result['path'] == ('RingQKPath' if family == 'realformer_qk' else 'RingPath'), result
    for key in ('outputs', 'grads', 'losses', 'params'):
      assert result[key] <= TOLERANCE, (mesh, key, result)


@pytest.mark.slow  # interpret-mode kernels in every train step (~2 min CPU)
def test_the_fused_block_ring_gives_the_one_device_run():
  """residual_carry='qk' with attention_impl='pallas_triton': the ring's blocks run through the
  Triton qk block kernels, forward and backward (interpret mode), against one device's Triton qk
  kernels."""
  meshes = ('1,1,1,2', '1,1,1,4')  # 8 devices: 4 positions each, not whole hash words
  report = support.run_check('sequence_parallel_check', 8, args=('realformer_qk_triton', *meshes))
  assert report['reference_path'] == 'QKPath', report
  for mesh in meshes:
    result = report[mesh]
    assert result['path'] == 'RingQKPath', result
    for key in ('outputs', 'grads', 'losses', 'params'):
      assert result[key] <= TOLERANCE, (mesh, key, result)
